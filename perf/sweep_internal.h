// The three steps of `tandem bench sweep` (perf/sweep.h) and the plain structs between them:
// parse (sweep.cc: flags and inputs into SweepOptions) -> run (sweep_run.cc: each cluster
// started, its rates measured and simulated, into SweepPoints) -> report (sweep_report.cc:
// goodput rows, SLO-scale curves, sweep.json, plots, the table). Internal to perf/.
//
// Single-threaded: the sweep's main thread calls these in that order.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cluster/workload.h"
#include "common/base/status.h"
#include "common/config/config.h"
#include "common/engine/latency_model.h"
#include "perf/sweep.h"

namespace tandem::sweep {

struct ClusterSpec {
  std::string name;
  std::string config_path;
  ClusterConfig config;  // as loaded, with the sweep's SLOs (and latency model) applied
  int cores = 0;
  bool ran = false;  // started and measured
};

// Everything the flags ask for, checked; the configs and the latency model loaded.
struct SweepOptions {
  std::vector<ClusterSpec> clusters;  // --cluster order; the first is the baseline
  std::vector<std::string> workloads;
  std::vector<double> rates;  // ascending, unique
  long num_requests = 0;      // 0 when duration_s > 0
  double duration_s = 0;
  long seed = 1;
  double target = 0.9;
  long probe_down = 0;
  double slo_ttft = 0, slo_tpot = 0;  // 0 = not checked
  // The SLOs the routers run with (and the simulator sees): "not checked" becomes an objective
  // nothing misses, as the config needs one.
  double router_ttft = 0, router_tpot = 0;
  std::string latency_model_path;  // as given; empty = no simulation
  std::optional<LatencyModelFile> latency_model;
  std::string out_dir;
  std::string binary;
  std::optional<double> slo_scale_rate;  // one of rates; none = chosen from the points
  double ready_timeout_s = 600, stop_timeout_s = 60, request_timeout_s = 600;
  long max_token_id = 1000;
  long workload_len = 0;  // 0 = each config's model.max_model_len
  // `up` arguments every cluster runs with: the sweep's SLOs, the latency model.
  std::vector<std::string> cluster_overrides;
  bool help = false;  // --help: the help text is printed, nothing runs
  std::string help_text;

  std::string PathIn(const std::string& file) const;  // out_dir / file
};

// One measured (cluster, workload, rate), with its simulations.
struct SweepPoint {
  std::string cluster, workload;
  double rate = 0;
  RunSummary measured;
  std::vector<RequestOutcome> outcomes;
  bool simulated = false;
  RunSummary simulated_summary;
  std::string simulated_error;
  // The machine's decode speed during the run (0 = not measured) and the simulation with decode
  // at that speed (SimulationOptions::decode_time_scale).
  double measured_speed = 0;
  int64_t speed_samples = 0;
  bool simulated_at_speed = false;
  RunSummary simulated_at_speed_summary;
  std::string run_file;
};

struct SweepResult {
  std::vector<SweepPoint> points;  // per cluster and workload in ascending rates
  bool all_ran = true;             // every cluster started and ran every workload
  nlohmann::json config;           // the sweep's parameters, for sweep.json
};

// Parse: InvalidArgument for a bad flag (the exit code is kExitUsage), FailedPrecondition for
// inputs that do not load (a config, the latency model, the output folder; kExitFailure).
StatusOr<SweepOptions> ParseSweepArgs(const std::vector<std::string>& args);

// Run: starts each cluster in turn and measures its rates; per-run JSON files go to out_dir.
// Marks clusters[i].ran. Progress lines go to stdout, errors to stderr.
SweepResult RunSweep(SweepOptions& options);

// Report: writes sweep.json and the plots, prints the goodput table. True when everything was
// written.
bool ReportSweep(const SweepOptions& options, const SweepResult& result);

std::string RateLabel(double rate);      // "%g"
std::string FormatNumber(double value);  // "%.6g", NaN as "NaN"

}  // namespace tandem::sweep
