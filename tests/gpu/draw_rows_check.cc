// cuda_kernels_check's device draw rows: cuda::DrawRows against DrawRow (common/engine/row_draw.h,
// its host reference, itself checked against the Sampler by tests/unit/row_draw_test.cc), and
// its time against the host Sampler on the same rows; cuda::ApplyScoreEdits against the host's
// ApplyScoreEdits (common/engine/score_edits.h), and the tokens of edited rows picked on the
// device against the Sampler's.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>

#include "common/engine/row_draw.h"
#include "common/engine/sampling.h"
#include "common/engine/score_edits.h"
#include "tests/gpu/check_util.h"

namespace tandem::cuda {
namespace {

// A row's draw parameters, cycling through the warper mixes the Sampler supports; every 7th row
// greedy with logprobs (kRowArgmax).
RowDraw MixFor(int row, double u) {
  static const float kTemperatures[] = {0.3f, 0.8f, 1.0f, 1.7f};
  static const int32_t kTopK[] = {0, 1, 20, 50, 1000};
  static const float kTopP[] = {1.0f, 0.95f, 0.9f, 0.5f, 0.05f, 0.999f};
  static const float kMinP[] = {0.0f, 0.0f, 0.1f};
  RowDraw d;
  d.temperature = kTemperatures[row % 4];
  d.top_k = kTopK[row % 5];
  d.top_p = kTopP[row % 6];
  d.min_p = kMinP[row % 3];
  d.u = u;
  d.draw = kRowDrawn;
  static const int32_t kTopLogprobs[] = {-1, 0, 5, kMaxTopLogprobs};
  d.top_logprobs = kTopLogprobs[row % 4];
  if (row % 7 == 6) {  // greedy with logprobs: the argmax and its logprobs
    d = RowDraw{};
    d.draw = kRowArgmax;
    d.top_logprobs = kTopLogprobs[(row / 7) % 4];
  }
  return d;
}

}  // namespace

// Rows of random logits (a model's spread, sd 3), rows of few distinct values (ties), rows
// with masked entries, one with +inf scores, one with nothing usable (-1) and one not drawn
// (left alone), at three vocabularies (Qwen2's 151,936 the largest); every warper mix, with
// and without logprobs. Errors: rows whose token differs, top-logprob ids that differ, and
// the largest logprob difference (the normaliser is summed in another order).
void CheckDrawRows(cudaStream_t s) {
  const float inf = std::numeric_limits<float>::infinity();
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::uniform_int_distribution<int> small(0, 3);
  for (int32_t vocab : {1000, 49152, 151936}) {
    int rows = vocab > 100000 ? 24 : 96;
    if (Emulated() && vocab > 1000) rows = vocab > 100000 ? 6 : 12;  // see Emulated()
    std::vector<float> logits;
    std::vector<RowDraw> draws;
    for (int r = 0; r < rows; ++r) {
      std::vector<float> row = Random(vocab, 3.0f);
      if (r % 3 == 1)
        for (float& v : row) v = static_cast<float>(small(g_rng));
      if (r % 3 == 2)
        for (int32_t i = 0; i < vocab; i += 3) row[i] = i % 2 ? -inf : std::nanf("");
      if (r == rows - 2) std::fill(row.begin(), row.end(), -inf);
      if (r == rows - 3) row[r] = row[vocab - 1] = inf;  // overflowed: the two share it
      logits.insert(logits.end(), row.begin(), row.end());
      draws.push_back(MixFor(r, uniform(g_rng)));
    }
    draws.back().draw = 0;  // not drawn: its id stays as it was
    if (vocab == 1000) {  // the row with nothing usable, greedy with logprobs: -1 too
      draws[rows - 2] = RowDraw{};
      draws[rows - 2].draw = kRowArgmax;
      draws[rows - 2].top_logprobs = 5;
    }
    std::vector<int32_t> want(rows);
    std::vector<RowLogprobs> want_logprobs(rows);
    for (int r = 0; r < rows; ++r)
      want[r] = draws[r].draw ? DrawRow({logits.data() + size_t(r) * vocab, size_t(vocab)},
                                        draws[r], &want_logprobs[r])
                              : -7;
    DeviceBuffer dl = Upload(logits), dd = Upload(draws);
    DeviceBuffer dids = Upload(std::vector<int32_t>(rows, -7));
    DeviceBuffer dlp = Upload(std::vector<RowLogprobs>(rows));
    Must(DrawRows(dl.as<float>(), rows, vocab, dd.as<RowDraw>(), dids.as<int32_t>(),
                  dlp.as<RowLogprobs>(), s),
         "DrawRows");
    const std::vector<int32_t> got = Download<int32_t>(dids, rows);
    const std::vector<RowLogprobs> got_logprobs = Download<RowLogprobs>(dlp, rows);
    int wrong = 0, wrong_top = 0;
    double logprob_err = 0;
    for (int r = 0; r < rows; ++r) {
      wrong += got[r] != want[r];
      if (!draws[r].draw || draws[r].top_logprobs < 0 || want[r] < 0) continue;
      const RowLogprobs& a = got_logprobs[r];
      const RowLogprobs& b = want_logprobs[r];
      // NaN on one side only is an error; on both (the +inf row's logprobs), none.
      auto diff = [](float x, float y) {
        if (std::isnan(x) || std::isnan(y))
          return std::isnan(x) && std::isnan(y) ? 0.0 : std::numeric_limits<double>::infinity();
        return x == y ? 0.0 : std::abs(double(x) - y);
      };
      logprob_err = std::max(logprob_err, diff(a.logprob, b.logprob));
      wrong_top += a.num_top != b.num_top;
      for (int j = 0; j < std::min(a.num_top, b.num_top); ++j) {
        wrong_top += a.top_ids[j] != b.top_ids[j];
        logprob_err = std::max(logprob_err, diff(a.top_logprobs[j], b.top_logprobs[j]));
      }
    }
    const std::string at = ", vocab " + std::to_string(vocab);
    Report("DrawRows vs DrawRow" + at + ": wrong rows", wrong, 0);
    Report("DrawRows logprobs" + at + ": wrong top ids", wrong_top, 0);
    Report("DrawRows logprobs" + at + ": max |diff|", logprob_err, 1e-5);
  }
}

// Rows with the edits real requests make (Sampler::AppendScoreEdits: logit_bias, penalties,
// a min_tokens mask, from random prompts and outputs with repeats; every 8th row a 2000-token
// prompt under a repetition penalty, so that a row has more edits than the block has threads),
// rows with NaN, -inf and -0 logits, a row whose mask covers its only usable token (kept), and
// a greedy row without edits (untouched), at two vocabularies. Errors: rows whose edited logits
// differ from the host's in any bit (any NaN equals any NaN: the device's is canonical); rows
// whose token, picked on the device as CudaForward does (ApplyScoreEdits, ArgmaxRows,
// DrawRows), is not the Sampler's.
void CheckScoreEdits(cudaStream_t s) {
  const float inf = std::numeric_limits<float>::infinity();
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int32_t vocab : {1000, 49152}) {
    const int rows = Emulated() && vocab > 1000 ? 16 : 64;  // see Emulated()
    std::uniform_int_distribution<int32_t> token(0, vocab - 1);
    std::vector<float> logits;
    std::vector<ScoreEdit> edits;
    std::vector<int32_t> edit_begin = {0};
    std::vector<RowDraw> draws(rows);
    std::vector<int32_t> want(rows, -7);
    for (int r = 0; r < rows; ++r) {
      std::vector<float> row = Random(vocab, 3.0f);
      if (r % 5 == 2)
        for (int32_t i = 0; i < vocab; i += 7)
          row[i] = i % 3 == 0 ? std::nanf("") : i % 3 == 1 ? -inf : -0.0f;
      SamplingParams p;
      p.seed = 100 + r;
      p.temperature = r % 4 == 0 ? 0.0f : 0.5f + unit(g_rng);
      p.top_p = r % 3 == 0 ? 0.9f : 1.0f;
      p.top_k = r % 5 == 0 ? 40 : 0;
      if (r % 2 == 0) p.repetition_penalty = 0.6f + 1.2f * unit(g_rng);
      if (r % 3 != 2) p.presence_penalty = -2.0f + 4.0f * unit(g_rng);
      if (r % 5 != 4) p.frequency_penalty = -2.0f + 4.0f * unit(g_rng);
      if (r % 4 == 1) p.logit_bias = {{token(g_rng), 100.0f * unit(g_rng) - 50.0f}};
      if (r % 6 == 3) {
        p.min_tokens = 4;
        p.stop_token_ids = {token(g_rng), 2};
      }
      if (r == rows - 2) {  // the mask would leave nothing: it is not applied
        std::fill(row.begin(), row.end(), -inf);
        row[2] = 1.0f;
        p = SamplingParams{};
        p.temperature = 0.0f;
        p.min_tokens = 4;
        p.stop_token_ids = {2};
      }
      if (r == rows - 1) {  // greedy, no edits: untouched
        p = SamplingParams{};
        p.temperature = 0.0f;
      }
      const bool long_prompt = r % 8 == 0;
      const size_t num_prompt = long_prompt ? 2000 : 1 + r % 9;
      std::vector<int32_t> tokens(num_prompt + r % 3);
      for (int32_t& t : tokens) t = r % 2 ? token(g_rng) : token(g_rng) % 16;  // repeats
      if (long_prompt) {
        p.repetition_penalty = 1.3f;
        for (int32_t& t : tokens) t = token(g_rng);
      }
      Sampler sampler(p, vocab, num_prompt, std::vector<int32_t>{vocab - 1});
      const bool picked = sampler.NextPickedByBackend(tokens, true, &draws[r], &edits);
      if (picked) want[r] = sampler.Sample(row, tokens).token_id;
      edit_begin.push_back(static_cast<int32_t>(edits.size()));
      logits.insert(logits.end(), row.begin(), row.end());
    }
    std::vector<float> host = logits;
    for (int r = 0; r < rows; ++r)
      Must(ApplyScoreEdits({host.data() + size_t(r) * vocab, size_t(vocab)},
                           std::span(edits).subspan(edit_begin[r],
                                                    edit_begin[r + 1] - edit_begin[r])),
           "ApplyScoreEdits (host)");
    DeviceBuffer dl = Upload(logits), de = Upload(edits), db = Upload(edit_begin);
    DeviceBuffer dd = Upload(draws), dids = Scratch(rows * sizeof(int32_t));
    Must(ApplyScoreEdits(dl.as<float>(), rows, vocab, de.as<ScoreEdit>(), db.as<int32_t>(), s),
         "ApplyScoreEdits");
    const std::vector<float> device = Download<float>(dl, logits.size());
    Must(ArgmaxRows(dl.as<float>(), rows, vocab, dids.as<int32_t>(), s), "ArgmaxRows");
    Must(DrawRows(dl.as<float>(), rows, vocab, dd.as<RowDraw>(), dids.as<int32_t>(), nullptr, s),
         "DrawRows");
    const std::vector<int32_t> got = Download<int32_t>(dids, rows);
    int wrong_rows = 0, wrong_tokens = 0, picked = 0;
    size_t most_edits = 0;
    auto same = [](float a, float b) {
      return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0;
    };
    for (int r = 0; r < rows; ++r) {
      bool row_same = true;
      for (size_t i = size_t(r) * vocab; i < size_t(r + 1) * vocab; ++i)
        row_same = row_same && same(host[i], device[i]);
      wrong_rows += !row_same;
      most_edits = std::max<size_t>(most_edits, edit_begin[r + 1] - edit_begin[r]);
      if (want[r] == -7) continue;  // stays on the host (none here: no logprobs)
      ++picked;
      wrong_tokens += got[r] != want[r];
    }
    const std::string at = ", vocab " + std::to_string(vocab);
    Report("ApplyScoreEdits vs host" + at + ": rows not bit-equal", wrong_rows, 0);
    Report("edited rows picked on device vs Sampler" + at + ": wrong tokens", wrong_tokens, 0);
    Report("edited rows picked on device" + at + ": rows not picked", rows - picked, 0);
    Report("score edits" + at + ": a row of more edits than threads (1 = none)",
           most_edits > 256 ? 0 : 1, 0);
  }
}

// A decode step's sampling at batch 64, SmolLM2's vocabulary: on the device (score edits
// where the rows have them, then DrawRows; one pass each, median of 5 by events) against the
// host Sampler on the same rows (one thread, what the engine would otherwise run on S.threads
// threads after copying the logits back). The penalised setting's rows have a 200-token prompt
// and 50 output tokens.
void TimeDrawRows(cudaStream_t s) {
  const int rows = 64;
  const int32_t vocab = 49152;
  const std::vector<float> logits = Random(size_t(rows) * vocab, 3.0f);
  DeviceBuffer pristine = Upload(logits), dl = Upload(logits);
  DeviceBuffer dids = Scratch(rows * sizeof(int32_t));
  struct Setting {
    const char* name;
    SamplingParams params;
    size_t num_prompt = 1, num_output = 0;
  };
  std::vector<Setting> settings(4);
  settings[0] = {"temperature 0.8", {}};
  settings[0].params.temperature = 0.8f;
  settings[1] = {"top-k 50", settings[0].params};
  settings[1].params.top_k = 50;
  settings[2] = {"top-p 0.9", settings[0].params};
  settings[2].params.top_p = 0.9f;
  settings[3] = {"top-p 0.9 + penalties", settings[2].params, 200, 50};
  settings[3].params.repetition_penalty = 1.1f;
  settings[3].params.presence_penalty = 0.5f;
  settings[3].params.frequency_penalty = 0.3f;
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  for (Setting& setting : settings) {
    setting.params.seed = 5;
    std::vector<int32_t> tokens(setting.num_prompt + setting.num_output);
    for (int32_t& t : tokens) t = token(g_rng);
    std::vector<RowDraw> draws(rows);
    std::vector<ScoreEdit> edits;
    std::vector<int32_t> edit_begin = {0};
    std::vector<Sampler> samplers;
    samplers.reserve(rows);
    for (int r = 0; r < rows; ++r) {
      samplers.emplace_back(setting.params, vocab, setting.num_prompt);
      if (!samplers.back().NextPickedByBackend(tokens, true, &draws[r], &edits))
        Must(Internal("a row the device does not pick"), "NextPickedByBackend");
      edit_begin.push_back(static_cast<int32_t>(edits.size()));
    }
    DeviceBuffer dd = Upload(draws);
    DeviceBuffer de = Upload(edits.empty() ? std::vector<ScoreEdit>(1) : edits);
    DeviceBuffer db = Upload(edit_begin);
    auto pick = [&] {
      if (!edits.empty())
        Must(ApplyScoreEdits(dl.as<float>(), rows, vocab, de.as<ScoreEdit>(), db.as<int32_t>(),
                             s),
             "ApplyScoreEdits");
      Must(DrawRows(dl.as<float>(), rows, vocab, dd.as<RowDraw>(), dids.as<int32_t>(), nullptr,
                    s),
           "DrawRows");
    };
    const double device_ms = 1e3 * MedianSeconds(s, pick);  // edits compound here: timing only
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(dl.data(), pristine.data(), logits.size() * sizeof(float),
                                      cudaMemcpyDeviceToDevice, s));  // the logits as drawn
    pick();
    const std::vector<int32_t> got = Download<int32_t>(dids, rows);
    int differ = 0;
    const auto host_start = std::chrono::steady_clock::now();
    for (int r = 0; r < rows; ++r)
      differ += samplers[r]
                    .Sample({logits.data() + size_t(r) * vocab, size_t(vocab)}, tokens)
                    .token_id != got[r];
    const double host_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - host_start)
            .count();
    std::printf("ROW|sampling %s, 64 rows of vocab 49152|info|device %.3f ms (%.1f us a row); "
                "host Sampler %.1f ms on one thread (%.0fx); %d of 64 tokens differ\n",
                setting.name, device_ms, device_ms * 1e3 / rows, host_ms, host_ms / device_ms,
                differ);
  }
}

}  // namespace tandem::cuda
