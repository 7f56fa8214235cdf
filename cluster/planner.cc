#include "cluster/planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cluster/plan_kustomize.h"
#include "cluster/simulator.h"
#include "common/base/flags.h"

namespace tandem {
namespace {

// A stand-in instance whose steps take no time: the other phase when one phase is searched
// alone. Its tensor degree matches no real entry.
constexpr const char* kInstantDevice = "plan-instant";
constexpr int kInstantTp = 999;
// Requests generated at most per simulated run (PlanOptions::horizon_s of arrivals).
constexpr int64_t kMaxRequests = 20000;
// Clusters above this many GPUs are simulated as a slice with the same prefill:decode ratio
// and the slice's goodput scaled up (identical instances behind a balancing router).
constexpr int kSliceGpus = 64;
// The planned cluster's router policy. least_loaded spreads identical instances evenly;
// goodput without router.latency_model predicts TPOT from measured averages, which favours
// busy decode instances ((running + 1) / running), so the plan does not rely on it.
constexpr const char* kPlanPolicy = "least_loaded";
// Low affinity: node units simulated whole (the best estimates).
constexpr size_t kSimulatedUnits = 10;
// High affinity: (prefill shape, decode shape, counts) simulated whole (the best estimates).
constexpr size_t kSimulatedPairs = 6;

struct Shape {
  const LatencyModel* lm = nullptr;
  int gpus() const { return lm->tensor_parallel * lm->pipeline_parallel; }
};

// KV blocks of an instance of this shape: what its GPUs' memory holds beside the weights
// (0 = leave kv_blocks 0: the servers' formula).
int KvBlocksFor(const LatencyModel& lm, const PlanOptions& o, int block_size) {
  if (o.gpu_memory_gb <= 0 || lm.kv_bytes_per_token <= 0) return 0;
  const double gpus = lm.tensor_parallel * lm.pipeline_parallel;
  const double free = o.gpu_memory_gb * 1e9 * o.memory_utilization * gpus - o.weights_gb * 1e9;
  return std::max(1, static_cast<int>(free / (lm.kv_bytes_per_token * block_size)));
}

void SetShape(InstanceSection* s, const LatencyModel& lm, int instances, const PlanOptions& o,
              bool prefill) {
  s->instances = instances;
  s->kv_blocks = KvBlocksFor(lm, o, 16);
  if (!prefill) s->max_batch_size = o.max_batch_size;
  s->device = lm.device == "cpu" ? "cpu" : "cuda";
  s->threads = lm.threads;
  s->tensor_parallel = lm.tensor_parallel;
  s->pipeline_parallel = lm.pipeline_parallel;
}

void SetInstant(InstanceSection* s) {
  s->instances = 1;
  s->device = kInstantDevice;
  s->threads = 1;
  s->tensor_parallel = kInstantTp;
  s->pipeline_parallel = 1;
  s->max_batch_size = 4096;
  s->token_budget = 1 << 20;
  s->kv_blocks = 1 << 24;
}

class Planner {
 public:
  Planner(const LatencyModelFile& models, const PlanOptions& options)
      : models_(models), options_(options) {
    LatencyModel instant;
    instant.model = "instant";
    instant.device = kInstantDevice;
    instant.tensor_parallel = kInstantTp;
    // The decode-alone search still moves the real KV (the transfer time counts).
    for (const LatencyModel& m : models.entries)
      instant.kv_bytes_per_token = std::max(instant.kv_bytes_per_token, m.kv_bytes_per_token);
    models_.entries.push_back(instant);
  }

  StatusOr<Plan> Run();
  // MeasurePhaseCapacity: `requests` (arrivals replaced by Poisson gaps at rate 1) on the
  // shapes of config.prefill and config.decode.
  StatusOr<PhaseCapacity> Capacity(const ClusterConfig& config,
                                   const std::vector<WorkloadRequest>& requests);

 private:
  Status Setup();
  Status PlanHighAffinity(Plan* plan);
  Status PlanLowAffinity(Plan* plan);
  std::string PlanYaml(const Plan& plan) const;
  ClusterConfig BaseConfig(const std::string& policy) const {
    ClusterConfig c;
    c.source = "<plan>";
    c.model.max_model_len = options_.max_model_len;
    c.router.policy = policy;
    c.slo.ttft_s = options_.slo.ttft_s;
    c.slo.tpot_s = options_.slo.tpot_s;
    c.slo.attainment_target = options_.target;
    c.prefill.instances = 0;
    c.decode.instances = 0;
    c.colocated.instances = 0;
    return c;
  }
  // The seeded workload at `rate`: the same requests, arrivals scaled (Poisson gaps scale).
  std::vector<WorkloadRequest> At(double rate, size_t count, bool one_token) const {
    std::vector<WorkloadRequest> out(base_.begin(), base_.begin() + std::min(count, base_.size()));
    for (WorkloadRequest& r : out) {
      r.arrival_s /= rate;
      if (one_token) r.max_tokens = 1;
    }
    return out;
  }
  // Attainment of `config` at `rate` on `slo`. The run lasts horizon_s of arrivals (at least
  // `count` requests, at most the generated ones), so that a queue that grows is seen growing:
  // a short burst would hide an overloaded decode instance (its first requests still meet TPOT).
  double Attainment(const ClusterConfig& config, double rate, size_t count, bool one_token,
                    const Slo& slo) {
    ++simulations_;
    count = std::min(base_.size(), std::max(count, static_cast<size_t>(rate * options_.horizon_s)));
    SimulationOptions so;
    so.load_report_interval_s = report_interval_;
    StatusOr<SimulationResult> r = Simulate(config, models_, At(rate, count, one_token), so);
    if (!r.ok()) return 0;
    return Summarize(r->outcomes, slo).attainment;
  }
  // The highest rate with attainment >= target (bisection; 0 when not even a trickle meets it).
  double MaxRate(const ClusterConfig& config, size_t count, bool one_token, const Slo& slo,
                 double guess) {
    double lo = 0, hi = std::max(guess, 1e-3);
    if (Attainment(config, hi, count, one_token, slo) >= options_.target) {
      lo = hi;
      for (int i = 0; i < 40; ++i) {
        hi = lo * 2;
        if (Attainment(config, hi, count, one_token, slo) < options_.target) break;
        lo = hi;
      }
      if (lo == hi) return lo;
    } else {
      for (int i = 0; i < 40 && lo == 0; ++i) {
        double mid = hi / 2;
        if (Attainment(config, mid, count, one_token, slo) >= options_.target)
          lo = mid;
        else
          hi = mid;
      }
      if (lo == 0) return 0;
    }
    for (int i = 0; i < 10 && hi - lo > 0.01 * lo; ++i) {
      double mid = (lo + hi) / 2;
      if (Attainment(config, mid, count, one_token, slo) >= options_.target)
        lo = mid;
      else
        hi = mid;
    }
    return lo;
  }

  void SearchPhases(Plan* plan);
  void SearchUnits(Plan* plan);
  // Every colocated shape alone under `scheduling` (chunked | prefill_first), best first.
  std::vector<PlanCandidate> SearchColocated(const std::string& scheduling);
  PlanCandidate ColocatedCluster(const std::vector<PlanCandidate>& candidates);
  ClusterConfig DisaggregatedConfig(const PlanCandidate& c) const;
  ClusterConfig ColocatedConfig(const PlanCandidate& c) const;
  double ClusterRate(const ClusterConfig& config, double estimate, int gpus);

  LatencyModelFile models_;
  PlanOptions options_;
  std::vector<Shape> shapes_;
  std::vector<WorkloadRequest> base_;
  double report_interval_ = 0;
  int simulations_ = 0;
};

void Planner::SearchPhases(Plan* plan) {
  Slo ttft{options_.slo.ttft_s, 0}, tpot{0, options_.slo.tpot_s};
  size_t n = static_cast<size_t>(options_.num_requests);
  for (const Shape& s : shapes_) {
    ClusterConfig p = BaseConfig("round_robin");
    SetShape(&p.prefill, *s.lm, 1, options_, true);
    SetInstant(&p.decode);
    PlanCandidate pc;
    pc.kind = "prefill";
    pc.prefill_tp = s.lm->tensor_parallel;
    pc.prefill_pp = s.lm->pipeline_parallel;
    pc.prefill_instances = 1;
    pc.gpus = s.gpus();
    pc.rate = MaxRate(p, n, /*one_token=*/true, ttft, 1.0);
    pc.per_gpu = pc.rate / pc.gpus;
    plan->prefill_candidates.push_back(pc);

    ClusterConfig d = BaseConfig("round_robin");
    SetInstant(&d.prefill);
    SetShape(&d.decode, *s.lm, 1, options_, false);
    PlanCandidate dc;
    dc.kind = "decode";
    dc.decode_tp = s.lm->tensor_parallel;
    dc.decode_pp = s.lm->pipeline_parallel;
    dc.decode_instances = 1;
    dc.gpus = s.gpus();
    dc.rate = MaxRate(d, n, /*one_token=*/false, tpot, 1.0);
    dc.per_gpu = dc.rate / dc.gpus;
    plan->decode_candidates.push_back(dc);
  }
  auto best_first = [](const PlanCandidate& a, const PlanCandidate& b) {
    return a.per_gpu != b.per_gpu ? a.per_gpu > b.per_gpu : a.gpus < b.gpus;
  };
  std::stable_sort(plan->prefill_candidates.begin(), plan->prefill_candidates.end(), best_first);
  std::stable_sort(plan->decode_candidates.begin(), plan->decode_candidates.end(), best_first);
}

// The phase-alone rate of a shape (0 when unknown).
double PhaseRate(const std::vector<PlanCandidate>& v, bool prefill, int tp, int pp) {
  for (const PlanCandidate& c : v) {
    if (prefill && c.prefill_tp == tp && c.prefill_pp == pp) return c.rate;
    if (!prefill && c.decode_tp == tp && c.decode_pp == pp) return c.rate;
  }
  return 0;
}

void Planner::SearchUnits(Plan* plan) {
  const int node = std::min(options_.gpus_per_node, options_.gpus);
  size_t n = static_cast<size_t>(options_.num_requests);
  // Every unit is estimated from the phase-alone rates (min(n_p * rate_p, n_d * rate_d)); the
  // best kSimulatedUnits estimates are simulated whole (a unit's phases interact through the
  // KV hand-off and placement), the rest keep their estimate and are listed after them.
  std::vector<PlanCandidate> all;
  for (const Shape& ps : shapes_) {
    for (const Shape& ds : shapes_) {
      const int pp = ps.lm->pipeline_parallel;
      if (ds.lm->pipeline_parallel != pp) continue;  // stages pair up node by node
      if (pp * node > options_.gpus) continue;
      const int tp_p = ps.lm->tensor_parallel, tp_d = ds.lm->tensor_parallel;
      for (int n_p = 1; n_p * tp_p + tp_d <= node; ++n_p) {
        for (int n_d = 1; n_p * tp_p + n_d * tp_d <= node; ++n_d) {
          PlanCandidate c;
          c.kind = "unit";
          c.prefill_tp = tp_p;
          c.prefill_pp = pp;
          c.prefill_instances = n_p;
          c.decode_tp = tp_d;
          c.decode_pp = pp;
          c.decode_instances = n_d;
          c.gpus = pp * node;  // the unit occupies its nodes whole
          c.rate = std::min(n_p * PhaseRate(plan->prefill_candidates, true, tp_p, pp),
                            n_d * PhaseRate(plan->decode_candidates, false, tp_d, pp));
          c.per_gpu = c.rate / c.gpus;
          all.push_back(c);
        }
      }
    }
  }
  std::stable_sort(all.begin(), all.end(), [](const PlanCandidate& a, const PlanCandidate& b) {
    return a.per_gpu > b.per_gpu;
  });
  for (size_t i = 0; i < all.size() && i < kSimulatedUnits; ++i) {
    PlanCandidate& c = all[i];
    if (c.rate <= 0) continue;
    c.rate = MaxRate(DisaggregatedConfig(c), n, false, options_.slo, c.rate);
    c.per_gpu = c.rate / c.gpus;
  }
  plan->unit_candidates = std::move(all);
  std::stable_sort(
      plan->unit_candidates.begin(),
      plan->unit_candidates.begin() + std::min(plan->unit_candidates.size(), kSimulatedUnits),
      [](const PlanCandidate& a, const PlanCandidate& b) {
        return a.per_gpu != b.per_gpu
                   ? a.per_gpu > b.per_gpu
                   : a.prefill_instances * a.prefill_tp + a.decode_instances * a.decode_tp <
                         b.prefill_instances * b.prefill_tp + b.decode_instances * b.decode_tp;
      });
}

std::vector<PlanCandidate> Planner::SearchColocated(const std::string& scheduling) {
  size_t n = static_cast<size_t>(options_.num_requests);
  std::vector<PlanCandidate> out;
  for (const Shape& s : shapes_) {
    ClusterConfig c = BaseConfig("round_robin");
    SetShape(&c.colocated, *s.lm, 1, options_, false);
    c.colocated.scheduling = scheduling;
    PlanCandidate pc;
    pc.kind = "colocated";
    pc.scheduling = scheduling;
    pc.prefill_tp = pc.decode_tp = s.lm->tensor_parallel;
    pc.prefill_pp = pc.decode_pp = s.lm->pipeline_parallel;
    pc.prefill_instances = pc.decode_instances = 1;
    pc.gpus = s.gpus();
    pc.rate = MaxRate(c, n, false, options_.slo, 1.0);
    pc.per_gpu = pc.rate / pc.gpus;
    out.push_back(pc);
  }
  std::stable_sort(out.begin(), out.end(), [](const PlanCandidate& a, const PlanCandidate& b) {
    return a.per_gpu != b.per_gpu ? a.per_gpu > b.per_gpu : a.gpus < b.gpus;
  });
  return out;
}

// The best colocated shape replicated over the budget, its goodput simulated whole.
PlanCandidate Planner::ColocatedCluster(const std::vector<PlanCandidate>& candidates) {
  const PlanCandidate& best = candidates.front();
  PlanCandidate c = best;
  c.prefill_instances = c.decode_instances = std::min(1024, options_.gpus / best.gpus);
  c.gpus = c.prefill_instances * best.gpus;
  c.rate = best.rate * c.prefill_instances;
  if (best.rate > 0) c.rate = ClusterRate(ColocatedConfig(c), c.rate, c.gpus);
  c.per_gpu = c.rate / std::max(1, c.gpus);
  return c;
}

const LatencyModel* FindShape(const std::vector<Shape>& shapes, int tp, int pp) {
  for (const Shape& s : shapes)
    if (s.lm->tensor_parallel == tp && s.lm->pipeline_parallel == pp) return s.lm;
  return nullptr;
}

ClusterConfig Planner::DisaggregatedConfig(const PlanCandidate& c) const {
  ClusterConfig config = BaseConfig(kPlanPolicy);
  SetShape(&config.prefill, *FindShape(shapes_, c.prefill_tp, c.prefill_pp), c.prefill_instances,
           options_, true);
  SetShape(&config.decode, *FindShape(shapes_, c.decode_tp, c.decode_pp), c.decode_instances,
           options_, false);
  return config;
}

ClusterConfig Planner::ColocatedConfig(const PlanCandidate& c) const {
  ClusterConfig config = BaseConfig(kPlanPolicy);
  SetShape(&config.colocated, *FindShape(shapes_, c.prefill_tp, c.prefill_pp), c.prefill_instances,
           options_, false);
  config.colocated.scheduling = c.scheduling;
  return config;
}

// The whole cluster's goodput. Above kSliceGpus a slice with the same instance ratio stands in
// for it and its rate is scaled by gpus / slice gpus.
double Planner::ClusterRate(const ClusterConfig& config, double estimate, int gpus) {
  ClusterConfig slice = config;
  double scale = 1;
  if (gpus > kSliceGpus) {
    const double k = static_cast<double>(gpus) / kSliceGpus;
    auto shrink = [&](InstanceSection* s) {
      if (s->instances > 0)
        s->instances = std::max(1, static_cast<int>(std::lround(s->instances / k)));
    };
    shrink(&slice.prefill);
    shrink(&slice.decode);
    shrink(&slice.colocated);
    auto g = [](const InstanceSection& s) {
      return s.instances * s.tensor_parallel * s.pipeline_parallel;
    };
    const int slice_gpus = g(slice.prefill) + g(slice.decode) + g(slice.colocated);
    scale = static_cast<double>(gpus) / slice_gpus;
  }
  return scale * MaxRate(slice, static_cast<size_t>(options_.num_requests), false, options_.slo,
                         std::max(estimate / scale, 1e-3));
}

// The shapes the budget allows (one per tensor x pipeline degree) and the base workload.
Status Planner::Setup() {
  TANDEM_ASSIGN_OR_RETURN(WorkloadShape shape, WorkloadShapeByName(options_.workload));
  if (options_.gpus < 1 || options_.gpus_per_node < 1)
    return InvalidArgument("--gpus and --gpus-per-node must be >= 1");
  for (const LatencyModel& m : models_.entries) {
    if (m.device == kInstantDevice) continue;
    if (m.tensor_parallel > options_.gpus_per_node) continue;  // tp stays inside a node
    if (m.tensor_parallel * m.pipeline_parallel > options_.gpus) continue;
    if (options_.max_pipeline_parallel > 0 && m.pipeline_parallel > options_.max_pipeline_parallel)
      continue;
    if (FindShape(shapes_, m.tensor_parallel, m.pipeline_parallel) != nullptr) continue;
    shapes_.push_back(Shape{&m});
  }
  if (shapes_.empty())
    return InvalidArgument("no latency model entry fits " + std::to_string(options_.gpus) +
                           " GPUs (" + std::to_string(options_.gpus_per_node) + " per node" +
                           (options_.max_pipeline_parallel > 0
                                ? ", pipeline_parallel <= " +
                                      std::to_string(options_.max_pipeline_parallel)
                                : std::string()) +
                           ")");
  WorkloadOptions wo;
  wo.rate = 1.0;
  wo.seed = options_.seed;
  wo.max_model_len = options_.max_model_len;
  // Whole-cluster runs need more requests than one instance's search.
  wo.num_requests = std::max<int64_t>(options_.num_requests, kMaxRequests);
  base_ = GenerateWorkload(shape, wo);
  return Status::Ok();
}

// High node affinity: each phase's instance searched alone, then pairs of shapes replicated.
Status Planner::PlanHighAffinity(Plan* plan) {
  SearchPhases(plan);
  // Replicate: the numbers of prefill and decode instances whose rates balance within the
  // budget (DistServe: n = ceil(R / rate) per phase for the cluster rate R). DistServe takes
  // each phase's best shape per GPU; on a small budget the instance granularity matters, so
  // every pair of shapes is tried and the best balanced rate wins (the per-GPU best pair is
  // among them).
  // Per pair of shapes, the split with the best estimate; the best kSimulatedPairs estimates
  // are then simulated whole (many instances behind one router pool their slack, so a
  // cluster sustains more than n x one instance's rate, and not equally for every shape).
  std::vector<PlanCandidate> pairs;
  for (const PlanCandidate& bp : plan->prefill_candidates) {
    if (bp.rate <= 0) continue;
    for (const PlanCandidate& bd : plan->decode_candidates) {
      if (bd.rate <= 0) continue;
      PlanCandidate pair;
      for (int n_p = 1; n_p * bp.gpus + bd.gpus <= options_.gpus && n_p <= 1024; ++n_p) {
        int n_d = std::min(1024, (options_.gpus - n_p * bp.gpus) / bd.gpus);
        double rate = std::min(n_p * bp.rate, n_d * bd.rate);
        int gpus = n_p * bp.gpus + n_d * bd.gpus;
        if (rate > pair.rate * (1 + 1e-9) || (rate >= pair.rate * (1 - 1e-9) && gpus < pair.gpus))
          pair = PlanCandidate{"disaggregated",
                               bp.prefill_tp,
                               bp.prefill_pp,
                               n_p,
                               bd.decode_tp,
                               bd.decode_pp,
                               n_d,
                               gpus,
                               rate,
                               rate / gpus,
                               ""};
      }
      if (pair.rate > 0) pairs.push_back(pair);
    }
  }
  std::stable_sort(pairs.begin(), pairs.end(),
                   [](const PlanCandidate& a, const PlanCandidate& b) { return a.rate > b.rate; });
  report_interval_ = 0.1;
  double best = -1;
  for (size_t i = 0; i < pairs.size() && i < kSimulatedPairs; ++i) {
    PlanCandidate c = pairs[i];
    c.rate = ClusterRate(DisaggregatedConfig(c), c.rate, c.gpus);
    c.per_gpu = c.rate / c.gpus;
    plan->pair_candidates.push_back(c);
    if (c.rate > best) {
      best = c.rate;
      plan->chosen = c;
    }
  }
  std::stable_sort(plan->pair_candidates.begin(), plan->pair_candidates.end(),
                   [](const PlanCandidate& a, const PlanCandidate& b) { return a.rate > b.rate; });
  report_interval_ = 0;
  if (best <= 0)
    return FailedPrecondition("no prefill + decode pair fits the budget and meets the SLO");
  return Status::Ok();
}

// Low node affinity: units of one node, replicated.
Status Planner::PlanLowAffinity(Plan* plan) {
  SearchPhases(plan);
  SearchUnits(plan);
  if (plan->unit_candidates.empty())
    return InvalidArgument("low affinity needs at least one node's worth of GPUs per unit");
  const PlanCandidate& u = plan->unit_candidates.front();
  if (u.rate <= 0) return FailedPrecondition("no unit meets the SLO at any rate");
  int replicas = std::max(1, options_.gpus / u.gpus);
  plan->chosen = u;
  plan->chosen.kind = "disaggregated";
  plan->chosen.prefill_instances = std::min(1024, u.prefill_instances * replicas);
  plan->chosen.decode_instances = std::min(1024, u.decode_instances * replicas);
  plan->chosen.gpus = u.gpus * replicas;
  plan->chosen.rate = u.rate * replicas;
  return Status::Ok();
}

// The chosen layout as a cluster YAML, with the predictions in its header comment.
std::string Planner::PlanYaml(const Plan& plan) const {
  std::ostringstream y;
  y << "# written by tandem plan: " << options_.workload << " workload, SLO TTFT "
    << options_.slo.ttft_s << " s, TPOT " << options_.slo.tpot_s << " s at "
    << options_.target * 100 << "% attainment, " << options_.gpus << " GPUs ("
    << options_.gpus_per_node << " per node, " << (options_.high_affinity ? "high" : "low")
    << " node affinity)\n"
    << "# predicted goodput " << plan.chosen.rate << " req/s (" << plan.chosen.per_gpu
    << " per GPU); colocated chunked " << plan.colocated.rate << " req/s ("
    << plan.colocated.per_gpu << " per GPU), prefill_first " << plan.colocated_prefill_first.rate
    << " req/s (" << plan.colocated_prefill_first.per_gpu << " per GPU)\n"
    << "model:\n  max_model_len: " << options_.max_model_len << "\n"
    << "router:\n  policy: " << kPlanPolicy << "\n";
  auto section = [&](const char* name, const InstanceSection& s) {
    y << name << ":\n  instances: " << s.instances << "\n  device: " << s.device << "\n";
    if (s.device == "cpu") y << "  threads: " << s.threads << "\n";
    y << "  tensor_parallel: " << s.tensor_parallel
      << "\n  pipeline_parallel: " << s.pipeline_parallel
      << "\n  max_batch_size: " << s.max_batch_size << "\n";
    if (s.kv_blocks > 0) y << "  kv_blocks: " << s.kv_blocks << "\n";
  };
  section("prefill", plan.config.prefill);
  section("decode", plan.config.decode);
  y << "colocated:\n  instances: 0\nslo:\n  ttft_s: " << options_.slo.ttft_s
    << "\n  tpot_s: " << options_.slo.tpot_s << "\n  attainment_target: " << options_.target
    << "\n";
  return y.str();
}

StatusOr<Plan> Planner::Run() {
  TANDEM_RETURN_IF_ERROR(Setup());
  Plan plan;
  TANDEM_RETURN_IF_ERROR(options_.high_affinity ? PlanHighAffinity(&plan) : PlanLowAffinity(&plan));
  plan.colocated_candidates = SearchColocated("chunked");
  plan.colocated_prefill_first_candidates = SearchColocated("prefill_first");

  // Predicted goodput of the clusters, simulated whole as `tandem up` would run them.
  report_interval_ = 0.1;  // the servers' load report period
  plan.config = DisaggregatedConfig(plan.chosen);
  if (!options_.high_affinity)
    plan.chosen.rate = ClusterRate(plan.config, plan.chosen.rate, plan.chosen.gpus);
  plan.chosen.per_gpu = plan.chosen.rate / std::max(1, plan.chosen.gpus);
  plan.colocated = ColocatedCluster(plan.colocated_candidates);
  plan.colocated_prefill_first = ColocatedCluster(plan.colocated_prefill_first_candidates);

  plan.config_yaml = PlanYaml(plan);
  StatusOr<ClusterConfig> check = ParseConfig(plan.config_yaml, "<plan>");
  if (!check.ok()) return Internal("the plan's YAML does not load: " + check.status().message());
  plan.simulations = simulations_;
  return plan;
}

std::string Shape2(int tp, int pp) {
  return "tp" + std::to_string(tp) + " pp" + std::to_string(pp);
}

void PrintCandidates(const char* title, const std::vector<PlanCandidate>& v, size_t top) {
  if (v.empty()) return;
  std::printf("%s (best %zu of %zu):\n", title, std::min(top, v.size()), v.size());
  for (size_t i = 0; i < v.size() && i < top; ++i) {
    const PlanCandidate& c = v[i];
    std::string shape;
    if (c.kind == "disaggregated")
      shape = std::to_string(c.prefill_instances) + "x P(" + Shape2(c.prefill_tp, c.prefill_pp) +
              ") + " + std::to_string(c.decode_instances) + "x D(" +
              Shape2(c.decode_tp, c.decode_pp) + ")";
    else if (c.kind == "prefill")
      shape = Shape2(c.prefill_tp, c.prefill_pp);
    else if (c.kind == "decode")
      shape = Shape2(c.decode_tp, c.decode_pp);
    else if (c.kind == "colocated")
      shape = Shape2(c.prefill_tp, c.prefill_pp);
    else
      shape = std::to_string(c.prefill_instances) + "x P(" + Shape2(c.prefill_tp, c.prefill_pp) +
              ") + " + std::to_string(c.decode_instances) + "x D(" +
              Shape2(c.decode_tp, c.decode_pp) + ")";
    std::printf("  %-36s %4d GPUs %10.3f req/s %10.3f req/s/GPU\n", shape.c_str(), c.gpus, c.rate,
                c.per_gpu);
  }
}

StatusOr<PhaseCapacity> Planner::Capacity(const ClusterConfig& config,
                                          const std::vector<WorkloadRequest>& requests) {
  if (requests.empty()) return InvalidArgument("no requests to measure capacity on");
  // The live mix, cycled up to num_requests, with seeded Poisson arrivals at rate 1 (At() scales
  // them to each trial rate).
  WorkloadShape shape = WorkloadShapeByName("chatbot").value();
  WorkloadOptions wo;
  wo.rate = 1.0;
  wo.seed = options_.seed;
  wo.num_requests = std::max<int64_t>(options_.num_requests, static_cast<int64_t>(requests.size()));
  base_ = GenerateWorkload(shape, wo);  // for its arrival times
  for (size_t i = 0; i < base_.size(); ++i) {
    const WorkloadRequest& sample = requests[i % requests.size()];
    base_[i].prompt_tokens = std::max(1, sample.prompt_tokens);
    base_[i].max_tokens = std::max(1, sample.max_tokens);
    base_[i].prompt_text.clear();
    base_[i].prompt_token_ids.clear();
  }
  const std::pair<const char*, const InstanceSection*> sections[] = {
      {"prefill", &config.prefill}, {"decode", &config.decode}};
  for (const auto& [role, section] : sections) {
    if (!models_.ForInstance(section->device, section->threads, section->tensor_parallel,
                             section->pipeline_parallel, role))
      return InvalidArgument(std::string("latency model ") + models_.source +
                             " has no entry for the " + role + " shape (device " +
                             section->device + ", tp " + std::to_string(section->tensor_parallel) +
                             ", pp " + std::to_string(section->pipeline_parallel) + ")");
  }
  ClusterConfig common = BaseConfig("round_robin");
  common.model = config.model;
  const Slo ttft{config.slo.ttft_s, 0}, tpot{0, config.slo.tpot_s};
  options_.target = config.slo.attainment_target;
  const size_t n = base_.size();
  PhaseCapacity capacity;

  ClusterConfig p = common;
  p.prefill = config.prefill;
  p.prefill.instances = 1;
  SetInstant(&p.decode);
  capacity.prefill_rps = MaxRate(p, n, /*one_token=*/true, ttft, 1.0);

  ClusterConfig d = common;
  SetInstant(&d.prefill);
  d.decode = config.decode;
  d.decode.instances = 1;
  capacity.decode_rps = MaxRate(d, n, /*one_token=*/false, tpot, 1.0);
  capacity.simulations = simulations_;
  return capacity;
}

}  // namespace

StatusOr<PhaseCapacity> MeasurePhaseCapacity(const LatencyModelFile& models,
                                             const ClusterConfig& config,
                                             const std::vector<WorkloadRequest>& requests,
                                             double horizon_s) {
  PlanOptions options;
  options.horizon_s = horizon_s;
  options.num_requests = 200;
  options.max_model_len = config.model.max_model_len;
  Planner planner(models, options);
  return planner.Capacity(config, requests);
}

StatusOr<Plan> MakePlan(const LatencyModelFile& models, const PlanOptions& options) {
  Planner planner(models, options);
  return planner.Run();
}

namespace {

// --out (the cluster YAML; stdout without it) and --kustomize-out (the overlay); the exit code.
int WritePlanFiles(const Plan& plan, const PlanOptions& options, const std::string& out_path,
                   const std::string& kustomize_dir, const std::string& kustomize_base) {
  const int stages = std::max(plan.config.prefill.pipeline_parallel,
                              plan.config.decode.pipeline_parallel);
  if (stages > 1)
    std::fprintf(stderr,
                 "tandem plan: note: the chosen layout has pipeline_parallel %d, which the "
                 "servers do not run (they refuse it at start-up); --max-pipeline-parallel 1 "
                 "plans a cluster they can start\n",
                 stages);
  if (!out_path.empty()) {
    std::ofstream out(out_path);
    out << plan.config_yaml;
    if (!out) {
      std::fprintf(stderr, "tandem plan: cannot write %s\n", out_path.c_str());
      return kExitFailure;
    }
    std::printf("wrote %s\n", out_path.c_str());
  } else {
    std::printf("\n%s", plan.config_yaml.c_str());
  }
  if (const std::string& dir = kustomize_dir; !dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    const std::string path = (std::filesystem::path(dir) / "kustomization.yaml").string();
    std::ofstream out(path);
    out << PlanKustomization(plan, options, kustomize_base);
    if (ec || !out) {
      std::fprintf(stderr, "tandem plan: cannot write %s\n", path.c_str());
      return kExitFailure;
    }
    std::printf("wrote %s\n", path.c_str());
  }
  return kExitOk;
}

}  // namespace

int PlanMain(const std::vector<std::string>& args) {
  FlagParser flags(
      "tandem plan --latency-model GPU.yaml --workload W --slo-ttft X "
      "--slo-tpot Y --gpus N [--gpus-per-node 8] [--max-pipeline-parallel P] "
      "[--affinity high|low] [--target 0.9] "
      "[--max-model-len L] [--num-requests N] [--out cluster.yaml]",
      "Chooses the parallelism and number of prefill and decode instances (DistServe's "
      "placement algorithms) by simulating the workload on the latency model, and compares "
      "with the best colocated layout under each colocated scheduling policy (chunked, "
      "prefill_first).");
  flags.AddString("latency-model", "", "latency model YAML with one entry per (tp, pp)");
  flags.AddString("workload", "chatbot", WorkloadNameList());
  flags.AddDouble("slo-ttft", 0.25, "TTFT objective, seconds");
  flags.AddDouble("slo-tpot", 0.1, "TPOT objective, seconds");
  flags.AddInt("gpus", 16, "GPU budget");
  flags.AddInt("gpus-per-node", 8, "GPUs per node (tensor parallelism stays inside a node)");
  flags.AddInt("max-pipeline-parallel", 0,
               "leave out shapes with more pipeline stages (0: any, as DistServe searches; "
               "the servers run 1)");
  flags.AddString("affinity", "high",
                  "high: prefill and decode anywhere (fast cross-node links); "
                  "low: KV stays inside a node");
  flags.AddDouble("target", 0.9, "SLO attainment to meet");
  flags.AddInt("max-model-len", 2048, "model context: workload lengths and model.max_model_len");
  flags.AddInt("num-requests", 400, "requests per simulated instance search");
  flags.AddInt("seed", 1, "workload seed");
  flags.AddInt("max-batch-size", 256, "decode/colocated max_batch_size (vLLM's max_num_seqs)");
  flags.AddDouble("gpu-memory-gb", 0,
                  "GPU memory: sizes kv_blocks with --weights-gb (0: the "
                  "servers' formula from max_model_len x max_batch_size)");
  flags.AddDouble("weights-gb", 0, "model weights, split over an instance's GPUs");
  flags.AddString("out", "", "write the chosen cluster YAML here (for tandem up)");
  flags.AddString("kustomize-out", "",
                  "also write a kustomize overlay of the plan into this directory "
                  "(kustomization.yaml: replicas, GPUs and shape per role)");
  flags.AddString("kustomize-base", "../gpu",
                  "the overlay the plan's overlay builds on, relative to --kustomize-out");
  if (Status s = flags.Parse(args); !s.ok()) {
    std::fprintf(stderr, "tandem plan: %s\n", s.message().c_str());
    return kExitUsage;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  const std::string affinity = flags.GetString("affinity");
  if (flags.GetString("latency-model").empty() || (affinity != "high" && affinity != "low") ||
      flags.GetInt("gpus") < 1 || flags.GetInt("gpus-per-node") < 1 ||
      flags.GetInt("max-pipeline-parallel") < 0 ||
      flags.GetInt("num-requests") < 10 || flags.GetDouble("target") <= 0 ||
      flags.GetDouble("target") > 1) {
    std::fprintf(stderr,
                 "tandem plan: needs --latency-model, --affinity high|low, --gpus >= 1, "
                 "--gpus-per-node >= 1, --max-pipeline-parallel >= 0, --num-requests >= 10, "
                 "0 < --target <= 1\n");
    return kExitUsage;
  }
  StatusOr<LatencyModelFile> models = LoadLatencyModel(flags.GetString("latency-model"));
  if (!models.ok()) {
    std::fprintf(stderr, "tandem plan: %s\n", models.status().message().c_str());
    return kExitFailure;
  }
  PlanOptions options;
  options.workload = flags.GetString("workload");
  options.slo = Slo{flags.GetDouble("slo-ttft"), flags.GetDouble("slo-tpot")};
  options.gpus = static_cast<int>(flags.GetInt("gpus"));
  options.gpus_per_node = static_cast<int>(flags.GetInt("gpus-per-node"));
  options.max_pipeline_parallel = static_cast<int>(flags.GetInt("max-pipeline-parallel"));
  options.high_affinity = affinity == "high";
  options.target = flags.GetDouble("target");
  options.max_model_len = static_cast<int>(flags.GetInt("max-model-len"));
  options.num_requests = static_cast<int>(flags.GetInt("num-requests"));
  options.seed = static_cast<uint64_t>(flags.GetInt("seed"));
  options.max_batch_size = static_cast<int>(flags.GetInt("max-batch-size"));
  options.gpu_memory_gb = flags.GetDouble("gpu-memory-gb");
  options.weights_gb = flags.GetDouble("weights-gb");
  const auto t0 = std::chrono::steady_clock::now();
  StatusOr<Plan> plan = MakePlan(*models, options);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!plan.ok()) {
    std::fprintf(stderr, "tandem plan: %s\n", plan.status().message().c_str());
    return plan.status().code() == StatusCode::kInvalidArgument ? kExitUsage : kExitFailure;
  }
  std::printf(
      "plan: %s, SLO TTFT %.3f s TPOT %.3f s at %.0f%%, %d GPUs (%d per node), %s node "
      "affinity; %d simulations in %.2f s\n\n",
      options.workload.c_str(), options.slo.ttft_s, options.slo.tpot_s, options.target * 100,
      options.gpus, options.gpus_per_node, affinity.c_str(), plan->simulations, wall);
  PrintCandidates("prefill instance shapes (alone, TTFT)", plan->prefill_candidates, 5);
  PrintCandidates("decode instance shapes (alone, TPOT)", plan->decode_candidates, 5);
  PrintCandidates("clusters simulated whole (prefill + decode instances)", plan->pair_candidates,
                  6);
  PrintCandidates("node units (prefill + decode segments per node)", plan->unit_candidates, 5);
  PrintCandidates("colocated instance shapes, chunked", plan->colocated_candidates, 5);
  PrintCandidates("colocated instance shapes, prefill_first",
                  plan->colocated_prefill_first_candidates, 5);
  const PlanCandidate& c = plan->chosen;
  std::printf("\nchosen: %d x prefill (%s) + %d x decode (%s) on %d GPUs\n", c.prefill_instances,
              Shape2(c.prefill_tp, c.prefill_pp).c_str(), c.decode_instances,
              Shape2(c.decode_tp, c.decode_pp).c_str(), c.gpus);
  std::printf("predicted goodput: disaggregated %.2f req/s (%.3f per GPU)\n", c.rate, c.per_gpu);
  for (const PlanCandidate* v : {&plan->colocated, &plan->colocated_prefill_first}) {
    std::printf("  vs colocated %-13s %d x (%s) %.2f req/s (%.3f per GPU): %.2fx per GPU\n",
                v->scheduling.c_str(), v->prefill_instances,
                Shape2(v->prefill_tp, v->prefill_pp).c_str(), v->rate, v->per_gpu,
                v->per_gpu > 0 ? c.per_gpu / v->per_gpu : 0.0);
  }
  return WritePlanFiles(*plan, options, flags.GetString("out"), flags.GetString("kustomize-out"),
                        flags.GetString("kustomize-base"));
}

}  // namespace tandem
