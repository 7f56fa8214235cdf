// `tandem plan`: DistServe's placement planner (OSDI'24, section 4, Algorithms 1 and 2).
//
// Given a latency model of the GPU (common/engine/latency_model.h: one entry per tensor x pipeline
// degree), a workload, the SLOs and a GPU budget, it chooses the parallelism of prefill and
// decode instances and how many of each, by simulating (cluster/simulator.h) rather than
// measuring:
//
//   high affinity (Algorithm 1: fast links between nodes, prefill and decode placed
//   independently): for every shape (tp <= gpus_per_node, tp * pp <= gpus), the highest
//   Poisson rate one instance of each phase sustains alone with `target` attainment (prefill
//   alone on TTFT: requests end at their first token; decode alone on TPOT: prefill takes no
//   time), found by bisection on the same seeded workload; the best goodput per GPU of each
//   phase; then n_prefill, n_decode that maximise min(n_p * rate_p, n_d * rate_d) within the
//   budget (DistServe's n = ceil(R / rate) for the balanced rate R), for every pair of shapes;
//   the best few such clusters by that estimate are simulated whole and the best is chosen.
//   low affinity (Algorithm 2: KV moves only over NVLink, so prefill and decode segments of the
//   same pipeline stage share a node): a unit is pp nodes, each holding n_p prefill segments of
//   tp_p GPUs and n_d decode segments of tp_d GPUs (n_p * tp_p + n_d * tp_d <= gpus_per_node);
//   each unit is simulated whole and the best goodput per GPU (of the nodes it occupies) is
//   replicated over the budget.
//   colocated (the vLLM-like baseline), under both policies of colocated.scheduling
//   (decode/colocated_scheduler.h): chunked (prompt chunks ride in decode steps, vLLM's default)
//   and prefill_first (whole prompts in steps that pause every decode, vLLM 2023: the baseline
//   DistServe measured against). For each, the best shape of a colocated instance by the same
//   search, replicated over the budget.
// The chosen layouts (the disaggregated one and both colocated ones) are then simulated whole
// (router goodput policy, as `tandem up` would run them) to predict cluster goodput: the highest
// rate meeting `target` attainment.
//
// Pure computation on the calling thread; deterministic.
#pragma once

#include <string>
#include <vector>

#include "cluster/workload.h"
#include "common/base/status.h"
#include "common/config/config.h"
#include "common/engine/latency_model.h"

namespace tandem {

struct PlanOptions {
  std::string workload = "chatbot";
  Slo slo;
  int gpus = 16;
  int gpus_per_node = 8;
  // Shapes with more pipeline stages are left out (0: no limit, DistServe's search). The
  // servers run pipeline_parallel 1 only (common/config/serving_config.h): a plan that chooses
  // more is a simulation, not a cluster `tandem up` or the Kubernetes overlay can start.
  int max_pipeline_parallel = 0;
  bool high_affinity = true;
  double target = 0.9;       // attainment
  int max_model_len = 2048;  // workload length budget and model.max_model_len of the plan
  int num_requests = 400;    // per simulated instance search
  uint64_t seed = 1;
  int max_batch_size = 256;  // decode and colocated instances
  // KV capacity: (gpu_memory_gb * memory_utilization * GPUs of the instance - weights_gb) /
  // kv_bytes_per_token, in blocks of 16 tokens, written as kv_blocks. gpu_memory_gb 0: kv_blocks
  // 0 (the servers' formula, max_model_len x max_batch_size: no memory limit).
  double gpu_memory_gb = 0;
  double weights_gb = 0;
  double memory_utilization = 0.9;
  // Seconds of arrivals per simulated run (at least num_requests, at most 20,000 requests): long
  // enough that an overloaded instance's queue is seen growing.
  double horizon_s = 60;
};

// One layout the planner considered, with its predicted goodput.
struct PlanCandidate {
  std::string kind;  // "prefill" | "decode" | "unit" | "colocated"
  int prefill_tp = 0, prefill_pp = 0, prefill_instances = 0;
  int decode_tp = 0, decode_pp = 0, decode_instances = 0;
  int gpus = 0;            // GPUs the candidate occupies
  double rate = 0;         // req/s at the target attainment
  double per_gpu = 0;      // rate / gpus
  std::string scheduling;  // colocated: "chunked" | "prefill_first"
};

struct Plan {
  std::vector<PlanCandidate> prefill_candidates;  // best first (high affinity)
  std::vector<PlanCandidate> decode_candidates;
  std::vector<PlanCandidate> pair_candidates;       // high affinity: clusters simulated whole
  std::vector<PlanCandidate> unit_candidates;       // low affinity
  std::vector<PlanCandidate> colocated_candidates;  // chunked, best first
  std::vector<PlanCandidate> colocated_prefill_first_candidates;  // prefill_first, best first
  PlanCandidate chosen;                                           // the disaggregated cluster
  PlanCandidate colocated;                // the colocated cluster on the same budget, chunked
  PlanCandidate colocated_prefill_first;  // the same, prefill_first (its own best shape)
  ClusterConfig config;  // the chosen (disaggregated) layout, loadable by `tandem up`
  std::string config_yaml;
  int simulations = 0;
};

// InvalidArgument when the budget holds no instance shape of `models`, or the workload name is
// unknown; FailedPrecondition when no shape meets the SLO at any rate.
StatusOr<Plan> MakePlan(const LatencyModelFile& models, const PlanOptions& options);

// What one instance of each configured phase sustains, as `tandem plan` measures a shape: each
// phase simulated alone (the other one instant), prefill judged on TTFT and decode on TPOT, the
// highest Poisson rate at which `config.slo.attainment_target` of `requests` meet the objective
// (bisection). The shapes are config.prefill's and config.decode's (one instance each, their
// device, threads, tp/pp, batch limits and KV blocks); `requests` give the length mix (their
// arrival times are replaced). The router's replica recommendation runs this on live traffic
// (cluster/replica_advisor.h).
struct PhaseCapacity {
  double prefill_rps = 0;  // 0: not even a trickle meets slo.ttft_s
  double decode_rps = 0;   // 0: not even a trickle meets slo.tpot_s
  int simulations = 0;
};
// InvalidArgument when `requests` is empty or a shape has no entry in `models`.
StatusOr<PhaseCapacity> MeasurePhaseCapacity(const LatencyModelFile& models,
                                             const ClusterConfig& config,
                                             const std::vector<WorkloadRequest>& requests,
                                             double horizon_s = 60);

int PlanMain(const std::vector<std::string>& args);

}  // namespace tandem
