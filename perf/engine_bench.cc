// engine_bench: CPU forward-pass throughput against the machine's own roofline.
//
//   engine_bench [--presets smollm2] [--model DIR] [--threads 1,2] [--dtypes float32,bfloat16]
//                [--batches 1,8,16,32,64] [--prompts 512] [--runs 7] [--json FILE] [--cpu-time]
//
// For each thread count, the roofline is measured first, then for each model and weight dtype:
// prefill tokens/s (one sequence per prompt length) and decode tokens/s per batch size (context
// 128 per sequence). Each figure is the MEDIAN of --runs timed passes (decode: steps); the
// ceilings are the best of their runs. Beside each figure, the fraction of its roofline:
// roofline time = max(bytes read / read bandwidth, flops / sgemm peak), fraction = roofline time
// / measured time. In detail:
//   - read bandwidth: a STREAM-like read (sum) of 256 MiB split over the same number of threads;
//   - sgemm peak: cblas_sgemm on prefill-like shapes, same number of threads;
//   - decode bytes: the weights one step reads at their storage dtype (Model::step_weight_bytes)
//     plus the KV cache the batch's attention reads (context * layers * 2 * kv_dim * 4 bytes per
//     sequence); flops: 2 * matrix params * batch + attention;
//   - prefill: 2 * matrix params * tokens + attention flops, against the sgemm peak.
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
#include <thread>
#include <string>
#include <vector>

#include "common/base/flags.h"
#include "common/engine/linear_kernels.h"
#include "common/engine/forward.h"
#include "common/engine/kv_cache.h"
#include "common/model/make_model.h"
#include "common/model/model.h"

namespace tandem {
namespace {

// Wall time by default. With --cpu-time, process CPU time: on a machine shared with other work
// (time slices taken away) it is the steadier measure at ONE thread (it sums the threads' time,
// so it is refused with more).
bool g_cpu_time = false;

double Now() {
  if (g_cpu_time) {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Best of a few 256 MiB copies: bytes read + written per second (one thread).
double MeasureMemcpyBandwidth() {
  const size_t bytes = size_t{256} << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    const double t0 = Now();
    std::memcpy(b.data(), a.data(), bytes);
    best = std::min(best, Now() - t0);
    a[i] = b[bytes - 1 - i];  // keep the copies observable
  }
  return 2.0 * bytes / best;
}

// Sums n floats as four streams at once, as the GEMV kernels read several weight rows: one
// stream alone leaves the prefetchers idle part of the time and understates the bandwidth.
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

float SumScalar(const float* a, size_t n) {
  float acc[16] = {};
  for (size_t i = 0; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += a[i + j];
  return acc[0] + acc[15];
}

// Best of a few streaming reads of 256 MiB split over `threads` threads (what a memory-bound
// decode step does): bytes/s.
double MeasureReadBandwidth(int threads) {
  const size_t n = (size_t{256} << 20) / sizeof(float);
  std::vector<float> a(n, 1.0f);
  const bool avx2 = __builtin_cpu_supports("avx2");
  const size_t part = n / threads / 16 * 16;
  std::vector<float> sums(threads);
  double best = 1e30;
  for (int rep = 0; rep < 7; ++rep) {
    const double t0 = Now();
    std::vector<std::thread> workers;
    for (int t = 1; t < threads; ++t)
      workers.emplace_back([&, t] {
        sums[t] += avx2 ? SumAvx2(a.data() + t * part, part) : SumScalar(a.data() + t * part, part);
      });
    sums[0] += avx2 ? SumAvx2(a.data(), part) : SumScalar(a.data(), part);
    for (std::thread& w : workers) w.join();
    best = std::min(best, Now() - t0);
  }
  if (sums[0] == 0.5f) std::printf(" ");  // keep the sums alive
  return static_cast<double>(part) * threads * sizeof(float) / best;
}

// Best cblas_sgemm rate over shapes like the model's prefill GEMMs.
double MeasureSgemmPeak(int threads) {
  openblas_set_num_threads(threads);
  double best = 0;
  const int shapes[][3] = {{512, 3072, 576}, {512, 576, 1536}, {512, 3072, 768}, {1024, 2048, 2048}};
  for (const auto& s : shapes) {
    const int m = s[0], n = s[1], k = s[2];
    std::vector<float> a(size_t{static_cast<size_t>(m)} * k, 0.01f),
        b(size_t{static_cast<size_t>(n)} * k, 0.02f), c(size_t{static_cast<size_t>(m)} * n);
    for (int rep = 0; rep < 5; ++rep) {
      const double t0 = Now();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a.data(), k, b.data(), k,
                  0.0f, c.data(), n);
      best = std::max(best, 2.0 * m * n * k / (Now() - t0));
    }
  }
  return best;
}

// The machine's ceilings at one thread count.
struct Roofline {
  int threads = 1;
  double memcpy_bandwidth = 0;  // bytes read + written per second, one thread
  double bandwidth = 0;         // streaming read, bytes per second, `threads` threads
  double peak = 0;              // sgemm flops per second, `threads` threads
};

Roofline MeasureRoofline(int threads) {
  Roofline r;
  r.threads = threads;
  r.memcpy_bandwidth = MeasureMemcpyBandwidth();
  r.bandwidth = MeasureReadBandwidth(threads);
  r.peak = MeasureSgemmPeak(threads);
  return r;
}

struct Result {
  std::string model, dtype, phase;
  int threads, tokens_or_batch;
  double tokens_per_s, achieved, roofline_fraction;
  bool memory_bound;
};

std::vector<int32_t> RandomTokens(int n, int vocab, std::mt19937& rng) {
  std::vector<int32_t> out(n);
  std::uniform_int_distribution<int> dist(0, vocab - 1);
  for (int32_t& t : out) t = dist(rng);
  return out;
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

// Parameters of the matrices one token multiplies by (the LM head included, the embedding
// gather not): 2 flops each per token.
double MatrixParams(const ModelConfig& c) {
  const double h = c.hidden_size;
  return c.num_layers * (h * (c.q_dim() + 2.0 * c.kv_dim()) + c.q_dim() * h +
                         3.0 * h * c.intermediate_size) +
         static_cast<double>(c.vocab_size) * h;
}

// One model's forward pass at one dtype and thread count.
struct Bench {
  const std::string& name;
  const Model& model;
  CpuForward& engine;
  const KvLayout& layout;
  const Roofline& roof;
  int runs;
};

Result MakeResult(const Bench& b, const char* phase, int n, double seconds, double bytes,
                  double flops) {
  const double memory_s = bytes / b.roof.bandwidth, compute_s = flops / b.roof.peak;
  const bool prefill = std::string_view(phase) == "prefill";
  const double bound = prefill ? compute_s : std::max(memory_s, compute_s);
  Result r{b.name, std::string(WeightDTypeName(b.model.dtype())), phase, b.roof.threads, n,
           n / seconds, (prefill ? flops : bytes) / seconds, bound / seconds,
           !prefill && memory_s >= compute_s};
  if (prefill) {
    std::printf("%-8s %-9s %2d %-8s %6d %10.1f %8.1f GFLOP/s %6.0f%%\n", r.model.c_str(),
                r.dtype.c_str(), r.threads, phase, n, r.tokens_per_s, r.achieved / 1e9,
                100 * r.roofline_fraction);
  } else {
    std::printf("%-8s %-9s %2d %-8s %6d %10.1f %8.2f GB/s    %6.0f%%  (%s-bound)\n",
                r.model.c_str(), r.dtype.c_str(), r.threads, phase, n, r.tokens_per_s,
                r.achieved / 1e9, 100 * r.roofline_fraction, r.memory_bound ? "memory" : "compute");
  }
  std::fflush(stdout);
  return r;
}

// Prefill tokens/s of one sequence per prompt length.
Status BenchPrefill(const Bench& b, const std::vector<int>& prompts, std::mt19937& rng,
                    std::vector<Result>* results) {
  const ModelConfig& c = b.model.config();
  for (int n : prompts) {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache,
                            KvCache::Create(b.layout, n / b.layout.block_size + 1));
    std::vector<int32_t> table;
    (void)cache->blocks().Allocate(cache->num_blocks(), &table);
    std::vector<int32_t> tokens = RandomTokens(n, c.vocab_size, rng);
    SequenceInput seq{tokens, 0, table};
    TANDEM_RETURN_IF_ERROR(b.engine.Forward({&seq, 1}, *cache).status());  // warm-up
    std::vector<double> times;
    for (int rep = 0; rep < b.runs; ++rep) {
      const double t0 = Now();
      TANDEM_RETURN_IF_ERROR(b.engine.Forward({&seq, 1}, *cache).status());
      times.push_back(Now() - t0);
    }
    const double attention_flops = 4.0 * c.num_layers * c.num_heads * c.head_dim * n * (n + 1) / 2.0;
    const double flops = 2.0 * MatrixParams(c) * n + attention_flops;
    results->push_back(MakeResult(b, "prefill", n, Median(times),
                                  static_cast<double>(b.model.step_weight_bytes()), flops));
  }
  return Status::Ok();
}

// Decode tokens/s per batch size, context 128 per sequence. The cache is filled with zeros
// rather than prefilled: the timing depends on how much KV is read, not on its values, and
// prefilling 64 x 128 tokens would take longer than the whole benchmark.
Status BenchDecode(const Bench& b, const std::vector<int>& batches, std::mt19937& rng,
                   std::vector<Result>* results) {
  const ModelConfig& c = b.model.config();
  const int context = 128, steps = b.runs + 1;
  for (int batch : batches) {
    const int blocks_per_seq = (context + steps) / b.layout.block_size + 1;
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache,
                            KvCache::Create(b.layout, batch * blocks_per_seq));
    std::memset(cache->data(), 0, cache->total_bytes());
    std::vector<std::vector<int32_t>> tables(batch);
    std::vector<int32_t> next = RandomTokens(batch, c.vocab_size, rng);
    for (int i = 0; i < batch; ++i) (void)cache->blocks().Allocate(blocks_per_seq, &tables[i]);
    std::vector<SequenceInput> seqs(batch);
    std::vector<double> times;
    for (int s = 0; s < steps; ++s) {
      for (int i = 0; i < batch; ++i) seqs[i] = SequenceInput{{&next[i], 1}, context + s, tables[i]};
      const double t0 = Now();
      TANDEM_RETURN_IF_ERROR(b.engine.Forward(seqs, *cache).status());
      if (s > 0) times.push_back(Now() - t0);  // step 0 warms up
    }
    const double kv_bytes = static_cast<double>(batch) * (context + steps / 2) * c.num_layers * 2.0 *
                            c.kv_dim() * sizeof(float);
    const double bytes = static_cast<double>(b.model.step_weight_bytes()) + kv_bytes;
    const double flops = 2.0 * MatrixParams(c) * batch +
                         4.0 * c.num_layers * c.num_heads * c.head_dim * batch * context;
    results->push_back(MakeResult(b, "decode", batch, Median(times), bytes, flops));
  }
  return Status::Ok();
}

struct Plan {
  std::vector<int> threads, batches, prompts;
  std::vector<WeightDType> dtypes;
  int runs = 7;
};

Status BenchModel(const std::string& name, const std::string& dir, const Plan& plan,
                  const Roofline& roof, std::mt19937& rng, std::vector<Result>* results) {
  for (WeightDType dtype : plan.dtypes) {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Load(dir, {dtype}));
    ForwardOptions options;
    options.num_threads = roof.threads;
    options.max_batch_tokens = 2048;
    options.max_batch_sequences = 64;
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<CpuForward> engine, CpuForward::Create(*model, options));
    const KvLayout layout = engine->MakeKvLayout();
    const Bench b{name, *model, *engine, layout, roof, plan.runs};
    TANDEM_RETURN_IF_ERROR(BenchDecode(b, plan.batches, rng, results));
    TANDEM_RETURN_IF_ERROR(BenchPrefill(b, plan.prompts, rng, results));
  }
  return Status::Ok();
}

void WriteJson(const std::string& path, KernelIsa isa, const std::vector<Roofline>& roofs,
               const std::vector<Result>& results) {
  nlohmann::json out;
  out["timing"] = g_cpu_time ? "process_cpu" : "wall";
  out["kernel_isa"] = std::string(KernelIsaName(isa));
  for (const Roofline& r : roofs)
    out["rooflines"].push_back({{"threads", r.threads},
                                {"memcpy_bytes_per_s", r.memcpy_bandwidth},
                                {"read_bytes_per_s", r.bandwidth},
                                {"sgemm_flops_per_s", r.peak}});
  for (const Result& r : results) {
    const bool prefill = r.phase == "prefill";
    out["results"].push_back({{"model", r.model},
                              {"dtype", r.dtype},
                              {"threads", r.threads},
                              {"phase", r.phase},
                              {prefill ? "prompt_tokens" : "batch", r.tokens_or_batch},
                              {"tokens_per_s", r.tokens_per_s},
                              {prefill ? "flops_per_s" : "bytes_per_s", r.achieved},
                              {"roofline_fraction", r.roofline_fraction}});
  }
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f != nullptr) {
    std::fputs(out.dump(2).c_str(), f);
    std::fclose(f);
    std::printf("\nraw numbers: %s\n", path.c_str());
  }
}

// The table perf/README.md shows: one row per model, dtype and thread count.
void PrintMarkdown(const Plan& plan, const std::vector<Result>& results) {
  std::printf("\n| model | dtype | threads |");
  for (int b : plan.batches) std::printf(" decode %d |", b);
  for (int p : plan.prompts) std::printf(" prefill %d |", p);
  std::printf("\n|---|---|---|");
  for (size_t i = 0; i < plan.batches.size() + plan.prompts.size(); ++i) std::printf("---|");
  std::printf("\n");
  for (size_t i = 0; i < results.size();) {
    const Result& first = results[i];
    std::printf("| %s | %s | %d |", first.model.c_str(), first.dtype.c_str(), first.threads);
    for (; i < results.size() && results[i].model == first.model &&
           results[i].dtype == first.dtype && results[i].threads == first.threads;
         ++i)
      std::printf(" %.1f (%.0f%%) |", results[i].tokens_per_s, 100 * results[i].roofline_fraction);
    std::printf("\n");
  }
}

StatusOr<std::vector<int>> ParseInts(const std::string& flag, const std::string& text) {
  std::vector<int> out;
  for (size_t i = 0; i < text.size();) {
    const size_t comma = std::min(text.find(',', i), text.size());
    const std::string part = text.substr(i, comma - i);
    char* end = nullptr;
    const long v = std::strtol(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || v < 1 || v > 65536)
      return InvalidArgument("--" + flag + ": '" + part + "' is not a positive integer");
    out.push_back(static_cast<int>(v));
    i = comma + 1;
  }
  return out;
}

int Run(const std::vector<std::string>& args) {
  FlagParser flags("engine_bench [flags]", "CPU forward-pass throughput vs roofline.");
  flags.AddString("presets", "smollm2", "make-model presets to bench (comma-separated)");
  flags.AddString("model", "", "bench this checkpoint instead of presets");
  flags.AddString("threads", "1,2", "compute thread counts (comma-separated)");
  flags.AddString("dtypes", "float32,bfloat16", "weight storage dtypes (float32, bfloat16, float16)");
  flags.AddString("batches", "1,8,16,32,64", "decode batch sizes");
  flags.AddString("prompts", "512", "prefill prompt lengths");
  flags.AddInt("runs", 7, "timed passes per figure (the median is reported)");
  flags.AddString("json", "engine_bench.json", "raw numbers go here");
  flags.AddBool("cpu-time", "time with process CPU time instead of wall time (one thread only)");
  Plan plan;
  Status parsed = flags.Parse(args);
  if (parsed.ok() && !flags.help_requested()) {
    auto threads = ParseInts("threads", flags.GetString("threads"));
    auto batches = ParseInts("batches", flags.GetString("batches"));
    auto prompts = ParseInts("prompts", flags.GetString("prompts"));
    if (!threads.ok()) parsed = threads.status();
    else if (!batches.ok()) parsed = batches.status();
    else if (!prompts.ok()) parsed = prompts.status();
    else {
      plan.threads = *threads;
      plan.batches = *batches;
      plan.prompts = *prompts;
    }
    const std::string dtypes = flags.GetString("dtypes");
    for (size_t i = 0; parsed.ok() && i < dtypes.size();) {
      const size_t comma = std::min(dtypes.find(',', i), dtypes.size());
      const std::string name = dtypes.substr(i, comma - i);
      std::optional<WeightDType> d = ParseWeightDType(name);
      if (!d) parsed = InvalidArgument("--dtypes: '" + name + "' is not float32, bfloat16 or float16");
      else plan.dtypes.push_back(*d);
      i = comma + 1;
    }
    plan.runs = static_cast<int>(flags.GetInt("runs"));
    if (parsed.ok() && (plan.runs < 1 || plan.runs > 1000)) parsed = InvalidArgument("--runs must be in [1, 1000]");
    g_cpu_time = flags.GetBool("cpu-time");
    if (parsed.ok() && g_cpu_time &&
        std::any_of(plan.threads.begin(), plan.threads.end(), [](int t) { return t > 1; }))
      parsed = InvalidArgument("--cpu-time sums every thread's time: use it with --threads 1");
  }
  if (!parsed.ok() || flags.help_requested()) {
    std::fputs(parsed.ok() ? flags.Help().c_str() : (parsed.message() + "\n").c_str(),
               parsed.ok() ? stdout : stderr);
    return parsed.ok() ? 0 : 2;
  }
  StatusOr<KernelIsa> isa = KernelIsaFromEnv();
  if (!isa.ok()) {
    std::fprintf(stderr, "%s\n", isa.status().ToString().c_str());
    return 2;
  }
  std::printf("kernels: %s; timing: %s; figures: median of %d runs\n",
              std::string(KernelIsaName(*isa)).c_str(), g_cpu_time ? "CPU" : "wall", plan.runs);

  const std::filesystem::path tmp = std::filesystem::temp_directory_path() / "tandem-engine-bench";
  auto models = PrepareModels(flags.GetString("model"), flags.GetString("presets"), tmp);
  if (!models.ok()) {
    std::fprintf(stderr, "%s\n", models.status().ToString().c_str());
    return 1;
  }
  std::vector<Result> results;
  std::vector<Roofline> roofs;
  std::mt19937 rng(1);
  for (int threads : plan.threads) {
    const Roofline roof = MeasureRoofline(threads);
    roofs.push_back(roof);
    std::printf(
        "\nthreads %d: read %.2f GB/s, sgemm peak %.1f GFLOP/s (memcpy %.2f GB/s read+write, 1 "
        "thread)\n",
        threads, roof.bandwidth / 1e9, roof.peak / 1e9, roof.memcpy_bandwidth / 1e9);
    std::printf("%-8s %-9s %2s %-8s %6s %10s %16s %7s\n", "model", "dtype", "th", "phase", "n",
                "tokens/s", "achieved", "roofline");
    for (const auto& [name, dir] : *models) {
      if (Status s = BenchModel(name, dir, plan, roof, rng, &results); !s.ok()) {
        std::fprintf(stderr, "%s\n", s.ToString().c_str());
        return 1;
      }
    }
  }
  PrintMarkdown(plan, results);
  WriteJson(flags.GetString("json"), *isa, roofs, results);
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  return tandem::Run(std::vector<std::string>(argv + 1, argv + argc));
}
