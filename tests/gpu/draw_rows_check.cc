// cuda_kernels_check's device draw rows: cuda::DrawRows against DrawRow (common/engine/row_draw.h,
// its host reference, itself checked against the Sampler by tests/unit/row_draw_test.cc), and
// its time against the host Sampler on the same rows.
#include <algorithm>
#include <chrono>
#include <limits>

#include "common/engine/row_draw.h"
#include "common/engine/sampling.h"
#include "tests/gpu/check_util.h"

namespace tandem::cuda {
namespace {

// A row's draw parameters, cycling through the warper mixes the Sampler supports.
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
  d.draw = 1;
  static const int32_t kTopLogprobs[] = {-1, 0, 5, kMaxTopLogprobs};
  d.top_logprobs = kTopLogprobs[row % 4];
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
    const int rows = vocab > 100000 ? 24 : 96;
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
      auto diff = [](float x, float y) { return x == y ? 0.0 : std::abs(double(x) - y); };
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

// A decode step's sampling at batch 64, SmolLM2's vocabulary: DrawRows on the device (one
// launch, median of 5 by events) against the host Sampler on the same rows (one thread, what
// the engine would otherwise run on S.threads threads after copying the logits back).
void TimeDrawRows(cudaStream_t s) {
  const int rows = 64;
  const int32_t vocab = 49152;
  const std::vector<float> logits = Random(size_t(rows) * vocab, 3.0f);
  DeviceBuffer dl = Upload(logits), dids = Scratch(rows * sizeof(int32_t));
  struct Setting {
    const char* name;
    SamplingParams params;
  };
  std::vector<Setting> settings(3);
  settings[0] = {"temperature 0.8", {}};
  settings[0].params.temperature = 0.8f;
  settings[1] = {"top-k 50", settings[0].params};
  settings[1].params.top_k = 50;
  settings[2] = {"top-p 0.9", settings[0].params};
  settings[2].params.top_p = 0.9f;
  for (Setting& setting : settings) {
    setting.params.seed = 5;
    const std::vector<int32_t> tokens = {1};  // a prompt of one token
    std::vector<RowDraw> draws;
    std::vector<Sampler> samplers;
    samplers.reserve(rows);
    for (int r = 0; r < rows; ++r) {
      samplers.emplace_back(setting.params, vocab, 1);
      draws.push_back(*samplers.back().NextRowDraw(tokens));
    }
    DeviceBuffer dd = Upload(draws);
    const double device_ms = 1e3 * MedianSeconds(s, [&] {
      Must(DrawRows(dl.as<float>(), rows, vocab, dd.as<RowDraw>(), dids.as<int32_t>(), nullptr,
                    s),
           "DrawRows");
    });
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
