#include "cluster/profile.h"

#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <thread>

#include "common/config/config.h"
#include "common/base/flags.h"
#include "common/engine/forward.h"
#include "common/engine/kv_cache.h"
#include "common/engine/latency_model.h"
#include "common/model/model.h"
#include "common/model/model_store.h"

namespace tandem {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::vector<int32_t> RandomTokens(int n, int vocab, std::mt19937& rng) {
  std::vector<int32_t> out(n);
  std::uniform_int_distribution<int> dist(0, vocab - 1);
  for (int32_t& t : out) t = dist(rng);
  return out;
}


// Median over `reps` of the mean time of `inner` calls. The first call chooses `inner` so that
// each rep lasts at least `min_rep_s` (tiny models run a step in microseconds, below the
// scheduler's noise on a shared machine); when one call is already that long it counts as the
// first rep (a profile of the medium model is minutes of forward passes: no call is wasted).
StatusOr<double> TimeIt(int reps, double min_rep_s, const auto& now, const auto& call) {
  double t0 = now(), wall0 = Now();
  TANDEM_RETURN_IF_ERROR(call());
  double first = std::max(now() - t0, 1e-7);
  // `inner` from wall time: a CPU clock of a step of microseconds is too coarse to divide by.
  const double first_wall = std::max(Now() - wall0, 1e-7);
  const int inner = std::clamp(static_cast<int>(std::ceil(min_rep_s / first_wall)), 1, 1000);
  std::vector<double> times;
  if (inner == 1) times.push_back(first);
  while (static_cast<int>(times.size()) < reps) {
    t0 = now();
    for (int i = 0; i < inner; ++i) TANDEM_RETURN_IF_ERROR(call());
    times.push_back((now() - t0) / inner);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

double CpuSeconds(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

// A busy neighbour, on one thread, until stopped, on its own KV. Kind decode: decode steps of
// a batch of 8 (the small-GEMM path: it never calls into OpenBLAS, whose thread count is
// process-wide and belongs to the measured forward); the neighbour a prefill instance has.
// Kind prefill: one 512-token prompt after another (compute-bound GEMMs through OpenBLAS, at
// the measured forward's thread count: use it with --threads 1); the neighbour a decode
// instance has in a 1-prefill-core + 1-decode-core cluster.
class Background {
 public:
  static constexpr int kBatch = 8;
  static constexpr int kContext = 512;
  static constexpr int kPrompt = 512;

  Status Start(const Model& model, int count, int block_size, bool prefill) {
    const int batch = prefill ? 1 : kBatch;
    const int tokens = prefill ? kPrompt : kContext + 1;
    for (int k = 0; k < count; ++k) {
      auto worker = std::make_unique<Worker>();
      ForwardOptions options;
      options.num_threads = 1;
      options.max_batch_tokens = prefill ? kPrompt : kBatch;
      options.max_batch_sequences = batch;
      TANDEM_ASSIGN_OR_RETURN(worker->forward, CpuForward::Create(model, options));
      const int per_seq = BlocksForTokens(tokens, block_size);
      TANDEM_ASSIGN_OR_RETURN(
          worker->cache,
          KvCache::Create(worker->forward->MakeKvLayout(block_size), batch * per_seq));
      worker->tables.resize(batch);
      for (auto& table : worker->tables) {
        table.reserve(per_seq);
        TANDEM_RETURN_IF_ERROR(worker->cache->blocks().Allocate(per_seq, &table));
      }
      workers_.push_back(std::move(worker));
    }
    for (auto& w : workers_) {
      Worker* worker = w.get();
      worker->thread = std::thread([this, worker, prefill] {
        int32_t token = 1;
        std::vector<int32_t> prompt(kPrompt, 1);
        std::vector<SequenceInput> batch;
        for (auto& table : worker->tables)
          batch.push_back(prefill ? SequenceInput{prompt, 0, table}
                                  : SequenceInput{{&token, 1}, kContext, table});
        while (!stop_.load(std::memory_order_relaxed)) {
          if (!worker->forward->Forward(batch, *worker->cache).ok()) break;
          ++worker->steps;
        }
      });
      worker->cpu_clock_ok = pthread_getcpuclockid(worker->thread.native_handle(),
                                                   &worker->cpu_clock) == 0;
    }
    return Status::Ok();
  }
  ~Background() {
    stop_ = true;
    for (auto& w : workers_)
      if (w->thread.joinable()) w->thread.join();
  }
  // CPU seconds the neighbour threads have used so far.
  double CpuSeconds() const {
    double total = 0;
    for (auto& w : workers_) total += w->cpu_clock_ok ? tandem::CpuSeconds(w->cpu_clock) : 0.0;
    return total;
  }
  int64_t steps() const {
    int64_t n = 0;
    for (auto& w : workers_) n += w->steps;
    return n;
  }

 private:
  struct Worker {
    std::unique_ptr<CpuForward> forward;
    std::unique_ptr<KvCache> cache;
    std::vector<std::vector<int32_t>> tables;
    std::thread thread;
    std::atomic<int64_t> steps{0};
    clockid_t cpu_clock{};
    bool cpu_clock_ok = false;
  };
  std::atomic<bool> stop_{false};
  std::vector<std::unique_ptr<Worker>> workers_;
};

// Best of a few copies of `bytes` between fresh buffers: bytes per second.
double MemcpyBytesPerSecond(size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    double t0 = Now();
    std::memcpy(b.data(), a.data(), bytes);
    best = std::min(best, Now() - t0);
    a[i] = b[bytes - 1 - i];  // keep the copies observable
  }
  return static_cast<double>(bytes) / std::max(best, 1e-9);
}

std::string HostAndDate() {
  char host[256] = "unknown";
  gethostname(host, sizeof host - 1);
  std::time_t t = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&t));
  return std::string(host) + ", " + date;
}

// The leading "# " comment lines of a file, without the "# ".
std::vector<std::string> LeadingComments(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] != '#') break;
    out.push_back(line.size() > 2 ? line.substr(2) : "");
  }
  return out;
}

struct Measured {
  int batch;
  int length;  // prompt length (prefill) or context per sequence (decode)
  double seconds;
};

void PrintTable(const char* phase, const char* length_name, const std::vector<Measured>& rows,
                const auto& predict) {
  std::printf("\n%-8s %6s %8s %12s %12s %8s\n", phase, "batch", length_name, "measured_ms",
              "predicted_ms", "error");
  for (const Measured& r : rows) {
    double p = predict(r);
    std::printf("%-8s %6d %8d %12.3f %12.3f %7.1f%%\n", phase, r.batch, r.length,
                r.seconds * 1e3, p * 1e3, 100.0 * (p - r.seconds) / r.seconds);
  }
}

}  // namespace

int ProfileMain(const std::vector<std::string>& args) {
  FlagParser flags(
      "tandem profile [--config FILE] [--model-preset P | --model-path DIR] [--threads N] "
      "[--out lm.yaml] [--append] [--role R] [--quick] [--background-threads K] [--reps R]",
      "Measures the wall-clock time of real forward passes (the engine's CpuForward over a paged "
      "KV cache, as the servers run them): prefill batches over a grid of batch size x prompt "
      "length and decode steps over batch size x context per sequence, median of R reps each. "
      "Fits the latency model of common/engine/latency_model.h (DistServe's form), prints measured vs "
      "predicted for every grid point and the fit quality, and writes the YAML (--append: "
      "merges this entry, keyed by device/threads/tp/pp/role, into an existing file).");
  flags.AddString("config", "", "cluster config (model section, kv_cache.block_size, max_model_len)");
  flags.AddString("model-preset", "", "built-in model preset (tiny|small|medium)");
  flags.AddString("model-path", "", "Hugging Face checkpoint directory");
  flags.AddInt("threads", 1, "compute threads of the measured forward pass");
  flags.AddString("out", "latency_model.yaml", "YAML file to write");
  flags.AddBool("append", "merge into --out instead of replacing it");
  flags.AddBool("quick", "a small grid (for tests, with the tiny/small models)");
  flags.AddInt("background-threads", 0,
               "extra threads working on their own KV while measuring (a busy neighbour)");
  flags.AddString("background-kind", "decode",
                  "what the neighbour runs: decode (steps of batch 8, context 512: a prefill "
                  "instance's neighbour), prefill (512-token prompts: a decode instance's "
                  "neighbour), or other (the other phase: decode while prefill is measured, "
                  "prefill while decode is measured, as each instance of a 1-prefill-core + "
                  "1-decode-core cluster has beside it); prefill and other need --threads 1");
  flags.AddString("role", "",
                  "write the entry for instances of this role only (prefill|decode|colocated; "
                  "default: any role). E.g. a colocated core beside another colocated one: "
                  "--role colocated --background-kind decode");
  flags.AddString("clock", "wall",
                  "wall: wall-clock time; cpu: CPU time of the measured forward (process CPU "
                  "minus the background threads', / --threads): on a machine shared with other "
                  "work it leaves out the time slices others take, keeps memory contention");
  flags.AddInt("reps", 3, "timed repetitions per grid point, the median is kept (--quick: 5)");
  flags.AddDouble("transfer-bytes-per-s", 0,
                  "KV link bandwidth to record (default: memcpy of a 1k-token KV here)");
  flags.AddDouble("transfer-latency-s", 0, "KV link latency per transfer to record");
  flags.AllowConfigOverrides();
  if (Status s = flags.Parse(args); !s.ok()) {
    std::fprintf(stderr, "tandem profile: %s\n", s.message().c_str());
    return kExitUsage;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  auto usage_error = [](const std::string& message) {
    std::fprintf(stderr, "tandem profile: %s\n", message.c_str());
    return kExitUsage;
  };
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "tandem profile: %s\n", s.message().c_str());
    return kExitFailure;
  };
  if (!flags.positional().empty()) return usage_error("unexpected argument " + flags.positional()[0]);
  const long threads = flags.GetInt("threads");
  const long background = flags.GetInt("background-threads");
  const long reps = flags.IsSet("reps") ? flags.GetInt("reps") : (flags.GetBool("quick") ? 5 : 3);
  const bool quick = flags.GetBool("quick");
  if (threads < 1 || threads > 1024) return usage_error("--threads must be in [1, 1024]");
  if (background < 0 || background > 64) return usage_error("--background-threads must be in [0, 64]");
  const std::string background_kind = flags.GetString("background-kind");
  if (background_kind != "decode" && background_kind != "prefill" && background_kind != "other")
    return usage_error("--background-kind must be decode|prefill|other, got '" + background_kind +
                       "'");
  // A prefilling neighbour runs OpenBLAS GEMMs, whose thread count is process-wide: it and the
  // measured forward must agree on it, so both run on one thread.
  if (background > 0 && background_kind != "decode" && threads != 1)
    return usage_error("--background-kind " + background_kind + " needs --threads 1");
  // What the neighbour runs while the prefill grid, then the decode grid, is measured.
  const bool prefill_neighbour_for_prefill = background_kind == "prefill";
  const bool prefill_neighbour_for_decode = background_kind != "decode";
  const std::string role = flags.GetString("role");
  if (!role.empty() && !IsLatencyModelRole(role))
    return usage_error("--role must be prefill|decode|colocated, got '" + role + "'");
  if (reps < 1 || reps > 100) return usage_error("--reps must be in [1, 100]");
  if (flags.GetDouble("transfer-bytes-per-s") < 0 || flags.GetDouble("transfer-latency-s") < 0)
    return usage_error("--transfer-* must not be negative");
  const std::string clock_name = flags.GetString("clock");
  if (clock_name != "wall" && clock_name != "cpu")
    return usage_error("--clock must be wall|cpu, got '" + clock_name + "'");
  const bool cpu_clock = clock_name == "cpu";
  if (flags.IsSet("model-preset") && flags.IsSet("model-path"))
    return usage_error("give at most one of --model-preset and --model-path");

  StatusOr<ClusterConfig> config = LoadConfig(flags.GetString("config"), flags.config_overrides());
  if (!config.ok()) return fail(config.status());
  ModelSection model_section = config->model;
  if (flags.IsSet("model-preset")) {
    const std::string& p = flags.GetString("model-preset");
    if (p != "tiny" && p != "small" && p != "medium")
      return usage_error("--model-preset must be tiny|small|medium, got '" + p + "'");
    model_section.preset = p;
    model_section.path.clear();
  }
  if (flags.IsSet("model-path")) model_section.path = flags.GetString("model-path");
  const std::string model_name =
      model_section.path.empty() ? model_section.preset : model_section.path;
  StatusOr<std::string> dir = ResolveModelDir(model_section);
  if (!dir.ok()) return fail(dir.status());
  StatusOr<std::unique_ptr<Model>> model = Model::Load(*dir);
  if (!model.ok()) return fail(model.status().WithContext(*dir));
  const ModelConfig& mc = (*model)->config();
  const int block_size = config->kv_cache.block_size;
  const int max_len = config->model.max_model_len;

  // The grid. Prefill: a batch of b prompts of length l, with b * l bounded so that the whole
  // profile fits its time budget (a prefill instance batches up to its token budget anyway).
  // Decode: b sequences each with ctx tokens of context, b * ctx bounded by the KV memory.
  std::vector<int> prefill_batches = {1, 2, 4, 8}, prefill_lengths = {16, 64, 128, 256, 512,
                                                                       1024, 1536};
  std::vector<int> decode_batches = {1, 2, 4, 8, 16, 32, 64}, decode_contexts = {16, 256, 768,
                                                                                  1536};
  int prefill_tokens_cap = 1024, decode_tokens_cap = 49152;
  if (quick) {
    prefill_batches = {1, 2, 4};
    prefill_lengths = {16, 64, 256, 512};
    decode_batches = {1, 4, 16};
    decode_contexts = {16, 256, 512};
    decode_tokens_cap = 8192;
  }
  std::vector<std::pair<int, int>> prefill_grid, decode_grid;
  int max_prefill_tokens = 1, max_decode_tokens = 0, max_decode_batch = 1;
  for (int l : prefill_lengths) {
    if (l > max_len) continue;
    for (int b : prefill_batches) {
      if (b > 1 && b * l > prefill_tokens_cap) continue;
      prefill_grid.push_back({b, l});
      max_prefill_tokens = std::max(max_prefill_tokens, b * l);
    }
  }
  for (int b : decode_batches) {
    for (int ctx : decode_contexts) {
      if (ctx + 1 > max_len || b * ctx > decode_tokens_cap) continue;
      decode_grid.push_back({b, ctx});
      max_decode_tokens = std::max(max_decode_tokens, b * BlocksForTokens(ctx + 1, block_size) * block_size);
      max_decode_batch = std::max(max_decode_batch, b);
    }
  }

  // The neighbour first: every CpuForward::Create sets OpenBLAS's (process-wide) thread count,
  // and the measured forward's must win.
  auto neighbour = std::make_unique<Background>();
  if (Status s = neighbour->Start(**model, static_cast<int>(background), block_size,
                                  prefill_neighbour_for_prefill);
      !s.ok())
    return fail(s);
  ForwardOptions options;
  options.num_threads = static_cast<int>(threads);
  options.max_batch_tokens = std::max(max_prefill_tokens, max_decode_batch);
  options.max_batch_sequences = std::max(max_decode_batch, 8);
  StatusOr<std::unique_ptr<CpuForward>> forward = CpuForward::Create(**model, options);
  if (!forward.ok()) return fail(forward.status());
  const KvLayout layout = (*forward)->MakeKvLayout(block_size);
  const int num_blocks =
      std::max(BlocksForTokens(max_prefill_tokens, block_size) + 8, max_decode_tokens / block_size + 8);
  StatusOr<std::unique_ptr<KvCache>> cache = KvCache::Create(layout, num_blocks);
  if (!cache.ok()) return fail(cache.status());
  KvCache& kv = **cache;
  const double kv_bytes_per_token =
      2.0 * mc.num_layers * mc.num_kv_heads * mc.head_dim * sizeof(float);

  std::printf("tandem profile: model %s (%s), %ld thread(s), %ld background thread(s), %ld reps, "
              "block %d, KV %.0f bytes/token, %s clock\n",
              model_name.c_str(), dir->c_str(), threads, background, reps, block_size,
              kv_bytes_per_token, clock_name.c_str());
  std::printf("grid: %zu prefill batches, %zu decode steps\n", prefill_grid.size(),
              decode_grid.size());
  std::fflush(stdout);
  const double started = Now();
  // Quick profiles run a tiny model whose steps take microseconds: longer reps keep the noise of
  // a shared machine down.
  const double min_rep_s = quick ? 0.05 : 0.02;
  std::mt19937 rng(1);
  auto now = [&]() {
    if (!cpu_clock) return Now();
    return (CpuSeconds(CLOCK_PROCESS_CPUTIME_ID) - neighbour->CpuSeconds()) /
           static_cast<double>(threads);
  };

  std::vector<Measured> prefill_rows, decode_rows;
  std::vector<PrefillSample> prefill_samples;
  std::vector<DecodeSample> decode_samples;
  for (auto [b, l] : prefill_grid) {
    std::vector<std::vector<int32_t>> tokens(b), tables(b);
    std::vector<SequenceInput> batch;
    for (int i = 0; i < b; ++i) {
      tokens[i] = RandomTokens(l, mc.vocab_size, rng);
      if (Status s = kv.blocks().Allocate(BlocksForTokens(l, block_size), &tables[i]); !s.ok())
        return fail(s);
      batch.push_back(SequenceInput{tokens[i], 0, tables[i]});
    }
    StatusOr<double> t = TimeIt(static_cast<int>(reps), min_rep_s, now, [&]() -> Status {
      return (*forward)->Forward(batch, kv).status();
    });
    for (auto& table : tables) kv.blocks().Free(table);
    if (!t.ok()) return fail(t.status());
    prefill_rows.push_back({b, l, *t});
    prefill_samples.push_back({double(b) * l, double(b) * l * l, *t});
  }
  const double prefill_done = Now();
  const int64_t prefill_neighbour_steps = neighbour->steps();
  if (prefill_neighbour_for_decode != prefill_neighbour_for_prefill) {
    // --background-kind other: the neighbour switches phase. (Its CpuForward sets OpenBLAS to
    // one thread, which the measured forward also uses: --threads 1 was checked above.)
    neighbour = std::make_unique<Background>();
    if (Status s = neighbour->Start(**model, static_cast<int>(background), block_size,
                                    prefill_neighbour_for_decode);
        !s.ok())
      return fail(s);
  }
  for (auto [b, ctx] : decode_grid) {
    // The KV of the context is never computed: a decode step's cost does not depend on the
    // values it attends over, only on how many there are.
    std::vector<std::vector<int32_t>> tables(b);
    std::vector<int32_t> next(b);
    std::vector<SequenceInput> batch;
    for (int i = 0; i < b; ++i) {
      if (Status s = kv.blocks().Allocate(BlocksForTokens(ctx + 1, block_size), &tables[i]); !s.ok())
        return fail(s);
      next[i] = static_cast<int32_t>(rng() % mc.vocab_size);
      batch.push_back(SequenceInput{{&next[i], 1}, ctx, tables[i]});
    }
    StatusOr<double> t = TimeIt(static_cast<int>(reps), min_rep_s, now, [&]() -> Status {
      return (*forward)->Forward(batch, kv).status();
    });
    for (auto& table : tables) kv.blocks().Free(table);
    if (!t.ok()) return fail(t.status());
    decode_rows.push_back({b, ctx, *t});
    decode_samples.push_back({double(b), double(b) * ctx, *t});
  }
  const double decode_done = Now();
  const int64_t decode_neighbour_steps =
      prefill_neighbour_for_decode != prefill_neighbour_for_prefill
          ? neighbour->steps()
          : neighbour->steps() - prefill_neighbour_steps;
  neighbour.reset();

  LatencyModel lm;
  lm.model = model_name;
  lm.device = "cpu";
  lm.threads = static_cast<int>(threads);
  lm.kv_bytes_per_token = kv_bytes_per_token;
  lm.max_batch_size = max_decode_batch;
  if (Status s = FitPrefill(prefill_samples, &lm); !s.ok()) return fail(s);
  if (Status s = FitDecode(decode_samples, &lm); !s.ok()) return fail(s);

  PrintTable("prefill", "prompt", prefill_rows, [&](const Measured& r) {
    return lm.PrefillSeconds(double(r.batch) * r.length, double(r.batch) * r.length * r.length);
  });
  PrintTable("decode", "context", decode_rows, [&](const Measured& r) {
    return lm.DecodeStepSeconds(r.batch, double(r.batch) * r.length);
  });
  std::printf("\nprefill s = %.6g + %.6g * sum(l) + %.6g * sum(l^2)   R^2 %.4f, max error %.1f%%\n",
              lm.c1, lm.c2, lm.c3, lm.fit.prefill_r2, 100 * lm.fit.prefill_max_rel_error);
  std::printf("decode  s = %.6g + %.6g * batch + %.6g * sum(context)   R^2 %.4f, max error %.1f%%\n",
              lm.c4, lm.c5, lm.c6, lm.fit.decode_r2, 100 * lm.fit.decode_max_rel_error);
  auto neighbour_work = [](bool prefill, int64_t steps) {
    return std::to_string(steps) + (prefill ? " prefills" : " decode steps");
  };
  std::printf("measured in %.1f s (prefill %.1f s, decode %.1f s)%s\n", decode_done - started,
              prefill_done - started, decode_done - prefill_done,
              background > 0
                  ? (", neighbour ran " +
                     neighbour_work(prefill_neighbour_for_prefill, prefill_neighbour_steps) +
                     " during the prefill grid, " +
                     neighbour_work(prefill_neighbour_for_decode, decode_neighbour_steps) +
                     " during the decode grid")
                        .c_str()
                  : "");

  // The KV link. Default: an in-process memcpy of a 1k-token KV, the ceiling of any transport.
  TransferModel transfer;
  bool transfer_given = flags.IsSet("transfer-bytes-per-s") || flags.IsSet("transfer-latency-s");
  transfer.latency_s = flags.GetDouble("transfer-latency-s");
  transfer.bytes_per_s = flags.IsSet("transfer-bytes-per-s")
                             ? flags.GetDouble("transfer-bytes-per-s")
                             : MemcpyBytesPerSecond(static_cast<size_t>(1024 * kv_bytes_per_token));

  const std::string out_path = flags.GetString("out");
  LatencyModelFile file;
  std::vector<std::string> comments;
  std::error_code ec;
  if (flags.GetBool("append") && std::filesystem::exists(out_path, ec)) {
    StatusOr<LatencyModelFile> old = LoadLatencyModel(out_path);
    if (!old.ok()) return fail(old.status().WithContext("--append"));
    file = std::move(*old);
    comments = LeadingComments(out_path);
    if (!transfer_given) transfer = file.transfer;  // the first profile's link stays
  } else {
    comments.push_back("written by tandem profile (common/engine/latency_model.h explains the form)");
  }
  lm.role = role;
  bool replaced = false;
  for (LatencyModel& e : file.entries) {
    if (e.device == lm.device && e.threads == lm.threads && e.role == lm.role &&
        e.tensor_parallel == lm.tensor_parallel && e.pipeline_parallel == lm.pipeline_parallel) {
      e = lm;
      replaced = true;
    }
  }
  if (!replaced) file.entries.push_back(lm);
  file.transfer = transfer;
  std::ostringstream note;
  note << "entry device=cpu threads=" << threads << (role.empty() ? "" : " role=" + role)
       << " (" << HostAndDate() << "): model " << model_name << ", " << reps << " reps per point, "
       << (quick ? "quick grid" : "full grid") << ", "
       << (cpu_clock ? "CPU time (process minus background threads, / threads)" : "wall clock")
       << ", ";
  auto neighbour_note = [&](bool prefill) {
    std::ostringstream n;
    n << background << " background thread(s) ";
    if (prefill)
      n << "prefilling (" << Background::kPrompt << "-token prompts)";
    else
      n << "decoding (batch " << Background::kBatch << ", context " << Background::kContext << ")";
    n << " on their own KV";
    return n.str();
  };
  if (background == 0)
    note << "no background load";
  else if (prefill_neighbour_for_prefill == prefill_neighbour_for_decode)
    note << neighbour_note(prefill_neighbour_for_decode) << " while measuring";
  else
    note << "prefill measured beside " << neighbour_note(prefill_neighbour_for_prefill)
         << ", decode beside " << neighbour_note(prefill_neighbour_for_decode);
  comments.push_back(note.str());
  if (!transfer_given && !flags.GetBool("append"))
    comments.push_back("transfer: bytes_per_s = in-process memcpy of a 1k-token KV here (" +
                       std::to_string(static_cast<long>(1024 * kv_bytes_per_token)) +
                       " bytes), latency_s = 0: the ceiling of any transport; pass "
                       "--transfer-bytes-per-s/--transfer-latency-s for a real link");
  std::string comment;
  for (const std::string& c : comments) comment += (comment.empty() ? "" : "\n") + c;
  std::string text = LatencyModelToYaml(file, comment);
  std::filesystem::path parent = std::filesystem::path(out_path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  std::ofstream out(out_path);
  out << text;
  out.close();
  if (!out) return fail(Internal("cannot write " + out_path));
  std::printf("wrote %s (%zu entr%s)\n", out_path.c_str(), file.entries.size(),
              file.entries.size() == 1 ? "y" : "ies");
  return kExitOk;
}

}  // namespace tandem
