// tandem_recommended_replicas{role="prefill"|"decode"}: how many instances of each role the
// traffic of the last router.recommend_window_s needs for the SLO (slo.ttft_s, slo.tpot_s) at
// slo.attainment_target, by the planner's calculation (`tandem plan`) on live traffic: the
// offered arrival rate over what one instance of the configured shape sustains on the window's
// length mix, as simulated with router.latency_model (cluster/replica_advisor.h). Prefill and
// decode are computed apart, so an autoscaler scales them apart and their ratio follows the
// workload. A window without traffic recommends 1 of each (the floor: no role is scaled away).
//
// Also exported: tandem_router_offered_requests_per_second (the rate used) and
// tandem_router_instance_capacity_requests_per_second{instance_role} (one instance's capacity;
// +Inf when the objective never binds on the mix).
// The `role` label of tandem_recommended_replicas names the role it recommends for; it replaces
// the router's own role="router" on that series (MetricsRegistry::AddGaugeAbout).
//
// A thread recomputes every router.recommend_interval_s (0: off, nothing exported). Reconfigure
// (SIGHUP, or the config file changed) applies new SLOs, target, interval and window. When the
// SLO cannot be met by one instance at any rate the gauges keep their last value and the
// reason is logged once.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/base/metrics.h"
#include "common/base/status.h"
#include "common/base/thread_annotations.h"
#include "common/config/config.h"
#include "common/engine/latency_model.h"
#include "router/traffic_recorder.h"

namespace tandem {

struct ReplicaAdvice {
  double rate_rps = 0;             // offered, in the window
  double prefill_capacity_rps = 0;  // one prefill instance, at the attainment target
  double decode_capacity_rps = 0;
  int prefill = 1;
  int decode = 1;
};

// The calculation (cluster/replica_advisor.h provides it; the router module does not depend on
// the simulator). Errors: FailedPrecondition when an objective cannot be met at any rate.
using ReplicaAdvisor = std::function<StatusOr<ReplicaAdvice>(
    const ClusterConfig& config, const LatencyModelFile& models, const TrafficWindow& window)>;

class ReplicaAdviceLoop {
 public:
  // `traffic` and `metrics` are not owned and outlive the loop.
  ReplicaAdviceLoop(ReplicaAdvisor advisor, const TrafficRecorder* traffic,
                    MetricsRegistry* metrics);
  ~ReplicaAdviceLoop();
  ReplicaAdviceLoop(const ReplicaAdviceLoop&) = delete;
  ReplicaAdviceLoop& operator=(const ReplicaAdviceLoop&) = delete;

  // Loads router.latency_model and starts the thread (when recommend_interval_s > 0).
  Status Start(const ClusterConfig& config);
  Status Reconfigure(const ClusterConfig& config);
  void Stop();

  // One computation on the window ending now; sets the gauges on success.
  StatusOr<ReplicaAdvice> RunOnce();

 private:
  struct Inputs {
    ClusterConfig config;
    std::shared_ptr<const LatencyModelFile> models;
  };
  static StatusOr<Inputs> MakeInputs(const ClusterConfig& config);
  void Loop();

  const ReplicaAdvisor advisor_;
  const TrafficRecorder* const traffic_;
  Family<Gauge>* recommended_ = nullptr;  // tandem_recommended_replicas{role}
  Gauge* offered_ = nullptr;
  Family<Gauge>* capacity_ = nullptr;

  Mutex mutex_;
  std::condition_variable_any wake_;
  std::shared_ptr<const Inputs> inputs_ TANDEM_GUARDED_BY(mutex_);
  bool stopping_ TANDEM_GUARDED_BY(mutex_) = false;
  std::string last_error_ TANDEM_GUARDED_BY(mutex_);
  std::thread thread_;
};

}  // namespace tandem
