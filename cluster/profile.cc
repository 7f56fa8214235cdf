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
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "common/base/flags.h"
#include "common/config/config.h"
#include "common/engine/forward.h"
#include "common/engine/kv_cache.h"
#include "common/engine/latency_model.h"
#include "common/model/model.h"
#include "common/model/model_store.h"

namespace tandem {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
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
      worker->cpu_clock_ok =
          pthread_getcpuclockid(worker->thread.native_handle(), &worker->cpu_clock) == 0;
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

// ---- parse ----

// What the flags ask for, checked.
struct ProfileOptions {
  bool help = false;  // --help: the help text is printed, nothing runs
  std::string help_text;
  std::string config_path;
  std::vector<std::string> config_overrides;
  std::string model_preset, model_path;  // empty = from the config
  long threads = 1;
  long background = 0;  // neighbour threads
  std::string background_kind = "decode";
  // What the neighbour runs while the prefill grid, then the decode grid, is measured.
  bool prefill_neighbour_for_prefill = false;
  bool prefill_neighbour_for_decode = false;
  std::string role;
  long reps = 3;
  bool quick = false;
  std::string clock_name = "wall";
  bool cpu_clock = false;
  bool transfer_given = false;  // --transfer-bytes-per-s or --transfer-latency-s set
  std::optional<double> transfer_bytes_per_s;
  double transfer_latency_s = 0;
  std::string out_path;
  bool append = false;
};

FlagParser ProfileFlags() {
  FlagParser flags(
      "tandem profile [--config FILE] [--model-preset P | --model-path DIR] [--threads N] "
      "[--out lm.yaml] [--append] [--role R] [--quick] [--background-threads K] [--reps R]",
      "Measures the wall-clock time of real forward passes (the engine's CpuForward over a paged "
      "KV cache, as the servers run them): prefill batches over a grid of batch size x prompt "
      "length and decode steps over batch size x context per sequence, median of R reps each. "
      "Fits the latency model of common/engine/latency_model.h (DistServe's form), prints "
      "measured vs predicted for every grid point and the fit quality, and writes the YAML "
      "(--append: merges this entry, keyed by device/threads/tp/pp/role, into an existing file).");
  flags.AddString("config", "",
                  "cluster config (model section, kv_cache.block_size, max_model_len)");
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
  return flags;
}

// InvalidArgument for a bad flag (the exit code is kExitUsage).
StatusOr<ProfileOptions> ParseProfileArgs(const std::vector<std::string>& args) {
  FlagParser flags = ProfileFlags();
  TANDEM_RETURN_IF_ERROR(flags.Parse(args));
  ProfileOptions o;
  if (flags.help_requested()) {
    o.help = true;
    o.help_text = flags.Help();
    return o;
  }
  if (!flags.positional().empty())
    return InvalidArgument("unexpected argument " + flags.positional()[0]);
  o.threads = flags.GetInt("threads");
  o.background = flags.GetInt("background-threads");
  o.quick = flags.GetBool("quick");
  o.reps = flags.IsSet("reps") ? flags.GetInt("reps") : (o.quick ? 5 : 3);
  if (o.threads < 1 || o.threads > 1024) return InvalidArgument("--threads must be in [1, 1024]");
  if (o.background < 0 || o.background > 64)
    return InvalidArgument("--background-threads must be in [0, 64]");
  o.background_kind = flags.GetString("background-kind");
  if (o.background_kind != "decode" && o.background_kind != "prefill" &&
      o.background_kind != "other")
    return InvalidArgument("--background-kind must be decode|prefill|other, got '" +
                           o.background_kind + "'");
  // A prefilling neighbour runs OpenBLAS GEMMs, whose thread count is process-wide: it and the
  // measured forward must agree on it, so both run on one thread.
  if (o.background > 0 && o.background_kind != "decode" && o.threads != 1)
    return InvalidArgument("--background-kind " + o.background_kind + " needs --threads 1");
  o.prefill_neighbour_for_prefill = o.background_kind == "prefill";
  o.prefill_neighbour_for_decode = o.background_kind != "decode";
  o.role = flags.GetString("role");
  if (!o.role.empty() && !IsLatencyModelRole(o.role))
    return InvalidArgument("--role must be prefill|decode|colocated, got '" + o.role + "'");
  if (o.reps < 1 || o.reps > 100) return InvalidArgument("--reps must be in [1, 100]");
  if (flags.GetDouble("transfer-bytes-per-s") < 0 || flags.GetDouble("transfer-latency-s") < 0)
    return InvalidArgument("--transfer-* must not be negative");
  o.transfer_given = flags.IsSet("transfer-bytes-per-s") || flags.IsSet("transfer-latency-s");
  if (flags.IsSet("transfer-bytes-per-s"))
    o.transfer_bytes_per_s = flags.GetDouble("transfer-bytes-per-s");
  o.transfer_latency_s = flags.GetDouble("transfer-latency-s");
  o.clock_name = flags.GetString("clock");
  if (o.clock_name != "wall" && o.clock_name != "cpu")
    return InvalidArgument("--clock must be wall|cpu, got '" + o.clock_name + "'");
  o.cpu_clock = o.clock_name == "cpu";
  if (flags.IsSet("model-preset") && flags.IsSet("model-path"))
    return InvalidArgument("give at most one of --model-preset and --model-path");
  if (flags.IsSet("model-preset")) {
    o.model_preset = flags.GetString("model-preset");
    if (o.model_preset != "tiny" && o.model_preset != "small" && o.model_preset != "medium")
      return InvalidArgument("--model-preset must be tiny|small|medium, got '" + o.model_preset +
                             "'");
  }
  if (flags.IsSet("model-path")) o.model_path = flags.GetString("model-path");
  o.config_path = flags.GetString("config");
  o.config_overrides = flags.config_overrides();
  o.out_path = flags.GetString("out");
  o.append = flags.GetBool("append");
  return o;
}

// ---- run ----

// The grid. Prefill: a batch of b prompts of length l, with b * l bounded so that the whole
// profile fits its time budget (a prefill instance batches up to its token budget anyway).
// Decode: b sequences each with ctx tokens of context, b * ctx bounded by the KV memory.
struct ProfileGrid {
  std::vector<std::pair<int, int>> prefill;  // (batch, prompt length)
  std::vector<std::pair<int, int>> decode;   // (batch, context per sequence)
  int max_prefill_tokens = 1, max_decode_tokens = 0, max_decode_batch = 1;
};

ProfileGrid MakeGrid(bool quick, int max_len, int block_size) {
  std::vector<int> prefill_batches = {1, 2, 4, 8};
  std::vector<int> prefill_lengths = {16, 64, 128, 256, 512, 1024, 1536};
  std::vector<int> decode_batches = {1, 2, 4, 8, 16, 32, 64};
  std::vector<int> decode_contexts = {16, 256, 768, 1536};
  int prefill_tokens_cap = 1024, decode_tokens_cap = 49152;
  if (quick) {
    prefill_batches = {1, 2, 4};
    prefill_lengths = {16, 64, 256, 512};
    decode_batches = {1, 4, 16};
    decode_contexts = {16, 256, 512};
    decode_tokens_cap = 8192;
  }
  ProfileGrid grid;
  for (int l : prefill_lengths) {
    if (l > max_len) continue;
    for (int b : prefill_batches) {
      if (b > 1 && b * l > prefill_tokens_cap) continue;
      grid.prefill.push_back({b, l});
      grid.max_prefill_tokens = std::max(grid.max_prefill_tokens, b * l);
    }
  }
  for (int b : decode_batches) {
    for (int ctx : decode_contexts) {
      if (ctx + 1 > max_len || b * ctx > decode_tokens_cap) continue;
      grid.decode.push_back({b, ctx});
      grid.max_decode_tokens =
          std::max(grid.max_decode_tokens, b * BlocksForTokens(ctx + 1, block_size) * block_size);
      grid.max_decode_batch = std::max(grid.max_decode_batch, b);
    }
  }
  return grid;
}

struct Measured {
  int batch;
  int length;  // prompt length (prefill) or context per sequence (decode)
  double seconds;
};

// What the measurement found, for the fit and the report.
struct ProfileRun {
  std::string model_name;
  std::string model_dir;
  int block_size = 0;
  double kv_bytes_per_token = 0;
  int max_decode_batch = 1;
  std::vector<Measured> prefill_rows, decode_rows;
  std::vector<PrefillSample> prefill_samples;
  std::vector<DecodeSample> decode_samples;
  double started = 0, prefill_done = 0, decode_done = 0;  // Now()
  int64_t prefill_neighbour_steps = 0, decode_neighbour_steps = 0;
};

// The loaded model, its forward pass and KV cache, the neighbour and the clock: what the grids
// are measured with.
struct ProfileBench {
  const ProfileOptions& options;
  const Model& model;
  CpuForward& forward;
  KvCache& kv;
  std::unique_ptr<Background>& neighbour;
  int block_size;
  std::mt19937 rng{1};
  // Quick profiles run a tiny model whose steps take microseconds: longer reps keep the noise
  // of a shared machine down.
  double min_rep_s() const { return options.quick ? 0.05 : 0.02; }
  double Now() const {
    if (!options.cpu_clock) return tandem::Now();
    return (CpuSeconds(CLOCK_PROCESS_CPUTIME_ID) - neighbour->CpuSeconds()) /
           static_cast<double>(options.threads);
  }
  StatusOr<double> Time(const std::vector<SequenceInput>& batch) {
    return TimeIt(
        static_cast<int>(options.reps), min_rep_s(), [this] { return Now(); },
        [&]() -> Status { return forward.Forward(batch, kv).status(); });
  }
};

Status MeasurePrefill(ProfileBench& bench, const ProfileGrid& grid, ProfileRun* run) {
  const int vocab = bench.model.config().vocab_size;
  for (auto [b, l] : grid.prefill) {
    std::vector<std::vector<int32_t>> tokens(b), tables(b);
    std::vector<SequenceInput> batch;
    for (int i = 0; i < b; ++i) {
      tokens[i] = RandomTokens(l, vocab, bench.rng);
      if (Status s = bench.kv.blocks().Allocate(BlocksForTokens(l, bench.block_size), &tables[i]);
          !s.ok())
        return s;
      batch.push_back(SequenceInput{tokens[i], 0, tables[i]});
    }
    StatusOr<double> t = bench.Time(batch);
    for (auto& table : tables) bench.kv.blocks().Free(table);
    if (!t.ok()) return t.status();
    run->prefill_rows.push_back({b, l, *t});
    run->prefill_samples.push_back({double(b) * l, double(b) * l * l, *t});
  }
  return Status::Ok();
}

Status MeasureDecode(ProfileBench& bench, const ProfileGrid& grid, ProfileRun* run) {
  const int vocab = bench.model.config().vocab_size;
  for (auto [b, ctx] : grid.decode) {
    // The KV of the context is never computed: a decode step's cost does not depend on the
    // values it attends over, only on how many there are.
    std::vector<std::vector<int32_t>> tables(b);
    std::vector<int32_t> next(b);
    std::vector<SequenceInput> batch;
    for (int i = 0; i < b; ++i) {
      if (Status s =
              bench.kv.blocks().Allocate(BlocksForTokens(ctx + 1, bench.block_size), &tables[i]);
          !s.ok())
        return s;
      next[i] = static_cast<int32_t>(bench.rng() % vocab);
      batch.push_back(SequenceInput{{&next[i], 1}, ctx, tables[i]});
    }
    StatusOr<double> t = bench.Time(batch);
    for (auto& table : tables) bench.kv.blocks().Free(table);
    if (!t.ok()) return t.status();
    run->decode_rows.push_back({b, ctx, *t});
    run->decode_samples.push_back({double(b), double(b) * ctx, *t});
  }
  return Status::Ok();
}

// Loads the model, starts the neighbour, measures the prefill grid, then the decode grid.
StatusOr<ProfileRun> RunProfile(const ProfileOptions& o) {
  TANDEM_ASSIGN_OR_RETURN(ClusterConfig config, LoadConfig(o.config_path, o.config_overrides));
  ModelSection model_section = config.model;
  if (!o.model_preset.empty()) {
    model_section.preset = o.model_preset;
    model_section.path.clear();
  }
  if (!o.model_path.empty()) model_section.path = o.model_path;
  ProfileRun run;
  run.model_name = model_section.path.empty() ? model_section.preset : model_section.path;
  TANDEM_ASSIGN_OR_RETURN(run.model_dir, ResolveModelDir(model_section));
  StatusOr<std::unique_ptr<Model>> model =
      Model::Load(run.model_dir, {ParseWeightDType(config.model.dtype)});
  if (!model.ok()) return model.status().WithContext(run.model_dir);
  run.block_size = config.kv_cache.block_size;
  const ProfileGrid grid = MakeGrid(o.quick, config.model.max_model_len, run.block_size);
  run.max_decode_batch = grid.max_decode_batch;

  // The neighbour first: every CpuForward::Create sets OpenBLAS's (process-wide) thread count,
  // and the measured forward's must win.
  auto neighbour = std::make_unique<Background>();
  TANDEM_RETURN_IF_ERROR(neighbour->Start(**model, static_cast<int>(o.background), run.block_size,
                                          o.prefill_neighbour_for_prefill));
  ForwardOptions options;
  options.num_threads = static_cast<int>(o.threads);
  options.max_batch_tokens = std::max(grid.max_prefill_tokens, grid.max_decode_batch);
  options.max_batch_sequences = std::max(grid.max_decode_batch, 8);
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<CpuForward> forward,
                          CpuForward::Create(**model, options));
  const KvLayout layout = forward->MakeKvLayout(run.block_size);
  const int num_blocks = std::max(BlocksForTokens(grid.max_prefill_tokens, run.block_size) + 8,
                                  grid.max_decode_tokens / run.block_size + 8);
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache, KvCache::Create(layout, num_blocks));
  run.kv_bytes_per_token =
      static_cast<double>(layout.block_bytes()) * layout.num_layers / layout.block_size;

  std::printf(
      "tandem profile: model %s (%s), %ld thread(s), %ld background thread(s), %ld reps, "
      "block %d, KV %.0f bytes/token, %s clock\n",
      run.model_name.c_str(), run.model_dir.c_str(), o.threads, o.background, o.reps,
      run.block_size, run.kv_bytes_per_token, o.clock_name.c_str());
  std::printf("grid: %zu prefill batches, %zu decode steps\n", grid.prefill.size(),
              grid.decode.size());
  std::fflush(stdout);
  run.started = Now();
  ProfileBench bench{o, **model, *forward, *cache, neighbour, run.block_size};
  TANDEM_RETURN_IF_ERROR(MeasurePrefill(bench, grid, &run));
  run.prefill_done = Now();
  run.prefill_neighbour_steps = neighbour->steps();
  const bool switch_phase = o.prefill_neighbour_for_decode != o.prefill_neighbour_for_prefill;
  if (switch_phase) {
    // --background-kind other: the neighbour switches phase. (Its CpuForward sets OpenBLAS to
    // one thread, which the measured forward also uses: --threads 1 was checked above.)
    neighbour = std::make_unique<Background>();
    TANDEM_RETURN_IF_ERROR(neighbour->Start(**model, static_cast<int>(o.background), run.block_size,
                                            o.prefill_neighbour_for_decode));
  }
  TANDEM_RETURN_IF_ERROR(MeasureDecode(bench, grid, &run));
  run.decode_done = Now();
  run.decode_neighbour_steps =
      switch_phase ? neighbour->steps() : neighbour->steps() - run.prefill_neighbour_steps;
  return run;
}

// ---- report ----

void PrintTable(const char* phase, const char* length_name, const std::vector<Measured>& rows,
                const auto& predict) {
  std::printf("\n%-8s %6s %8s %12s %12s %8s\n", phase, "batch", length_name, "measured_ms",
              "predicted_ms", "error");
  for (const Measured& r : rows) {
    double p = predict(r);
    std::printf("%-8s %6d %8d %12.3f %12.3f %7.1f%%\n", phase, r.batch, r.length, r.seconds * 1e3,
                p * 1e3, 100.0 * (p - r.seconds) / r.seconds);
  }
}

// Measured against predicted for every grid point, the fitted coefficients and the time taken.
void PrintFit(const ProfileOptions& o, const ProfileRun& run, const LatencyModel& lm) {
  PrintTable("prefill", "prompt", run.prefill_rows, [&](const Measured& r) {
    return lm.PrefillSeconds(double(r.batch) * r.length, double(r.batch) * r.length * r.length);
  });
  PrintTable("decode", "context", run.decode_rows, [&](const Measured& r) {
    return lm.DecodeStepSeconds(r.batch, double(r.batch) * r.length);
  });
  std::printf("\nprefill s = %.6g + %.6g * sum(l) + %.6g * sum(l^2)   R^2 %.4f, max error %.1f%%\n",
              lm.c1, lm.c2, lm.c3, lm.fit.prefill_r2, 100 * lm.fit.prefill_max_rel_error);
  std::printf(
      "decode  s = %.6g + %.6g * batch + %.6g * sum(context)   R^2 %.4f, max error %.1f%%\n", lm.c4,
      lm.c5, lm.c6, lm.fit.decode_r2, 100 * lm.fit.decode_max_rel_error);
  auto neighbour_work = [](bool prefill, int64_t steps) {
    return std::to_string(steps) + (prefill ? " prefills" : " decode steps");
  };
  std::printf("measured in %.1f s (prefill %.1f s, decode %.1f s)%s\n",
              run.decode_done - run.started, run.prefill_done - run.started,
              run.decode_done - run.prefill_done,
              o.background > 0
                  ? (", neighbour ran " +
                     neighbour_work(o.prefill_neighbour_for_prefill, run.prefill_neighbour_steps) +
                     " during the prefill grid, " +
                     neighbour_work(o.prefill_neighbour_for_decode, run.decode_neighbour_steps) +
                     " during the decode grid")
                        .c_str()
                  : "");
}

// The YAML comment line that says how this entry was measured.
std::string EntryNote(const ProfileOptions& o, const std::string& model_name) {
  std::ostringstream note;
  note << "entry device=cpu threads=" << o.threads << (o.role.empty() ? "" : " role=" + o.role)
       << " (" << HostAndDate() << "): model " << model_name << ", " << o.reps
       << " reps per point, " << (o.quick ? "quick grid" : "full grid") << ", "
       << (o.cpu_clock ? "CPU time (process minus background threads, / threads)" : "wall clock")
       << ", ";
  auto neighbour_note = [&](bool prefill) {
    std::ostringstream n;
    n << o.background << " background thread(s) ";
    if (prefill)
      n << "prefilling (" << Background::kPrompt << "-token prompts)";
    else
      n << "decoding (batch " << Background::kBatch << ", context " << Background::kContext << ")";
    n << " on their own KV";
    return n.str();
  };
  if (o.background == 0)
    note << "no background load";
  else if (o.prefill_neighbour_for_prefill == o.prefill_neighbour_for_decode)
    note << neighbour_note(o.prefill_neighbour_for_decode) << " while measuring";
  else
    note << "prefill measured beside " << neighbour_note(o.prefill_neighbour_for_prefill)
         << ", decode beside " << neighbour_note(o.prefill_neighbour_for_decode);
  return note.str();
}

// Writes (or, with --append, merges) the entry and the KV link into --out.
Status WriteProfile(const ProfileOptions& o, const ProfileRun& run, LatencyModel lm) {
  // The KV link. Default: an in-process memcpy of a 1k-token KV, the ceiling of any transport.
  TransferModel transfer;
  transfer.latency_s = o.transfer_latency_s;
  transfer.bytes_per_s =
      o.transfer_bytes_per_s
          ? *o.transfer_bytes_per_s
          : MemcpyBytesPerSecond(static_cast<size_t>(1024 * run.kv_bytes_per_token));
  LatencyModelFile file;
  std::vector<std::string> comments;
  std::error_code ec;
  if (o.append && std::filesystem::exists(o.out_path, ec)) {
    StatusOr<LatencyModelFile> old = LoadLatencyModel(o.out_path);
    if (!old.ok()) return old.status().WithContext("--append");
    file = std::move(*old);
    comments = LeadingComments(o.out_path);
    if (!o.transfer_given) transfer = file.transfer;  // the first profile's link stays
  } else {
    comments.push_back(
        "written by tandem profile (common/engine/latency_model.h explains the form)");
  }
  lm.role = o.role;
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
  comments.push_back(EntryNote(o, run.model_name));
  if (!o.transfer_given && !o.append)
    comments.push_back("transfer: bytes_per_s = in-process memcpy of a 1k-token KV here (" +
                       std::to_string(static_cast<long>(1024 * run.kv_bytes_per_token)) +
                       " bytes), latency_s = 0: the ceiling of any transport; pass "
                       "--transfer-bytes-per-s/--transfer-latency-s for a real link");
  std::string comment;
  for (const std::string& c : comments) comment += (comment.empty() ? "" : "\n") + c;
  std::string text = LatencyModelToYaml(file, comment);
  std::filesystem::path parent = std::filesystem::path(o.out_path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  std::ofstream out(o.out_path);
  out << text;
  out.close();
  if (!out) return Internal("cannot write " + o.out_path);
  std::printf("wrote %s (%zu entr%s)\n", o.out_path.c_str(), file.entries.size(),
              file.entries.size() == 1 ? "y" : "ies");
  return Status::Ok();
}

}  // namespace

int ProfileMain(const std::vector<std::string>& args) {
  StatusOr<ProfileOptions> options = ParseProfileArgs(args);
  if (!options.ok()) {
    std::fprintf(stderr, "tandem profile: %s\n", options.status().message().c_str());
    return kExitUsage;
  }
  if (options->help) {
    std::fputs(options->help_text.c_str(), stdout);
    return kExitOk;
  }
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "tandem profile: %s\n", s.message().c_str());
    return kExitFailure;
  };
  StatusOr<ProfileRun> run = RunProfile(*options);
  if (!run.ok()) return fail(run.status());
  LatencyModel lm;
  lm.model = run->model_name;
  lm.device = "cpu";
  lm.threads = static_cast<int>(options->threads);
  lm.kv_bytes_per_token = run->kv_bytes_per_token;
  lm.max_batch_size = run->max_decode_batch;
  if (Status s = FitPrefill(run->prefill_samples, &lm); !s.ok()) return fail(s);
  if (Status s = FitDecode(run->decode_samples, &lm); !s.ok()) return fail(s);
  PrintFit(*options, *run, lm);
  if (Status s = WriteProfile(*options, *run, lm); !s.ok()) return fail(s);
  return kExitOk;
}

}  // namespace tandem
