// engine_bench: CPU forward-pass throughput against the machine's own roofline.
//
//   engine_bench [--presets small,medium] [--model DIR] [--threads N] [--json FILE] [--quick]
//
// For each model: prefill tokens/s at prompt 128/512/2048 (one sequence) and decode tokens/s at
// batch 1/8/32/64 (context 128 per sequence). Beside each number, the fraction of its roofline:
// roofline time = max(weight bytes / read bandwidth, flops / sgemm peak), fraction = roofline
// time / measured time. In detail:
//   - prefill: achieved GFLOP/s (2 * weight params * tokens + attention) as a fraction of the
//     measured cblas_sgemm peak on this machine with the same thread count;
//   - decode: weight bytes read per step / step time, as a fraction of the measured streaming
//     read bandwidth (a decode step only reads weights). memcpy bandwidth (bytes read + written
//     per second, STREAM "copy" convention) is printed beside it.
// Models come from make-model presets written to a temp dir (no tokenizer) or from --model.
#include <cblas.h>
#include <immintrin.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/base/flags.h"
#include "common/engine/forward.h"
#include "common/engine/kv_cache.h"
#include "common/model/make_model.h"
#include "common/model/model.h"

namespace tandem {
namespace {

// Wall time by default. With --cpu-time, process CPU time: on a machine shared with other work
// (time slices taken away) it is the steadier measure, and equals wall time on an idle machine
// when every thread is busy.
bool g_cpu_time = false;

struct Clock {
  using time_point = double;
  static double now() {
    if (g_cpu_time) {
      timespec ts;
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
      return ts.tv_sec + ts.tv_nsec * 1e-9;
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

double Seconds(double a, double b) {
  return b - a;
}

// Best of a few 256 MiB copies: bytes read + written per second.
double MeasureMemcpyBandwidth() {
  const size_t bytes = size_t{256} << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    best = std::min(best, Seconds(t0, Clock::now()));
    a[i] = b[bytes - 1 - i];  // keep the copies observable
  }
  return 2.0 * bytes / best;
}

// Best of a few streaming reads of 256 MiB (what a memory-bound decode step does): bytes/s.
// AVX2 loads when available, so the loop is limited by memory, not by the adds.
// Four streams at once, as the GEMV kernels read four weight rows: one stream alone leaves the
// prefetchers idle part of the time and understates the bandwidth.
[[gnu::target("avx2")]] float SumAvx2(const float* a, size_t n) {
  const size_t quarter = n / 4;
  const float* p0 = a;
  const float* p1 = a + quarter;
  const float* p2 = a + 2 * quarter;
  const float* p3 = a + 3 * quarter;
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i + 16 <= quarter; i += 16) {
    s0 = _mm256_add_ps(s0, _mm256_add_ps(_mm256_loadu_ps(p0 + i), _mm256_loadu_ps(p0 + i + 8)));
    s1 = _mm256_add_ps(s1, _mm256_add_ps(_mm256_loadu_ps(p1 + i), _mm256_loadu_ps(p1 + i + 8)));
    s2 = _mm256_add_ps(s2, _mm256_add_ps(_mm256_loadu_ps(p2 + i), _mm256_loadu_ps(p2 + i + 8)));
    s3 = _mm256_add_ps(s3, _mm256_add_ps(_mm256_loadu_ps(p3 + i), _mm256_loadu_ps(p3 + i + 8)));
  }
  float out[8];
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  return out[0] + out[7];
}

double MeasureReadBandwidth() {
  const size_t n = (size_t{256} << 20) / sizeof(float);
  std::vector<float> a(n, 1.0f);
  double best = 1e30;
  float sink = 0;
  const bool avx2 = __builtin_cpu_supports("avx2");
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = Clock::now();
    if (avx2) {
      sink += SumAvx2(a.data(), n);
    } else {
      float acc[16] = {};
      for (size_t i = 0; i < n; i += 16)
        for (int j = 0; j < 16; ++j) acc[j] += a[i + j];
      sink += acc[0];
    }
    best = std::min(best, Seconds(t0, Clock::now()));
  }
  if (sink == 0.5f) std::printf(" ");  // keep the sums alive
  return n * sizeof(float) / best;
}

// Best cblas_sgemm rate over shapes like the model's prefill GEMMs.
double MeasureSgemmPeak(int threads) {
  openblas_set_num_threads(threads);
  double best = 0;
  const int shapes[][3] = {{512, 3072, 768}, {1024, 2048, 2048}, {2048, 768, 3072}};
  for (const auto& s : shapes) {
    const int m = s[0], n = s[1], k = s[2];
    std::vector<float> a(size_t{static_cast<size_t>(m)} * k, 0.01f),
        b(size_t{static_cast<size_t>(n)} * k, 0.02f), c(size_t{static_cast<size_t>(m)} * n);
    for (int rep = 0; rep < 3; ++rep) {
      auto t0 = Clock::now();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a.data(), k, b.data(), k,
                  0.0f, c.data(), n);
      best = std::max(best, 2.0 * m * n * k / Seconds(t0, Clock::now()));
    }
  }
  return best;
}

struct Result {
  std::string model, phase;
  int tokens_or_batch;
  double tokens_per_s, achieved, roofline_fraction;
};

std::vector<int32_t> RandomTokens(int n, int vocab, std::mt19937& rng) {
  std::vector<int32_t> out(n);
  std::uniform_int_distribution<int> dist(0, vocab - 1);
  for (int32_t& t : out) t = dist(rng);
  return out;
}

// The machine's ceilings, measured once.
struct Roofline {
  double memcpy_bandwidth = 0;  // bytes read + written per second
  double bandwidth = 0;         // streaming read, bytes per second
  double peak = 0;              // sgemm flops per second
};

Roofline MeasureRoofline(int threads) {
  Roofline r;
  r.memcpy_bandwidth = MeasureMemcpyBandwidth();
  r.bandwidth = std::max(MeasureReadBandwidth(), r.memcpy_bandwidth / 2);
  r.peak = MeasureSgemmPeak(threads);
  return r;
}

// (name, dir) of each model to bench: --model, or the presets written under `tmp`.
StatusOr<std::vector<std::pair<std::string, std::string>>> PrepareModels(
    const std::string& model, const std::string& presets, const std::filesystem::path& tmp) {
  std::vector<std::pair<std::string, std::string>> models;
  if (!model.empty()) {
    models.push_back({model, model});
    return models;
  }
  for (size_t i = 0; i < presets.size();) {
    size_t comma = std::min(presets.find(',', i), presets.size());
    std::string preset = presets.substr(i, comma - i);
    i = comma + 1;
    MakeModelOptions options;
    options.preset = preset;
    options.seed = 1;
    options.with_tokenizer = false;
    std::string dir = (tmp / preset).string();
    TANDEM_RETURN_IF_ERROR(MakeModel(options, dir));
    models.push_back({preset, dir});
  }
  return models;
}

// One model's forward pass, and what its roofline needs.
struct BenchedModel {
  const std::string& name;
  const Model& model;
  CpuForward& engine;
  const KvLayout& layout;
  double params;  // weight parameters read per step
};

// Prefill tokens/s of one sequence per prompt length.
Status BenchPrefill(const BenchedModel& m, const Roofline& roof, bool quick, std::mt19937& rng,
                    std::vector<Result>* results) {
  const ModelConfig& c = m.model.config();
  std::vector<int> prompts = quick ? std::vector<int>{128, 512} : std::vector<int>{128, 512, 2048};
  for (int n : prompts) {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache,
                            KvCache::Create(m.layout, n / m.layout.block_size + 1));
    std::vector<int32_t> table;
    (void)cache->blocks().Allocate(cache->num_blocks(), &table);
    std::vector<int32_t> tokens = RandomTokens(n, c.vocab_size, rng);
    SequenceInput seq{tokens, 0, table};
    double best = 1e30;
    for (int rep = 0; rep < (n <= 512 ? 3 : 1); ++rep) {
      auto t0 = Clock::now();
      TANDEM_RETURN_IF_ERROR(m.engine.Forward({&seq, 1}, *cache).status());
      best = std::min(best, Seconds(t0, Clock::now()));
    }
    const double attention_flops =
        4.0 * c.num_layers * c.num_heads * c.head_dim * n * (n + 1) / 2.0;
    const double flops = 2.0 * m.params * n + attention_flops;
    const double bound = std::max(flops / roof.peak, m.model.step_weight_bytes() / roof.bandwidth);
    results->push_back({m.name, "prefill", n, n / best, flops / best, bound / best});
    std::printf("%-8s %-8s %6d %12.1f %10.1f GFLOP/s %9.0f%%\n", m.name.c_str(), "prefill", n,
                n / best, flops / best / 1e9, 100 * bound / best);
    std::fflush(stdout);
  }
  return Status::Ok();
}

// Decode tokens/s per batch size, context 128 per sequence.
Status BenchDecode(const BenchedModel& m, const Roofline& roof, bool quick, std::mt19937& rng,
                   std::vector<Result>* results) {
  const ModelConfig& c = m.model.config();
  std::vector<int> batches = quick ? std::vector<int>{1, 8} : std::vector<int>{1, 8, 32, 64};
  const int context = 128, steps = 8;
  for (int b : batches) {
    const int blocks_per_seq = (context + steps) / m.layout.block_size + 1;
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache,
                            KvCache::Create(m.layout, b * blocks_per_seq));
    std::vector<std::vector<int32_t>> tables(b), prompts_b(b);
    std::vector<int32_t> next(b);
    for (int i = 0; i < b; ++i) {
      tables[i].reserve(blocks_per_seq);
      (void)cache->blocks().Allocate(blocks_per_seq, &tables[i]);
      prompts_b[i] = RandomTokens(context, c.vocab_size, rng);
      SequenceInput seq{prompts_b[i], 0, tables[i]};
      TANDEM_RETURN_IF_ERROR(m.engine.Forward({&seq, 1}, *cache).status());
      next[i] = prompts_b[i].back();
    }
    std::vector<SequenceInput> batch(b);
    double total = 0;
    for (int s = 0; s < steps; ++s) {
      for (int i = 0; i < b; ++i) batch[i] = SequenceInput{{&next[i], 1}, context + s, tables[i]};
      auto t0 = Clock::now();
      TANDEM_RETURN_IF_ERROR(m.engine.Forward(batch, *cache).status());
      if (s > 0) total += Seconds(t0, Clock::now());  // step 0 warms up
    }
    const double step_s = total / (steps - 1);
    const double bytes = static_cast<double>(m.model.step_weight_bytes());
    const double flops =
        2.0 * m.params * b + 4.0 * c.num_layers * c.num_heads * c.head_dim * b * context;
    const double bound = std::max(bytes / roof.bandwidth, flops / roof.peak);
    results->push_back({m.name, "decode", b, b / step_s, bytes / step_s, bound / step_s});
    std::printf("%-8s %-8s %6d %12.1f %10.2f GB/s    %9.0f%%  (%s-bound)\n", m.name.c_str(),
                "decode", b, b / step_s, bytes / step_s / 1e9, 100 * bound / step_s,
                bytes / roof.bandwidth > flops / roof.peak ? "memory" : "compute");
    std::fflush(stdout);
  }
  return Status::Ok();
}

Status BenchModel(const std::string& name, const std::string& dir, int threads, bool quick,
                  const Roofline& roof, std::mt19937& rng, std::vector<Result>* results) {
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Load(dir));
  ForwardOptions options;
  options.num_threads = threads;
  options.max_batch_tokens = 2048;
  options.max_batch_sequences = 64;
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<CpuForward> engine, CpuForward::Create(*model, options));
  const KvLayout layout = engine->MakeKvLayout();
  const BenchedModel m{name, *model, *engine, layout,
                       static_cast<double>(model->step_weight_bytes()) / 4};
  TANDEM_RETURN_IF_ERROR(BenchPrefill(m, roof, quick, rng, results));
  return BenchDecode(m, roof, quick, rng, results);
}

void WriteJson(const std::string& path, int threads, const Roofline& roof,
               const std::vector<Result>& results) {
  nlohmann::json out;
  out["threads"] = threads;
  out["timing"] = g_cpu_time ? "process_cpu" : "wall";
  out["memcpy_bytes_per_s"] = roof.memcpy_bandwidth;
  out["read_bytes_per_s"] = roof.bandwidth;
  out["sgemm_flops_per_s"] = roof.peak;
  for (const Result& r : results) {
    out["results"].push_back(
        {{"model", r.model},
         {"phase", r.phase},
         {r.phase == "prefill" ? "prompt_tokens" : "batch", r.tokens_or_batch},
         {"tokens_per_s", r.tokens_per_s},
         {r.phase == "prefill" ? "flops_per_s" : "weight_bytes_per_s", r.achieved},
         {"roofline_fraction", r.roofline_fraction}});
  }
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f != nullptr) {
    std::fputs(out.dump(2).c_str(), f);
    std::fclose(f);
    std::printf("\nraw numbers: %s\n", path.c_str());
  }
}

int Run(const std::vector<std::string>& args) {
  FlagParser flags("engine_bench [flags]", "CPU forward-pass throughput vs roofline.");
  flags.AddString("presets", "small,medium", "make-model presets to bench (comma-separated)");
  flags.AddString("model", "", "bench this checkpoint instead of presets");
  flags.AddInt("threads", 2, "compute threads");
  flags.AddString("json", "engine_bench.json", "raw numbers go here");
  flags.AddBool("quick", "prompt 128/512 and batch 1/8 only");
  flags.AddBool("cpu-time", "time with process CPU time instead of wall time (shared machines)");
  if (Status s = flags.Parse(args); !s.ok() || flags.help_requested()) {
    std::fputs(s.ok() ? flags.Help().c_str() : (s.message() + "\n").c_str(),
               s.ok() ? stdout : stderr);
    return s.ok() ? 0 : 2;
  }
  const int threads = static_cast<int>(flags.GetInt("threads"));
  const bool quick = flags.GetBool("quick");
  g_cpu_time = flags.GetBool("cpu-time");

  std::printf("measuring roofline (threads=%d)...\n", threads);
  const Roofline roof = MeasureRoofline(threads);
  std::printf(
      "memcpy %.2f GB/s (read+write), read %.2f GB/s, sgemm peak %.1f GFLOP/s (%s time)\n"
      "decode roofline = read bandwidth; prefill roofline = sgemm peak\n\n",
      roof.memcpy_bandwidth / 1e9, roof.bandwidth / 1e9, roof.peak / 1e9,
      g_cpu_time ? "CPU" : "wall");
  const std::filesystem::path tmp = std::filesystem::temp_directory_path() / "tandem-engine-bench";
  auto models = PrepareModels(flags.GetString("model"), flags.GetString("presets"), tmp);
  if (!models.ok()) {
    std::fprintf(stderr, "%s\n", models.status().ToString().c_str());
    return 1;
  }
  std::vector<Result> results;
  std::mt19937 rng(1);
  std::printf("%-8s %-8s %6s %12s %16s %10s\n", "model", "phase", "n", "tokens/s", "achieved",
              "roofline");
  for (const auto& [name, dir] : *models) {
    if (Status s = BenchModel(name, dir, threads, quick, roof, rng, &results); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
  }
  WriteJson(flags.GetString("json"), threads, roof, results);
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  return tandem::Run(std::vector<std::string>(argv + 1, argv + argc));
}
