#include "perf/sweep.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "cluster/simulator.h"
#include "cluster/workload.h"
#include "common/config/config.h"
#include "common/base/flags.h"
#include "common/engine/latency_model.h"
#include "common/base/metrics.h"
#include "perf/bench_client.h"
#include "perf/bench_report.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

constexpr char kReadyPrefix[] = "tandem: ready at ";

int UsageError(const std::string& message) {
  std::fprintf(stderr, "tandem bench sweep: %s (see tandem bench sweep --help)\n", message.c_str());
  return kExitUsage;
}

// Removes every "--name V" / "--name=V" from args and returns the values in order (FlagParser
// keeps only the last value of a repeated flag).
StatusOr<std::vector<std::string>> TakeRepeated(std::vector<std::string>* args,
                                                const std::string& name) {
  std::vector<std::string> values, rest;
  const std::string flag = "--" + name;
  for (size_t i = 0; i < args->size(); ++i) {
    const std::string& arg = (*args)[i];
    if (arg == flag) {
      if (i + 1 >= args->size()) return InvalidArgument("flag " + flag + " needs a value");
      values.push_back((*args)[++i]);
    } else if (arg.rfind(flag + "=", 0) == 0) {
      values.push_back(arg.substr(flag.size() + 1));
    } else {
      rest.push_back(arg);
    }
  }
  *args = std::move(rest);
  return values;
}

std::vector<std::string> SplitComma(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

bool ParsePositive(const std::string& text, double* value) {
  char* end = nullptr;
  *value = std::strtod(text.c_str(), &end);
  return end != text.c_str() && *end == '\0' && std::isfinite(*value) && *value > 0;
}

bool SafeName(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

std::string RateLabel(double rate) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", rate);
  return buf;
}

// `tandem up CONFIG` as a child: its own process group, output to a log file.
class ClusterProcess {
 public:
  ClusterProcess() = default;
  ClusterProcess(const ClusterProcess&) = delete;
  ClusterProcess& operator=(const ClusterProcess&) = delete;
  ~ClusterProcess() { Stop(30); }

  Status Start(const std::string& binary, const std::string& config_path,
               const std::vector<std::string>& overrides, const std::string& log_path) {
    log_path_ = log_path;
    std::vector<std::string> argv_strings = {binary, "up", config_path};
    argv_strings.insert(argv_strings.end(), overrides.begin(), overrides.end());
    std::vector<char*> argv;
    for (std::string& s : argv_strings) argv.push_back(s.data());
    argv.push_back(nullptr);
    int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (log_fd < 0) return Unavailable(log_path + ": cannot write: " + std::strerror(errno));
    int null_fd = ::open("/dev/null", O_RDONLY);
    const pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid < 0) {
      ::close(log_fd);
      if (null_fd >= 0) ::close(null_fd);
      return Unavailable(std::string("fork: ") + std::strerror(errno));
    }
    if (pid == 0) {
      ::setpgid(0, 0);  // a terminal's Ctrl-C reaches the sweep; the launcher hears of it below
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // the sweep died: stop the cluster
      if (::getppid() != parent) ::_exit(127);
      ::dup2(log_fd, STDOUT_FILENO);
      ::dup2(log_fd, STDERR_FILENO);
      if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(log_fd);
    if (null_fd >= 0) ::close(null_fd);
    pid_ = pid;
    return Status::Ok();
  }

  // Waits for the launcher's ready line; returns it. Unavailable when the launcher exits
  // first, DeadlineExceeded after timeout_s.
  StatusOr<std::string> WaitReady(double timeout_s) {
    Clock::time_point deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                    std::chrono::duration<double>(timeout_s));
    for (;;) {
      std::ifstream log(log_path_);
      std::string line;
      while (std::getline(log, line))
        if (line.rfind(kReadyPrefix, 0) == 0) return line;
      int status = 0;
      if (pid_ > 0 && ::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return Unavailable("the cluster exited before it was ready (see " + log_path_ + ")");
      }
      if (Clock::now() >= deadline) {
        return DeadlineExceeded("the cluster was not ready after " + RateLabel(timeout_s) +
                                " s (see " + log_path_ + ")");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }

  // SIGTERM (the launcher drains the router, then stops the instances), SIGKILL after
  // timeout_s; the instances get SIGTERM from their parent-death signal then.
  void Stop(double timeout_s) {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    Clock::time_point deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                    std::chrono::duration<double>(timeout_s));
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (Clock::now() >= deadline) {
        std::fprintf(stderr, "tandem bench sweep: the cluster did not stop in %g s: SIGKILL\n",
                     timeout_s);
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  std::string log_path_;
};

// Runs `gnuplot SCRIPT` in `dir`, bounded; true on exit 0.
bool RunGnuplot(const std::string& dir, const std::string& script) {
  pid_t pid = ::fork();
  if (pid < 0) return false;
  if (pid == 0) {
    if (::chdir(dir.c_str()) != 0) ::_exit(127);
    ::execlp("gnuplot", "gnuplot", script.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  Clock::time_point deadline = Clock::now() + std::chrono::seconds(60);
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// The machine's decode speed during a run, as the router measures it: its
// tandem_router_decode_model_correction gauge (per decode/colocated instance, the recent decode
// forward passes over the latency model's prediction for the same batch and context,
// router/placement.h), sampled every interval_s while the run goes. A sample counts only when
// the cluster generated tokens since the previous one (the router's
// tandem_generation_tokens_total advanced): samples of an idle cluster would repeat the last
// run's value.
class SpeedSampler {
 public:
  SpeedSampler(const ServerUrl& url, double interval_s)
      : thread_([this, url, interval_s] { Loop(url, interval_s); }) {}
  ~SpeedSampler() { Stop(); }
  SpeedSampler(const SpeedSampler&) = delete;
  SpeedSampler& operator=(const SpeedSampler&) = delete;

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  // The mean of the counted samples over all instances (1 = as profiled, 1.2 = steps 20% slower
  // than the model), 0 when none counted; and how many counted.
  double Mean() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return counted_ > 0 ? sum_ / static_cast<double>(counted_) : 0.0;
  }
  int64_t Counted() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return counted_;
  }

 private:
  void Loop(const ServerUrl& url, double interval_s) {
    double last_tokens = -1;  // the previous sample's tokens generated; -1 before the first
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      lock.unlock();
      StatusOr<std::string> text = HttpGet(url, "/metrics", 2.0);
      lock.lock();
      if (text.ok()) {
        double tokens = 0;
        for (const auto& [labels, value] :
             ParseMetricSamples(*text, "tandem_generation_tokens_total"))
          tokens += value;
        if (last_tokens >= 0 && tokens > last_tokens) {
          for (const auto& [labels, value] :
               ParseMetricSamples(*text, "tandem_router_decode_model_correction")) {
            if (!std::isfinite(value) || value <= 0) continue;
            sum_ += value;
            ++counted_;
          }
        }
        last_tokens = tokens;
      }
      wake_.wait_for(lock, std::chrono::duration<double>(interval_s), [this] { return stop_; });
    }
  }

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  double sum_ = 0;
  int64_t counted_ = 0;
  std::thread thread_;  // last: starts once the members above exist
};

struct ClusterSpec {
  std::string name;
  std::string config_path;
  ClusterConfig config;
  int cores = 0;
  bool ran = false;  // started and measured
};

struct Point {
  std::string cluster, workload;
  double rate = 0;
  RunSummary measured;
  std::vector<RequestOutcome> outcomes;
  bool simulated = false;
  RunSummary simulated_summary;
  std::string simulated_error;
  // The machine's decode speed during the run (SpeedSampler; 0 = not measured) and the
  // simulation with decode at that speed (SimulationOptions::decode_time_scale).
  double measured_speed = 0;
  int64_t speed_samples = 0;
  bool simulated_at_speed = false;
  RunSummary simulated_at_speed_summary;
  std::string run_file;
};

std::string GnuplotQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

std::string FormatNumber(double v) {
  if (std::isnan(v)) return "NaN";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace

GoodputEstimate EstimateGoodput(const std::vector<double>& rates,
                                const std::vector<double>& attainments, double target) {
  GoodputEstimate e;
  const size_t n = std::min(rates.size(), attainments.size());
  e.lower_bound = n > 0;
  for (size_t i = 0; i < n; ++i) {
    if (attainments[i] >= target) {
      e.goodput = rates[i];
      e.crossing = rates[i];
      continue;
    }
    e.lower_bound = false;
    if (i > 0) {
      // Linear between the last passing point and this one.
      double a0 = attainments[i - 1], a1 = attainments[i];
      double r0 = rates[i - 1], r1 = rates[i];
      e.crossing = a0 > a1 ? r0 + (a0 - target) * (r1 - r0) / (a0 - a1) : r0;
    }
    break;
  }
  return e;
}

int SweepMain(const std::vector<std::string>& input_args) {
  std::vector<std::string> args = input_args;
  StatusOr<std::vector<std::string>> cluster_flags = TakeRepeated(&args, "cluster");
  if (!cluster_flags.ok()) return UsageError(cluster_flags.status().message());
  StatusOr<std::vector<std::string>> cores_flags = TakeRepeated(&args, "cores-per");
  if (!cores_flags.ok()) return UsageError(cores_flags.status().message());

  FlagParser flags(
      "tandem bench sweep --cluster NAME=CONFIG.yaml [--cluster ...] --workload W[,W2] "
      "--slo-ttft X --slo-tpot Y [flags]",
      "Starts each cluster (tandem up), raises the request rate until SLO attainment drops "
      "below the target, and reports goodput per cluster and per core, with plots.\n"
      "  --cluster NAME=CONFIG.yaml   a cluster to measure (repeat; the first is the baseline)\n"
      "  --cores-per NAME=K           cores of that cluster (default: sum of instances*threads)");
  flags.AddString("workload", "", "comma-separated workloads: " + WorkloadNameList());
  flags.AddDouble("slo-ttft", -1, "TTFT objective in seconds (0: not checked)");
  flags.AddDouble("slo-tpot", -1, "TPOT objective in seconds (0: not checked)");
  flags.AddString("rates", "0.25,0.5,1,2,4,8", "comma-separated request rates (req/s)");
  flags.AddInt("num-requests", 0, "requests per rate (default 100 unless --duration-s)");
  flags.AddDouble("duration-s", 0, "seconds of arrivals per rate instead of --num-requests");
  flags.AddDouble("target", 0.9, "SLO attainment target in (0, 1]");
  flags.AddInt("probe-down", 0,
               "when a cluster misses the target at the lowest rate, halve the rate up to this "
               "many times until it meets it (0: stop there, goodput 0)");
  flags.AddString("latency-model", "", "latency model YAML: simulate every run beside it");
  flags.AddString("out-dir", "sweep", "where the runs, sweep.json and the plots go");
  flags.AddString("binary", "/proc/self/exe", "the tandem binary that runs `up`");
  flags.AddInt("seed", 1, "workload seed (the same at every rate and for every cluster)");
  flags.AddDouble("slo-scale-rate", 0,
                  "rate of the SLO-scale plot (default: the highest rate every cluster ran)");
  flags.AddDouble("ready-timeout-s", 600, "wait at most this long for a cluster to be ready");
  flags.AddDouble("stop-timeout-s", 60, "SIGKILL a cluster that has not stopped after this");
  flags.AddDouble("request-timeout-s", 600, "per request, connect to the end of the stream");
  flags.AddInt("max-token-id", 1000, "synthetic prompt ids are below this (and >= 100)");
  flags.AddInt("max-model-len", 0,
               "scale of the workload lengths (cluster/workload.h); 0 = each config's "
               "model.max_model_len");
  if (Status s = flags.Parse(args); !s.ok()) return UsageError(s.message());
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  if (!flags.positional().empty())
    return UsageError("unexpected argument '" + flags.positional()[0] + "'");

  // ---- flags ----
  if (cluster_flags->empty()) return UsageError("--cluster: at least one NAME=CONFIG.yaml");
  std::vector<ClusterSpec> clusters;
  for (const std::string& value : *cluster_flags) {
    size_t eq = value.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == value.size())
      return UsageError("--cluster: expected NAME=CONFIG.yaml, got '" + value + "'");
    ClusterSpec spec;
    spec.name = value.substr(0, eq);
    spec.config_path = fs::absolute(value.substr(eq + 1)).string();
    if (!SafeName(spec.name))
      return UsageError("--cluster: NAME may hold letters, digits, '-', '_', '.', got '" +
                        spec.name + "'");
    for (const ClusterSpec& other : clusters)
      if (other.name == spec.name) return UsageError("--cluster: '" + spec.name + "' twice");
    clusters.push_back(std::move(spec));
  }
  std::map<std::string, int> cores_per;
  for (const std::string& value : *cores_flags) {
    size_t eq = value.find('=');
    double k = 0;
    if (eq == std::string::npos || !ParsePositive(value.substr(eq + 1), &k) || k != std::floor(k))
      return UsageError("--cores-per: expected NAME=K with K a positive integer, got '" + value +
                        "'");
    std::string name = value.substr(0, eq);
    if (std::none_of(clusters.begin(), clusters.end(),
                     [&](const ClusterSpec& c) { return c.name == name; }))
      return UsageError("--cores-per: no --cluster named '" + name + "'");
    cores_per[name] = static_cast<int>(k);
  }
  std::vector<std::string> workloads = SplitComma(flags.GetString("workload"));
  if (workloads.empty()) return UsageError("--workload: required (" + WorkloadNameList() + ")");
  for (const std::string& w : workloads)
    if (StatusOr<WorkloadShape> shape = WorkloadShapeByName(w); !shape.ok())
      return UsageError("--workload: " + shape.status().message());
  std::vector<double> rates;
  for (const std::string& r : SplitComma(flags.GetString("rates"))) {
    double rate = 0;
    if (!ParsePositive(r, &rate))
      return UsageError("--rates: each rate must be a number > 0, got '" + r + "'");
    rates.push_back(rate);
  }
  if (rates.empty()) return UsageError("--rates: at least one rate");
  const long probe_down = flags.GetInt("probe-down");
  if (probe_down < 0 || probe_down > 10) return UsageError("--probe-down must be in [0, 10]");
  std::sort(rates.begin(), rates.end());
  rates.erase(std::unique(rates.begin(), rates.end()), rates.end());
  const double slo_ttft = flags.GetDouble("slo-ttft"), slo_tpot = flags.GetDouble("slo-tpot");
  if (!flags.IsSet("slo-ttft") || !(slo_ttft >= 0))
    return UsageError("--slo-ttft: required, seconds >= 0");
  if (!flags.IsSet("slo-tpot") || !(slo_tpot >= 0))
    return UsageError("--slo-tpot: required, seconds >= 0");
  const double target = flags.GetDouble("target");
  if (!(target > 0 && target <= 1))
    return UsageError("--target: must be in (0, 1], got " + RateLabel(target));
  long num_requests = flags.GetInt("num-requests");
  const double duration = flags.GetDouble("duration-s");
  if (num_requests < 0)
    return UsageError("--num-requests: must be >= 1, got " + std::to_string(num_requests));
  if (!(duration >= 0 && std::isfinite(duration)))
    return UsageError("--duration-s: must be >= 0, got " + RateLabel(duration));
  if (num_requests > 0 && duration > 0)
    return UsageError("--num-requests: give only one of --num-requests and --duration-s");
  if (num_requests == 0 && duration == 0) num_requests = 100;
  const long seed = flags.GetInt("seed");
  if (seed < 0) return UsageError("--seed: must be >= 0");
  const double ready_timeout = flags.GetDouble("ready-timeout-s");
  const double stop_timeout = flags.GetDouble("stop-timeout-s");
  const double request_timeout = flags.GetDouble("request-timeout-s");
  if (!(ready_timeout > 0)) return UsageError("--ready-timeout-s: must be > 0");
  if (!(stop_timeout > 0)) return UsageError("--stop-timeout-s: must be > 0");
  if (!(request_timeout > 0)) return UsageError("--request-timeout-s: must be > 0");
  const long max_token_id = flags.GetInt("max-token-id");
  if (max_token_id < 101 || max_token_id > (1L << 30))
    return UsageError("--max-token-id: must be > 100");
  const long workload_len = flags.GetInt("max-model-len");
  if (workload_len < 0 || workload_len > (1L << 24))
    return UsageError("--max-model-len: must be >= 0");
  const double slo_scale_rate = flags.GetDouble("slo-scale-rate");
  if (flags.IsSet("slo-scale-rate") &&
      std::find(rates.begin(), rates.end(), slo_scale_rate) == rates.end())
    return UsageError("--slo-scale-rate: must be one of --rates, got " + RateLabel(slo_scale_rate));
  std::string binary = flags.GetString("binary");
  if (binary == "/proc/self/exe") {
    std::error_code ec;
    fs::path self = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) binary = self.string();
  }
  if (::access(binary.c_str(), X_OK) != 0)
    return UsageError("--binary: '" + binary + "' is not an executable");

  // The SLOs the clusters' routers run with (admission, goodput placement) and the simulator
  // sees: the sweep's; "not checked" (0) becomes an objective nothing misses (the config needs one).
  const double router_ttft = slo_ttft > 0 ? slo_ttft : 3600;
  const double router_tpot = slo_tpot > 0 ? slo_tpot : 3600;

  // ---- configs and the latency model: all checked before anything starts ----
  bool configs_ok = true;
  for (ClusterSpec& spec : clusters) {
    StatusOr<ClusterConfig> config = LoadConfig(spec.config_path);
    if (!config.ok()) {
      std::fprintf(stderr, "tandem bench sweep: --cluster %s: %s\n", spec.name.c_str(),
                   config.status().message().c_str());
      configs_ok = false;
      continue;
    }
    spec.config = *config;
    // The router admits and places by the sweep's SLOs (the simulator too), not the config's.
    spec.config.slo.ttft_s = router_ttft;
    spec.config.slo.tpot_s = router_tpot;
    spec.config.slo.classes.clear();
    if (workload_len > 0 && workload_len > spec.config.model.max_model_len) {
      std::fprintf(stderr,
                   "tandem bench sweep: --max-model-len %ld exceeds %s's model.max_model_len %d\n",
                   workload_len, spec.name.c_str(), spec.config.model.max_model_len);
      configs_ok = false;
    }
    int cores = 0;
    for (const InstanceSection* s : {&config->prefill, &config->decode, &config->colocated})
      cores += s->instances * s->threads;
    spec.cores = cores_per.count(spec.name) ? cores_per[spec.name] : cores;
  }
  if (!configs_ok) return kExitFailure;
  std::optional<LatencyModelFile> latency_model;
  if (const std::string& path = flags.GetString("latency-model"); !path.empty()) {
    StatusOr<LatencyModelFile> loaded = LoadLatencyModel(path);
    if (!loaded.ok()) {
      std::fprintf(stderr, "tandem bench sweep: --latency-model: %s\n",
                   loaded.status().message().c_str());
      return kExitFailure;
    }
    latency_model = std::move(*loaded);
  }
  const std::string out_dir = flags.GetString("out-dir");
  {
    std::error_code ec;
    fs::create_directories(out_dir, ec);
    if (ec) {
      std::fprintf(stderr, "tandem bench sweep: --out-dir: cannot create %s: %s\n", out_dir.c_str(),
                   ec.message().c_str());
      return kExitFailure;
    }
  }
  const Slo slo{slo_ttft, slo_tpot};
  // Every cluster runs with the sweep's SLOs (router admission and the goodput policy use
  // them) and, with --latency-model, with that model in its router: what is simulated is what
  // runs.
  std::vector<std::string> cluster_overrides = {
      "--slo.ttft_s=" + FormatNumber(router_ttft), "--slo.tpot_s=" + FormatNumber(router_tpot)};
  if (latency_model) {
    const std::string path = fs::absolute(flags.GetString("latency-model")).string();
    cluster_overrides.push_back("--router.latency_model=" + path);
    for (ClusterSpec& spec : clusters) spec.config.router.latency_model = path;  // simulated too
  }
  auto path_in = [&](const std::string& file) { return (fs::path(out_dir) / file).string(); };

  json sweep_config = {{"clusters", json::array()},
                       {"workloads", workloads},
                       {"rates", rates},
                       {"num_requests", num_requests},
                       {"duration_s", duration},
                       {"seed", seed},
                       {"target", target},
                       {"slo_ttft_s", slo_ttft},
                       {"slo_tpot_s", slo_tpot},
                       {"latency_model", flags.GetString("latency-model")},
                       {"binary", binary},
                       {"started_at", UtcTimestamp()}};
  for (const ClusterSpec& spec : clusters)
    sweep_config["clusters"].push_back(
        {{"name", spec.name}, {"config", spec.config_path}, {"cores", spec.cores}});

  // ---- the runs ----
  std::vector<Point> points;
  bool all_ran = true;
  for (ClusterSpec& spec : clusters) {
    std::printf("== %s (%s, %d cores): starting\n", spec.name.c_str(), spec.config_path.c_str(),
                spec.cores);
    std::fflush(stdout);
    ClusterProcess process;
    const std::string log_path = path_in(spec.name + ".log");
    Status started = process.Start(binary, spec.config_path, cluster_overrides, log_path);
    StatusOr<std::string> ready =
        started.ok() ? process.WaitReady(ready_timeout) : StatusOr<std::string>(started);
    std::string url_text, model;
    if (ready.ok()) {
      // "tandem: ready at http://HOST:PORT (model NAME)"
      std::string rest = ready->substr(std::strlen(kReadyPrefix));
      size_t space = rest.find(" (model ");
      url_text = rest.substr(0, space);
      if (space != std::string::npos) {
        model = rest.substr(space + 8);
        if (!model.empty() && model.back() == ')') model.pop_back();
      }
    }
    StatusOr<ServerUrl> url =
        ready.ok() ? ParseServerUrl(url_text) : StatusOr<ServerUrl>(ready.status());
    if (!url.ok()) {
      std::fprintf(stderr, "tandem bench sweep: %s: %s\n", spec.name.c_str(),
                   url.status().message().c_str());
      process.Stop(stop_timeout);
      all_ran = false;
      continue;
    }
    std::printf("== %s: ready at %s (model %s)\n", spec.name.c_str(), url_text.c_str(),
                model.c_str());
    std::fflush(stdout);

    LoadOptions options;
    options.url = *url;
    options.model = model;
    options.request_timeout_s = request_timeout;
    options.seed = static_cast<uint64_t>(seed);
    options.max_token_id = static_cast<int32_t>(max_token_id);
    options.duration_s = duration;
    options.progress = ::isatty(STDERR_FILENO);
    bool cluster_ok = true;
    for (const std::string& workload : workloads) {
      // Runs one rate. kNoRequests: the workload has none at this rate (this workload's sweep
      // ends); kClusterFailed: the load could not run (this cluster's sweep ends).
      enum class RateOutcome { kMet, kMissed, kNoRequests, kClusterFailed };
      auto run_rate = [&](double rate) -> RateOutcome {
        StatusOr<std::vector<WorkloadRequest>> requests =
            SyntheticRequests(workload, rate, num_requests, duration, static_cast<uint64_t>(seed),
                              workload_len > 0 ? static_cast<int32_t>(workload_len)
                                             : spec.config.model.max_model_len);
        if (!requests.ok() || requests->empty()) {
          std::fprintf(stderr, "tandem bench sweep: %s %s rate %g: no requests\n",
                       spec.name.c_str(), workload.c_str(), rate);
          return RateOutcome::kNoRequests;
        }
        SpeedSampler speed(*url, 1.0);
        StatusOr<LoadResult> result = RunLoad(options, *requests);
        speed.Stop();
        if (!result.ok()) {
          std::fprintf(stderr, "tandem bench sweep: %s: %s\n", spec.name.c_str(),
                       result.status().message().c_str());
          return RateOutcome::kClusterFailed;
        }
        Point point;
        point.cluster = spec.name;
        point.workload = workload;
        point.rate = rate;
        point.outcomes = result->outcomes;
        point.measured = Summarize(result->outcomes, slo, result->duration_s);
        point.run_file = spec.name + "_" + workload + "_r" + RateLabel(rate) + ".json";
        point.measured_speed = speed.Mean();
        point.speed_samples = speed.Counted();

        json record = {{"config",
                        {{"cluster", spec.name},
                         {"cluster_config", spec.config_path},
                         {"url", url_text},
                         {"model", model},
                         {"max_model_len", spec.config.model.max_model_len},
                         {"workload_max_model_len", workload_len > 0
                                                        ? static_cast<int>(workload_len)
                                                        : spec.config.model.max_model_len},
                         {"workload", workload},
                         {"seed", seed},
                         {"rate", rate},
                         {"num_requests", requests->size()},
                         {"duration_s", duration},
                         {"slo_ttft_s", slo_ttft},
                         {"slo_tpot_s", slo_tpot}}},
                       {"summary", SummaryToJson(point.measured)},
                       {"requests", OutcomesToJson(result->outcomes, result->max_tokens)}};
        if (latency_model) {
          // Same requests, same arrivals and lengths: the workload as generated.
          StatusOr<SimulationResult> sim = Simulate(spec.config, *latency_model, *requests,
                                                ServerLikeSimulationOptions());
          if (sim.ok()) {
            point.simulated = true;
            point.simulated_summary = Summarize(sim->outcomes, slo, sim->makespan_s);
            record["simulated"] = {{"summary", SummaryToJson(point.simulated_summary)},
                                   {"requests", OutcomesToJson(sim->outcomes, {})}};
          } else {
            point.simulated_error = sim.status().message();
            record["simulated"] = {{"error", point.simulated_error}};
            std::fprintf(stderr, "tandem bench sweep: simulate %s %s rate %g: %s\n",
                         spec.name.c_str(), workload.c_str(), rate, point.simulated_error.c_str());
          }
          // Again with decode at the speed the router measured during the run (it measures
          // decode steps only; prefill stays as profiled): what the simulator predicts once the
          // machine's drift from its profile is known.
          if (sim.ok() && point.measured_speed > 0) {
            SimulationOptions at_speed = ServerLikeSimulationOptions();
            at_speed.decode_time_scale = point.measured_speed;
            StatusOr<SimulationResult> scaled =
                Simulate(spec.config, *latency_model, *requests, at_speed);
            if (scaled.ok()) {
              point.simulated_at_speed = true;
              point.simulated_at_speed_summary =
                  Summarize(scaled->outcomes, slo, scaled->makespan_s);
              record["simulated_at_measured_speed"] = {
                  {"decode_time_scale", point.measured_speed},
                  {"summary", SummaryToJson(point.simulated_at_speed_summary)},
                  {"requests", OutcomesToJson(scaled->outcomes, {})}};
            }
          }
        }
        record["measured_speed"] = {{"decode_model_correction", point.measured_speed},
                                    {"samples", point.speed_samples}};
        if (Status s = WriteTextFile(path_in(point.run_file), record.dump(1) + "\n"); !s.ok())
          std::fprintf(stderr, "tandem bench sweep: %s\n", s.message().c_str());
        const RunSummary& m = point.measured;
        std::printf(
            "%-14s %-14s rate %-6g  attainment %5.1f%% (TTFT %5.1f%%, TPOT %5.1f%%)  "
            "done %lld/%lld  TTFT p90 %.3f s  TPOT p90 %.4f s",
            spec.name.c_str(), workload.c_str(), rate, 100 * m.attainment, 100 * m.ttft_attainment,
            100 * m.tpot_attainment, static_cast<long long>(m.completed),
            static_cast<long long>(m.requests), m.ttft_p90, m.tpot_p90);
        if (point.simulated)
          std::printf("  simulated %5.1f%%", 100 * point.simulated_summary.attainment);
        if (point.simulated_at_speed)
          std::printf(" (at measured speed x%.3f: %5.1f%%)", point.measured_speed,
                      100 * point.simulated_at_speed_summary.attainment);
        std::printf("\n");
        std::fflush(stdout);
        const bool below = m.attainment < target;
        points.push_back(std::move(point));
        return below ? RateOutcome::kMissed : RateOutcome::kMet;
      };
      const size_t first_point = points.size();
      bool met_any = false;
      for (double rate : rates) {
        RateOutcome outcome = run_rate(rate);
        if (outcome == RateOutcome::kMet) {
          met_any = true;
          continue;
        }
        // The first rate already misses: goodput is below every rate asked for. Halve the
        // rate until one meets the target (at most --probe-down times).
        double lower = rate;
        for (long k = 0; outcome == RateOutcome::kMissed && !met_any && k < probe_down; ++k) {
          lower /= 2;
          std::printf("%-14s %-14s rate %g missed the target: probing %g\n", spec.name.c_str(),
                      workload.c_str(), rate, lower);
          outcome = run_rate(lower);
          met_any = outcome == RateOutcome::kMet;
        }
        cluster_ok = outcome != RateOutcome::kClusterFailed;
        break;
      }
      // Probes ran after the rate above them: keep each cluster's points in ascending rates.
      std::stable_sort(points.begin() + static_cast<std::ptrdiff_t>(first_point), points.end(),
                       [](const Point& x, const Point& y) { return x.rate < y.rate; });
      if (!cluster_ok) break;
    }
    process.Stop(stop_timeout);
    spec.ran = cluster_ok;
    all_ran = all_ran && cluster_ok;
    std::printf("== %s: stopped\n", spec.name.c_str());
    std::fflush(stdout);
  }

  // ---- goodput ----
  struct GoodputRow {
    std::string cluster, workload;
    GoodputEstimate estimate;
    int cores = 0;
    double per_core = 0;
    double ratio = NAN;  // per-core goodput / the first cluster's
    bool measured = false;
  };
  std::vector<GoodputRow> rows;
  for (const std::string& workload : workloads) {
    double base_per_core = NAN;
    for (size_t c = 0; c < clusters.size(); ++c) {
      std::vector<double> r, a;  // ascending rates (points are kept so)
      for (const Point& p : points)
        if (p.cluster == clusters[c].name && p.workload == workload) {
          r.push_back(p.rate);
          a.push_back(p.measured.attainment);
        }
      GoodputRow row;
      row.cluster = clusters[c].name;
      row.workload = workload;
      row.measured = !r.empty();
      row.estimate = EstimateGoodput(r, a, target);
      row.cores = clusters[c].cores;
      row.per_core = row.cores > 0 ? row.estimate.goodput / row.cores : 0;
      if (c == 0 && row.measured) base_per_core = row.per_core;
      if (row.measured && base_per_core > 0) row.ratio = row.per_core / base_per_core;
      rows.push_back(row);
    }
  }

  // ---- SLO scale: rescoring each cluster's run at one rate ----
  const std::vector<double> scales = {0.25, 0.354, 0.5, 0.707, 1, 1.414, 2, 2.83, 4};
  json slo_scale = json::array();
  std::map<std::string, double> scale_rate_of;  // workload -> rate used
  for (const std::string& workload : workloads) {
    double chosen = 0;
    if (flags.IsSet("slo-scale-rate")) {
      chosen = slo_scale_rate;
    } else {
      // The highest rate that every cluster which ran this workload measured.
      for (double rate : rates) {
        bool everyone = true, anyone = false;
        for (const ClusterSpec& spec : clusters) {
          bool has = false, ran = false;
          for (const Point& p : points)
            if (p.cluster == spec.name && p.workload == workload) {
              ran = true;
              has = has || p.rate == rate;
            }
          if (ran && !has) everyone = false;
          anyone = anyone || has;
        }
        if (everyone && anyone) chosen = rate;
      }
    }
    if (chosen <= 0) continue;
    scale_rate_of[workload] = chosen;
    json curves = json::object();
    for (const Point& p : points) {
      if (p.workload != workload || p.rate != chosen) continue;
      json curve = json::array();
      for (double s : scales) {
        RunSummary rescored = Summarize(p.outcomes, Slo{slo_ttft * s, slo_tpot * s});
        curve.push_back({{"scale", s}, {"attainment", rescored.attainment}});
      }
      curves[p.cluster] = curve;
    }
    slo_scale.push_back({{"workload", workload}, {"rate", chosen}, {"curves", curves}});
  }

  // ---- sweep.json ----
  json points_json = json::array();
  for (const Point& p : points) {
    json j = {{"cluster", p.cluster},
              {"workload", p.workload},
              {"rate", p.rate},
              {"run_file", p.run_file},
              {"measured", SummaryToJson(p.measured)},
              {"simulated", p.simulated ? SummaryToJson(p.simulated_summary) : json(nullptr)}};
    if (!p.simulated_error.empty()) j["simulated_error"] = p.simulated_error;
    j["measured_speed"] = p.measured_speed > 0 ? json(p.measured_speed) : json(nullptr);
    j["simulated_at_measured_speed"] =
        p.simulated_at_speed ? SummaryToJson(p.simulated_at_speed_summary) : json(nullptr);
    points_json.push_back(j);
  }
  json goodput_json = json::array();
  for (const GoodputRow& row : rows) {
    goodput_json.push_back(
        {{"cluster", row.cluster},
         {"workload", row.workload},
         {"measured", row.measured},
         {"goodput_rps", row.estimate.goodput},
         {"crossing_rps", row.estimate.crossing},
         {"lower_bound", row.estimate.lower_bound},
         {"cores", row.cores},
         {"goodput_per_core", row.per_core},
         {"ratio_vs_first", std::isnan(row.ratio) ? json(nullptr) : json(row.ratio)}});
  }
  json sweep = {{"config", sweep_config},
                {"points", points_json},
                {"goodput", goodput_json},
                {"slo_scale", slo_scale}};
  bool written = true;
  if (Status s = WriteTextFile(path_in("sweep.json"), sweep.dump(1) + "\n"); !s.ok()) {
    std::fprintf(stderr, "tandem bench sweep: %s\n", s.message().c_str());
    written = false;
  }

  // ---- plots: data files, gnuplot scripts, PNGs ----
  bool plots_ok = true;
  const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};
  char slo_text[128];
  std::snprintf(slo_text, sizeof slo_text, "TTFT <= %g s, TPOT <= %g s", slo_ttft, slo_tpot);
  for (const std::string& workload : workloads) {
    std::vector<std::string> plot_items;
    for (size_t c = 0; c < clusters.size(); ++c) {
      std::string data;
      bool any = false, any_sim = false, any_at_speed = false;
      for (const Point& p : points) {
        if (p.cluster != clusters[c].name || p.workload != workload) continue;
        any = true;
        any_sim = any_sim || p.simulated;
        any_at_speed = any_at_speed || p.simulated_at_speed;
        data += FormatNumber(p.rate) + " " + FormatNumber(p.measured.attainment) + " " +
                FormatNumber(p.simulated ? p.simulated_summary.attainment : NAN) + " " +
                FormatNumber(p.simulated_at_speed ? p.simulated_at_speed_summary.attainment : NAN) +
                "\n";
      }
      if (!any) continue;
      const std::string file = "attainment_" + workload + "_" + clusters[c].name + ".dat";
      if (!WriteTextFile(path_in(file),
                         "# rate measured_attainment simulated_attainment "
                         "simulated_at_measured_speed_attainment\n" +
                             data)
               .ok())
        plots_ok = false;
      const std::string color = colors[c % std::size(colors)];
      plot_items.push_back(GnuplotQuote(file) + " using 1:2 with linespoints lw 2 pt 7 lc rgb '" +
                           color + "' title " + GnuplotQuote(clusters[c].name));
      if (any_sim)
        plot_items.push_back(GnuplotQuote(file) +
                             " using 1:3 with linespoints lw 2 dt 2 pt 6 lc rgb '" + color +
                             "' title " + GnuplotQuote(clusters[c].name + " (simulated)"));
      if (any_at_speed)
        plot_items.push_back(
            GnuplotQuote(file) + " using 1:4 with linespoints lw 1.5 dt 3 pt 4 lc rgb '" + color +
            "' title " + GnuplotQuote(clusters[c].name + " (simulated at measured speed)"));
    }
    if (plot_items.empty()) continue;
    std::string script = "set terminal pngcairo size 900,600 enhanced font 'sans,11'\n";
    script += "set output " + GnuplotQuote("attainment_" + workload + ".png") + "\n";
    script += "set title " +
              GnuplotQuote(workload + ": SLO attainment vs rate (" + slo_text + ")") +
              " noenhanced\n";
    script += "set xlabel 'rate (requests/s)'\nset ylabel 'SLO attainment'\n";
    script += "set yrange [0:1.05]\nset xrange [0:*]\nset grid\nset key bottom left noenhanced\n";
    script += "plot ";
    for (const std::string& item : plot_items) script += item + ", \\\n     ";
    script += FormatNumber(target) + " with lines dt 3 lw 1.5 lc rgb '#555555' title 'target'\n";
    const std::string gp = "attainment_" + workload + ".gp";
    if (!WriteTextFile(path_in(gp), script).ok() || !RunGnuplot(out_dir, gp)) plots_ok = false;
  }
  for (const json& entry : slo_scale) {
    const std::string workload = entry["workload"].get<std::string>();
    std::vector<std::string> names;
    for (auto it = entry["curves"].begin(); it != entry["curves"].end(); ++it)
      names.push_back(it.key());
    if (names.empty()) continue;
    // Clusters in --cluster order (json objects are sorted by key).
    std::vector<std::string> ordered;
    for (const ClusterSpec& spec : clusters)
      if (std::find(names.begin(), names.end(), spec.name) != names.end())
        ordered.push_back(spec.name);
    std::string data = "# scale";
    for (const std::string& name : ordered) data += " " + name;
    data += "\n";
    for (size_t i = 0; i < scales.size(); ++i) {
      data += FormatNumber(scales[i]);
      for (const std::string& name : ordered)
        data += " " + FormatNumber(entry["curves"][name][i]["attainment"].get<double>());
      data += "\n";
    }
    const std::string file = "slo_scale_" + workload + ".dat";
    if (!WriteTextFile(path_in(file), data).ok()) plots_ok = false;
    std::string script = "set terminal pngcairo size 900,600 enhanced font 'sans,11'\n";
    script += "set output " + GnuplotQuote("slo_scale_" + workload + ".png") + "\n";
    script += "set title " +
              GnuplotQuote(workload + ": SLO attainment vs SLO scale at " +
                           RateLabel(entry["rate"].get<double>()) + " req/s (scale 1: " + slo_text +
                           ")") +
              " noenhanced\n";
    script +=
        "set xlabel 'SLO scale (TTFT and TPOT objectives x scale)'\n"
        "set ylabel 'SLO attainment'\nset logscale x 2\nset xrange [0.25:4]\n"
        "set yrange [0:1.05]\nset grid\nset key bottom right noenhanced\nplot ";
    for (size_t i = 0; i < ordered.size(); ++i) {
      size_t c = 0;
      while (c < clusters.size() && clusters[c].name != ordered[i]) ++c;
      script += GnuplotQuote(file) + " using 1:" + std::to_string(i + 2) +
                " with linespoints lw 2 pt 7 lc rgb '" + colors[c % std::size(colors)] +
                "' title " + GnuplotQuote(ordered[i]) + ", \\\n     ";
    }
    script += FormatNumber(target) + " with lines dt 3 lw 1.5 lc rgb '#555555' title 'target'\n";
    const std::string gp = "slo_scale_" + workload + ".gp";
    if (!WriteTextFile(path_in(gp), script).ok() || !RunGnuplot(out_dir, gp)) plots_ok = false;
  }
  if (!plots_ok)
    std::fprintf(stderr,
                 "tandem bench sweep: some plots were not made (is gnuplot with the "
                 "pngcairo terminal installed?)\n");

  // ---- the table ----
  std::printf("\ngoodput at SLO attainment >= %g (%s)\n", target, slo_text);
  std::printf("%-16s %-14s %12s %13s %6s %15s %9s\n", "cluster", "workload", "goodput_rps",
              "crossing_rps", "cores", "per_core_rps", "vs_first");
  for (const GoodputRow& row : rows) {
    if (!row.measured) {
      std::printf("%-16s %-14s %12s\n", row.cluster.c_str(), row.workload.c_str(), "not run");
      continue;
    }
    char ratio[32] = "-";
    if (!std::isnan(row.ratio)) std::snprintf(ratio, sizeof ratio, "%.2fx", row.ratio);
    const char* plus = row.estimate.lower_bound ? "+" : " ";
    std::printf("%-16s %-14s %11.3f%s %12.3f%s %6d %14.4f%s %9s\n", row.cluster.c_str(),
                row.workload.c_str(), row.estimate.goodput, plus, row.estimate.crossing, plus,
                row.cores, row.per_core, plus, ratio);
  }
  if (std::any_of(rows.begin(), rows.end(),
                  [](const GoodputRow& r) { return r.estimate.lower_bound; }))
    std::printf("+ every rate met the target: goodput is at least this (add higher --rates)\n");
  std::printf("\nwrote %s (sweep.json, per-run JSON, plots)\n", out_dir.c_str());
  return all_ran && written && plots_ok ? kExitOk : kExitFailure;
}

}  // namespace tandem
