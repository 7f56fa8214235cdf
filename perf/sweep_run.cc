// `tandem bench sweep`, run: each cluster started as `tandem up`, its rates measured (and
// simulated beside the measurement), one JSON file per run. perf/sweep_internal.h.

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
#include <fstream>
#include <mutex>
#include <thread>

#include "cluster/simulator.h"
#include "common/base/metrics.h"
#include "common/base/thread_annotations.h"
#include "perf/bench_client.h"
#include "perf/bench_report.h"
#include "perf/sweep_internal.h"

namespace tandem::sweep {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

constexpr char kReadyPrefix[] = "tandem: ready at ";

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

  void Stop() TANDEM_EXCLUDES(mutex_) {
    {
      MutexLock lock(&mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  // The mean of the counted samples over all instances (1 = as profiled, 1.2 = steps 20% slower
  // than the model), 0 when none counted; and how many counted.
  double Mean() const TANDEM_EXCLUDES(mutex_) {
    MutexLock lock(&mutex_);
    return counted_ > 0 ? sum_ / static_cast<double>(counted_) : 0.0;
  }
  int64_t Counted() const TANDEM_EXCLUDES(mutex_) {
    MutexLock lock(&mutex_);
    return counted_;
  }

 private:
  // The condition wait holds mutex_ through a std::unique_lock, which the analysis cannot
  // follow: every access below is under that lock.
  void Loop(const ServerUrl& url, double interval_s) TANDEM_NO_THREAD_SAFETY_ANALYSIS {
    double last_tokens = -1;  // the previous sample's tokens generated; -1 before the first
    std::unique_lock<Mutex> lock(mutex_);
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
      const auto next = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(interval_s));
      while (!stop_ && wake_.wait_until(lock, next) != std::cv_status::timeout) {
      }
    }
  }

  mutable Mutex mutex_;
  std::condition_variable_any wake_;
  bool stop_ TANDEM_GUARDED_BY(mutex_) = false;
  double sum_ TANDEM_GUARDED_BY(mutex_) = 0;
  int64_t counted_ TANDEM_GUARDED_BY(mutex_) = 0;
  std::thread thread_;  // last: starts once the members above exist
};

// A cluster that printed its ready line: where it listens and which model it serves.
struct ReadyCluster {
  std::string url_text, model;
  ServerUrl url;
};

// Starts `spec` as `BINARY up CONFIG OVERRIDES` (log in out_dir/NAME.log) and waits for its
// line "tandem: ready at http://HOST:PORT (model NAME)".
StatusOr<ReadyCluster> StartCluster(const SweepOptions& options, const ClusterSpec& spec,
                                    ClusterProcess* process) {
  TANDEM_RETURN_IF_ERROR(process->Start(options.binary, spec.config_path, options.cluster_overrides,
                                        options.PathIn(spec.name + ".log")));
  TANDEM_ASSIGN_OR_RETURN(std::string line, process->WaitReady(options.ready_timeout_s));
  ReadyCluster ready;
  std::string rest = line.substr(std::strlen(kReadyPrefix));
  size_t space = rest.find(" (model ");
  ready.url_text = rest.substr(0, space);
  if (space != std::string::npos) {
    ready.model = rest.substr(space + 8);
    if (!ready.model.empty() && ready.model.back() == ')') ready.model.pop_back();
  }
  TANDEM_ASSIGN_OR_RETURN(ready.url, ParseServerUrl(ready.url_text));
  return ready;
}

// What every rate of one (cluster, workload) shares.
struct WorkloadRun {
  const SweepOptions& options;
  const ClusterSpec& spec;
  const std::string& workload;
  const ReadyCluster& cluster;
  const LoadOptions& load;
};

// The lengths' scale of the synthetic requests.
int32_t WorkloadLength(const SweepOptions& options, const ClusterSpec& spec) {
  return options.workload_len > 0 ? static_cast<int32_t>(options.workload_len)
                                  : spec.config.model.max_model_len;
}

// Simulates the run's requests on the cluster's config (same arrivals and lengths), then again
// with decode at the speed the router measured during the run (it measures decode steps only;
// prefill stays as profiled): what the simulator predicts once the machine's drift from its
// profile is known. Fills the point's simulated fields and the run record's.
void SimulatePoint(const WorkloadRun& run, const std::vector<WorkloadRequest>& requests,
                   SweepPoint* point, json* record) {
  const SweepOptions& o = run.options;
  const Slo slo{o.slo_ttft, o.slo_tpot};
  StatusOr<SimulationResult> sim =
      Simulate(run.spec.config, *o.latency_model, requests, ServerLikeSimulationOptions());
  if (!sim.ok()) {
    point->simulated_error = sim.status().message();
    (*record)["simulated"] = {{"error", point->simulated_error}};
    std::fprintf(stderr, "tandem bench sweep: simulate %s %s rate %g: %s\n", run.spec.name.c_str(),
                 run.workload.c_str(), point->rate, point->simulated_error.c_str());
    return;
  }
  point->simulated = true;
  point->simulated_summary = Summarize(sim->outcomes, slo, sim->makespan_s);
  (*record)["simulated"] = {{"summary", SummaryToJson(point->simulated_summary)},
                            {"requests", OutcomesToJson(sim->outcomes, {})}};
  if (point->measured_speed <= 0) return;
  SimulationOptions at_speed = ServerLikeSimulationOptions();
  at_speed.decode_time_scale = point->measured_speed;
  StatusOr<SimulationResult> scaled =
      Simulate(run.spec.config, *o.latency_model, requests, at_speed);
  if (!scaled.ok()) return;
  point->simulated_at_speed = true;
  point->simulated_at_speed_summary = Summarize(scaled->outcomes, slo, scaled->makespan_s);
  (*record)["simulated_at_measured_speed"] = {
      {"decode_time_scale", point->measured_speed},
      {"summary", SummaryToJson(point->simulated_at_speed_summary)},
      {"requests", OutcomesToJson(scaled->outcomes, {})}};
}

// The run's JSON file: as `tandem bench --out`, before the simulations are added.
json RunRecord(const WorkloadRun& run, size_t num_requests, const SweepPoint& point,
               const LoadResult& result) {
  const SweepOptions& o = run.options;
  return {{"config",
           {{"cluster", run.spec.name},
            {"cluster_config", run.spec.config_path},
            {"url", run.cluster.url_text},
            {"model", run.cluster.model},
            {"max_model_len", run.spec.config.model.max_model_len},
            {"workload_max_model_len", WorkloadLength(o, run.spec)},
            {"workload", run.workload},
            {"seed", o.seed},
            {"rate", point.rate},
            {"num_requests", num_requests},
            {"duration_s", o.duration_s},
            {"slo_ttft_s", o.slo_ttft},
            {"slo_tpot_s", o.slo_tpot}}},
          {"summary", SummaryToJson(point.measured)},
          {"requests", OutcomesToJson(result.outcomes, result.max_tokens)}};
}

void PrintPoint(const SweepPoint& point) {
  const RunSummary& m = point.measured;
  std::printf(
      "%-14s %-14s rate %-6g  attainment %5.1f%% (TTFT %5.1f%%, TPOT %5.1f%%)  "
      "done %lld/%lld  TTFT p90 %.3f s  TPOT p90 %.4f s",
      point.cluster.c_str(), point.workload.c_str(), point.rate, 100 * m.attainment,
      100 * m.ttft_attainment, 100 * m.tpot_attainment, static_cast<long long>(m.completed),
      static_cast<long long>(m.requests), m.ttft_p90, m.tpot_p90);
  if (point.simulated) std::printf("  simulated %5.1f%%", 100 * point.simulated_summary.attainment);
  if (point.simulated_at_speed)
    std::printf(" (at measured speed x%.3f: %5.1f%%)", point.measured_speed,
                100 * point.simulated_at_speed_summary.attainment);
  std::printf("\n");
  std::fflush(stdout);
}

// kNoRequests: the workload has none at this rate (this workload's sweep ends); kClusterFailed:
// the load could not run (this cluster's sweep ends).
enum class RateOutcome { kMet, kMissed, kNoRequests, kClusterFailed };

// Measures one rate (and simulates it with a latency model); appends its point.
RateOutcome RunRate(const WorkloadRun& run, double rate, std::vector<SweepPoint>* points) {
  const SweepOptions& o = run.options;
  StatusOr<std::vector<WorkloadRequest>> requests =
      SyntheticRequests(run.workload, rate, o.num_requests, o.duration_s,
                        static_cast<uint64_t>(o.seed), WorkloadLength(o, run.spec));
  if (!requests.ok() || requests->empty()) {
    std::fprintf(stderr, "tandem bench sweep: %s %s rate %g: no requests\n", run.spec.name.c_str(),
                 run.workload.c_str(), rate);
    return RateOutcome::kNoRequests;
  }
  SpeedSampler speed(run.cluster.url, 1.0);
  StatusOr<LoadResult> result = RunLoad(run.load, *requests);
  speed.Stop();
  if (!result.ok()) {
    std::fprintf(stderr, "tandem bench sweep: %s: %s\n", run.spec.name.c_str(),
                 result.status().message().c_str());
    return RateOutcome::kClusterFailed;
  }
  SweepPoint point;
  point.cluster = run.spec.name;
  point.workload = run.workload;
  point.rate = rate;
  point.outcomes = result->outcomes;
  point.measured = Summarize(result->outcomes, Slo{o.slo_ttft, o.slo_tpot}, result->duration_s);
  point.run_file = run.spec.name + "_" + run.workload + "_r" + RateLabel(rate) + ".json";
  point.measured_speed = speed.Mean();
  point.speed_samples = speed.Counted();
  json record = RunRecord(run, requests->size(), point, *result);
  if (o.latency_model) SimulatePoint(run, *requests, &point, &record);
  record["measured_speed"] = {{"decode_model_correction", point.measured_speed},
                              {"samples", point.speed_samples}};
  if (Status s = WriteTextFile(o.PathIn(point.run_file), record.dump(1) + "\n"); !s.ok())
    std::fprintf(stderr, "tandem bench sweep: %s\n", s.message().c_str());
  PrintPoint(point);
  const bool below = point.measured.attainment < o.target;
  points->push_back(std::move(point));
  return below ? RateOutcome::kMissed : RateOutcome::kMet;
}

// The rates in increasing order until the first that misses the target; when the first rate
// already misses, halved rates (at most --probe-down) until one meets it. False when the
// cluster failed.
bool RunWorkload(const WorkloadRun& run, std::vector<SweepPoint>* points) {
  const size_t first_point = points->size();
  bool met_any = false, cluster_ok = true;
  for (double rate : run.options.rates) {
    RateOutcome outcome = RunRate(run, rate, points);
    if (outcome == RateOutcome::kMet) {
      met_any = true;
      continue;
    }
    double lower = rate;
    for (long k = 0; outcome == RateOutcome::kMissed && !met_any && k < run.options.probe_down;
         ++k) {
      lower /= 2;
      std::printf("%-14s %-14s rate %g missed the target: probing %g\n", run.spec.name.c_str(),
                  run.workload.c_str(), rate, lower);
      outcome = RunRate(run, lower, points);
      met_any = outcome == RateOutcome::kMet;
    }
    cluster_ok = outcome != RateOutcome::kClusterFailed;
    break;
  }
  // Probes ran after the rate above them: keep each cluster's points in ascending rates.
  std::stable_sort(points->begin() + static_cast<std::ptrdiff_t>(first_point), points->end(),
                   [](const SweepPoint& x, const SweepPoint& y) { return x.rate < y.rate; });
  return cluster_ok;
}

// Starts one cluster, runs every workload on it, stops it. True when it ran them all.
bool RunCluster(const SweepOptions& options, const ClusterSpec& spec,
                std::vector<SweepPoint>* points) {
  std::printf("== %s (%s, %d cores): starting\n", spec.name.c_str(), spec.config_path.c_str(),
              spec.cores);
  std::fflush(stdout);
  ClusterProcess process;
  StatusOr<ReadyCluster> cluster = StartCluster(options, spec, &process);
  if (!cluster.ok()) {
    std::fprintf(stderr, "tandem bench sweep: %s: %s\n", spec.name.c_str(),
                 cluster.status().message().c_str());
    process.Stop(options.stop_timeout_s);
    return false;
  }
  std::printf("== %s: ready at %s (model %s)\n", spec.name.c_str(), cluster->url_text.c_str(),
              cluster->model.c_str());
  std::fflush(stdout);
  LoadOptions load;
  load.url = cluster->url;
  load.model = cluster->model;
  load.request_timeout_s = options.request_timeout_s;
  load.seed = static_cast<uint64_t>(options.seed);
  load.max_token_id = static_cast<int32_t>(options.max_token_id);
  load.duration_s = options.duration_s;
  load.progress = ::isatty(STDERR_FILENO);
  bool cluster_ok = true;
  for (const std::string& workload : options.workloads) {
    cluster_ok = RunWorkload(WorkloadRun{options, spec, workload, *cluster, load}, points);
    if (!cluster_ok) break;
  }
  process.Stop(options.stop_timeout_s);
  std::printf("== %s: stopped\n", spec.name.c_str());
  std::fflush(stdout);
  return cluster_ok;
}

}  // namespace

SweepResult RunSweep(SweepOptions& options) {
  SweepResult result;
  result.config = {
      {"clusters", json::array()},        {"workloads", options.workloads},
      {"rates", options.rates},           {"num_requests", options.num_requests},
      {"duration_s", options.duration_s}, {"seed", options.seed},
      {"target", options.target},         {"slo_ttft_s", options.slo_ttft},
      {"slo_tpot_s", options.slo_tpot},   {"latency_model", options.latency_model_path},
      {"binary", options.binary},         {"started_at", UtcTimestamp()}};
  for (const ClusterSpec& spec : options.clusters)
    result.config["clusters"].push_back(
        {{"name", spec.name}, {"config", spec.config_path}, {"cores", spec.cores}});
  for (ClusterSpec& spec : options.clusters) {
    spec.ran = RunCluster(options, spec, &result.points);
    result.all_ran = result.all_ran && spec.ran;
  }
  return result;
}

}  // namespace tandem::sweep
