// sampling_bench: what sampling on the host costs per row of logits, for the CUDA backend's
// choice to copy logits to the host and sample there (common/engine/cuda/cuda_forward.h).
//   sampling_bench [--vocabs 49152,128256] [--rows 256] [--threads 1,2] [--json FILE]
//
// For each vocabulary size and each setting (greedy, temperature, top-k, top-p, penalties,
// logprobs) it samples `rows` rows of random logits (normal, sd 3: a peaked distribution like a
// model's) with one Sampler on one thread, and reports the median time per row. Multiply by the
// batch size for a decode step's sampling time on one thread; compare with the step itself.
// Then a whole step: 64 rows of top-p 0.9, each its own Sampler, through BatchSampling on each
// of --threads threads (S.threads), the median of 9 steps. Last, what a device backend's step
// costs the engine thread for a row with penalties instead (Sampler::AppendScoreEdits: the
// row's score edits, uploaded in place of sampling on the host), by prompt length: its first
// step and the steps after it.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/base/flags.h"
#include "common/engine/batch_sampling.h"
#include "common/engine/sampling.h"

namespace tandem {
namespace {

struct Setting {
  std::string name;
  SamplingParams params;
};

std::vector<Setting> Settings() {
  std::vector<Setting> out;
  SamplingParams p;
  p.temperature = 0;
  out.push_back({"greedy", p});
  p = SamplingParams{};
  p.temperature = 0.8f;
  out.push_back({"temperature 0.8", p});
  p.top_k = 50;
  out.push_back({"top-k 50", p});
  p.top_k = 0;
  p.top_p = 0.9f;
  out.push_back({"top-p 0.9", p});
  p.repetition_penalty = 1.1f;
  p.presence_penalty = 0.5f;
  out.push_back({"top-p + penalties", p});
  p = SamplingParams{};
  p.temperature = 0;
  p.logprobs = true;
  p.top_logprobs = 5;
  out.push_back({"greedy + 5 logprobs", p});
  return out;
}

using Clock = std::chrono::steady_clock;

double MicrosSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

double Median(std::vector<double> times) {
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Median microseconds per Sample() over `rows` rows of `vocab` logits.
double MicrosPerRow(const SamplingParams& params, int vocab, int rows, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(vocab) * rows);
  for (float& x : logits) x = normal(rng);
  std::vector<int32_t> tokens(300);  // a prompt of 200 and 100 outputs, for the penalties
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % vocab);
  Sampler sampler(params, vocab, 200);
  std::vector<double> times;
  for (int r = 0; r < rows; ++r) {
    const std::span<const float> row(logits.data() + static_cast<size_t>(r) * vocab, vocab);
    const Clock::time_point t0 = Clock::now();
    SampleResult result = sampler.Sample(row, tokens);
    times.push_back(MicrosSince(t0));
    tokens[250] = result.token_id;  // keep the result alive
  }
  return Median(times);
}

// Median microseconds of one row's AppendScoreEdits (repetition, presence and frequency
// penalties) with `prompt` prompt tokens and 256 output tokens, from its second call on (the
// first keeps the prompt's token set); *first_us: the median first call of 9 fresh Samplers;
// *edits: how many it made.
double EditMicrosPerRow(int vocab, int prompt, int rows, std::mt19937& rng, size_t* edits,
                        double* first_us) {
  SamplingParams params;
  params.temperature = 0.8f;
  params.repetition_penalty = 1.1f;
  params.presence_penalty = 0.5f;
  params.frequency_penalty = 0.3f;
  std::vector<int32_t> tokens(static_cast<size_t>(prompt) + 256);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % vocab);
  std::vector<ScoreEdit> out;
  out.reserve(tokens.size());
  std::vector<double> times;
  for (int fresh = 0; fresh < 9; ++fresh) {
    Sampler first(params, vocab, prompt);
    out.clear();
    const Clock::time_point t0 = Clock::now();
    first.AppendScoreEdits(tokens, &out);
    times.push_back(MicrosSince(t0));
  }
  *first_us = Median(times);
  times.clear();
  Sampler sampler(params, vocab, prompt);
  sampler.AppendScoreEdits(tokens, &out);  // its first call
  for (int r = 0; r < rows; ++r) {
    out.clear();
    const Clock::time_point t0 = Clock::now();
    sampler.AppendScoreEdits(tokens, &out);
    times.push_back(MicrosSince(t0));
  }
  *edits = out.size();
  return Median(times);
}

// Median milliseconds of one step of `batch` top-p rows through BatchSampling on `threads`.
double StepMillis(int vocab, int batch, int threads, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(vocab) * batch);
  for (float& x : logits) x = normal(rng);
  std::vector<int32_t> tokens(300);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % vocab);
  SamplingParams params;
  params.temperature = 0.8f;
  params.top_p = 0.9f;
  SamplerWorkspace shared(vocab);
  std::vector<std::unique_ptr<Sampler>> samplers;
  std::vector<BatchSampling::Job> jobs;
  for (int r = 0; r < batch; ++r) {
    samplers.push_back(std::make_unique<Sampler>(params, &shared, 200));
    jobs.push_back({samplers.back().get(),
                    std::span<const float>(logits.data() + static_cast<size_t>(r) * vocab, vocab),
                    tokens});
  }
  BatchSampling sampling(threads, vocab);
  std::vector<SampleResult> results(batch);
  std::vector<double> times;
  for (int step = 0; step < 9; ++step) {
    const Clock::time_point t0 = Clock::now();
    sampling.Run(jobs, results);
    times.push_back(MicrosSince(t0) / 1000);
  }
  return Median(times);
}

int Run(const std::vector<std::string>& args) {
  FlagParser flags("sampling_bench [flags]", "Host sampling time per row of logits.");
  flags.AddString("vocabs", "49152,128256", "vocabulary sizes (SmolLM2, Llama 3)");
  flags.AddInt("rows", 256, "rows sampled per figure (the median is reported)");
  flags.AddString("threads", "1,2", "BatchSampling threads for the 64-row step");
  flags.AddString("json", "sampling_bench.json", "raw numbers go here");
  Status parsed = flags.Parse(args);
  const int rows = parsed.ok() ? static_cast<int>(flags.GetInt("rows")) : 0;
  if (parsed.ok() && (rows < 1 || rows > 100000)) parsed = InvalidArgument("--rows must be in [1, 100000]");
  // A comma-separated list of integers in [low, high], or an error naming the flag.
  auto int_list = [&](const char* flag, long low, long high, std::vector<int>* out) {
    const std::string list = flags.GetString(flag);
    for (size_t i = 0; i < list.size() && parsed.ok();) {
      const size_t comma = std::min(list.find(',', i), list.size());
      const std::string part = list.substr(i, comma - i);
      char* end = nullptr;
      const long v = std::strtol(part.c_str(), &end, 10);
      if (part.empty() || *end != '\0' || v < low || v > high)
        parsed = InvalidArgument(std::string("--") + flag + ": '" + part + "' is not in [" +
                                 std::to_string(low) + ", " + std::to_string(high) + "]");
      else
        out->push_back(static_cast<int>(v));
      i = comma + 1;
    }
  };
  std::vector<int> vocabs, threads;
  if (parsed.ok()) int_list("vocabs", 2, 1000000, &vocabs);
  if (parsed.ok()) int_list("threads", 1, 256, &threads);
  if (!parsed.ok() || flags.help_requested()) {
    std::fputs(parsed.ok() ? flags.Help().c_str() : (parsed.message() + "\n").c_str(),
               parsed.ok() ? stdout : stderr);
    return parsed.ok() ? 0 : 2;
  }
  std::mt19937 rng(1);
  nlohmann::json out = nlohmann::json::array();
  std::printf("| setting | vocab | us per row | 64 rows (ms, one thread) | logits row (KiB) |\n");
  std::printf("|---|---|---|---|---|\n");
  for (int vocab : vocabs) {
    for (const Setting& s : Settings()) {
      const double us = MicrosPerRow(s.params, vocab, rows, rng);
      std::printf("| %s | %d | %.1f | %.2f | %.0f |\n", s.name.c_str(), vocab, us, us * 64 / 1000,
                  vocab * 4 / 1024.0);
      out.push_back({{"setting", s.name}, {"vocab", vocab}, {"us_per_row", us}, {"rows", rows}});
    }
  }
  std::printf("\n| step of 64 top-p rows | vocab | threads | ms | vs 1 thread |\n");
  std::printf("|---|---|---|---|---|\n");
  for (int vocab : vocabs) {
    double one = 0;
    for (int t : threads) {
      const double ms = StepMillis(vocab, 64, t, rng);
      if (t == threads.front()) one = ms;
      std::printf("| BatchSampling | %d | %d | %.2f | %.2fx |\n", vocab, t, ms, one / ms);
      out.push_back({{"setting", "step of 64 top-p rows"}, {"vocab", vocab}, {"threads", t},
                     {"ms_per_step", ms}});
    }
  }
  std::printf("\n| score edits of a penalised row | vocab | prompt + output tokens | edits "
              "(KiB) | first step (us) | us per row | 64 rows (ms) |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (int vocab : vocabs) {
    for (int prompt : {200, 4096, 32768}) {
      size_t edits = 0;
      double first_us = 0;
      const double us = EditMicrosPerRow(vocab, prompt, rows, rng, &edits, &first_us);
      std::printf("| AppendScoreEdits | %d | %d + 256 | %zu (%.0f) | %.1f | %.1f | %.2f |\n",
                  vocab, prompt, edits, edits * sizeof(ScoreEdit) / 1024.0, first_us, us,
                  us * 64 / 1000);
      out.push_back({{"setting", "score edits"}, {"vocab", vocab}, {"prompt", prompt},
                     {"edits", edits}, {"first_us", first_us}, {"us_per_row", us}});
    }
  }
  std::ofstream(flags.GetString("json")) << out.dump(2) << "\n";
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  return tandem::Run(std::vector<std::string>(argv + 1, argv + argc));
}
