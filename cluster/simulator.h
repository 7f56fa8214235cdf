// A discrete-event simulator of a Tandem cluster: the router's placement policy in front of
// prefill, decode and colocated instances, each running the same scheduling rules as the real
// servers (prefill: FCFS batches by token budget; decode: continuous batching with a KV block
// pool and back-pressure on pulls; colocated: colocated.scheduling's policy of
// decode/colocated_scheduler.h, chunked mixed steps or prefill-first), with step times from a
// latency model (common/engine/latency_model.h) and KV transfer time from its transfer model.
//
// It answers "what would this cluster do with this workload" without running it: the bench
// sweep compares it with measured runs (same requests, same arrivals) and the planner
// (cluster/planner.h) uses it to search layouts far larger than one machine.
//
// Deterministic: the same inputs give the same outcomes. Single-threaded; any thread.
#pragma once

#include <string>
#include <vector>

#include "cluster/workload.h"
#include "common/base/status.h"
#include "common/config/config.h"
#include "common/engine/latency_model.h"

namespace tandem {

struct SimulationOptions {
  // Router-side overhead per request (tokenize, place, first-token relay), added to TTFT.
  double router_overhead_s = 0.0;
  // How often instances report load to the router (the placement sees reports this old).
  double load_report_interval_s = 0.0;  // 0 = the router sees the exact state
  // As the servers' engine loops publish their load: only after a step (prefill batch, engine
  // step), from the state the engine thread knew when the step began, i.e. without the
  // requests that arrived during it (they wait in the inbox until the step ends). While a step
  // runs the report stays as it was. false: every change is published at once.
  // Only pipeline_parallel 1 instances (the servers' loop) follow this.
  bool reports_after_steps = false;
  // Decode runs at this multiple of the latency model's time: a decode-only engine step takes
  // DecodeStepSeconds x this, a mixed step's decode sequences (c5 * batch + c6 * context)
  // cost this much more; prefill work is as modelled. For a machine whose decode steps run
  // faster or slower than when it was profiled (e.g. a neighbour less busy than the profile's).
  // The router keeps the unscaled model, as the real router does, and sees the difference only
  // in the load reports (its decode-model correction, router/placement.h). 1 = as profiled. The
  // bench sweep sets it to the decode speed the router measured during a run (perf/sweep.h).
  double decode_time_scale = 1.0;
};

// The options that replay the real servers: reports every 100 ms (their report timer),
// published after steps. `tandem simulate` uses these by default.
SimulationOptions ServerLikeSimulationOptions();

struct SimulationResult {
  std::vector<RequestOutcome> outcomes;  // one per request, in request order
  double makespan_s = 0;                 // first arrival to last completion
};

// Simulates `requests` (prompt_tokens must be known, >= 1) on the cluster described by
// `config` (instance counts, threads/tensor_parallel, batch limits, KV blocks, router policy and
// SLO), with the entry of `models` that matches each instance's device/threads/tensor_parallel/
// pipeline_parallel (device "cuda" matches any non-cpu entry, e.g. "h100"; threads only
// distinguish cpu entries). kv_blocks 0 is sized as the servers size it; a KV transfer takes
// models.transfer for the prompt's blocks (kv_bytes_per_token of the prefill entry). The
// implementation's header comment lists what is mirrored from which server, and how
// pipeline_parallel is modelled.
// InvalidArgument when an instance shape has no latency model entry (naming the shape), or a
// request has no known prompt length.
StatusOr<SimulationResult> Simulate(const ClusterConfig& config, const LatencyModelFile& models,
                                    const std::vector<WorkloadRequest>& requests,
                                    const SimulationOptions& options = {});

// The run summary as `tandem simulate` prints it: counts, throughput, p50/p90/p99 of TTFT,
// TPOT and e2e, and SLO attainment (the same columns as `tandem bench`).
std::string FormatRunSummary(const RunSummary& summary, const Slo& slo);

// `tandem simulate --config CLUSTER.yaml --latency-model LM.yaml (--workload NAME --rate R
//  --num-requests N --seed S | --trace FILE.jsonl) [--out FILE.json]`: prints the run summary
// table (same columns as `tandem bench`) and writes per-request outcomes.
int SimulateMain(const std::vector<std::string>& args);

}  // namespace tandem
