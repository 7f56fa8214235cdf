#include "cluster/replica_advisor.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "cluster/planner.h"

namespace tandem {
namespace {

int InstancesFor(double rate, double capacity) {
  // A hair under an integer ratio is that integer (the bisection's last bits are noise).
  return std::max(1, static_cast<int>(std::ceil(rate / capacity - 1e-6)));
}

}  // namespace

StatusOr<ReplicaAdvice> RecommendReplicas(const ClusterConfig& config,
                                          const LatencyModelFile& models,
                                          const TrafficWindow& window) {
  ReplicaAdvice advice;
  advice.rate_rps = window.rate_rps();
  if (window.arrivals == 0 || window.samples.empty()) return advice;  // the floor: 1 and 1

  std::vector<WorkloadRequest> mix;
  const size_t first =
      window.samples.size() > kReplicaAdviceMaxSamples ? window.samples.size() - kReplicaAdviceMaxSamples : 0;
  for (size_t i = first; i < window.samples.size(); ++i) {
    WorkloadRequest r;
    r.id = static_cast<int64_t>(mix.size());
    r.prompt_tokens = std::max(1, window.samples[i].prompt_tokens);
    r.max_tokens = std::max(1, window.samples[i].output_tokens);
    mix.push_back(r);
  }
  TANDEM_ASSIGN_OR_RETURN(PhaseCapacity capacity, MeasurePhaseCapacity(models, config, mix));
  // A capacity past kUnbounded means the objective never binds on this mix (the search ran to
  // its ceiling): exported as +Inf rather than the ceiling's arbitrary number.
  constexpr double kUnbounded = 1e9;
  auto bounded = [](double rps) {
    return rps >= kUnbounded ? std::numeric_limits<double>::infinity() : rps;
  };
  advice.prefill_capacity_rps = bounded(capacity.prefill_rps);
  advice.decode_capacity_rps = bounded(capacity.decode_rps);
  auto unmeetable = [&](const char* role, const char* objective, double seconds) {
    return FailedPrecondition(std::string("one ") + role + " instance meets " + objective + " " +
                              std::to_string(seconds) + " s at no rate on this traffic (router." +
                              "latency_model): more instances would not help");
  };
  if (capacity.prefill_rps <= 0) return unmeetable("prefill", "slo.ttft_s", config.slo.ttft_s);
  if (capacity.decode_rps <= 0) return unmeetable("decode", "slo.tpot_s", config.slo.tpot_s);
  advice.prefill = InstancesFor(advice.rate_rps, capacity.prefill_rps);
  advice.decode = InstancesFor(advice.rate_rps, capacity.decode_rps);
  return advice;
}

}  // namespace tandem
