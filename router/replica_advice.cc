#include "router/replica_advice.h"

#include <cmath>

#include "common/base/log.h"
#include "router/cluster_backend.h"

namespace tandem {

ReplicaAdviceLoop::ReplicaAdviceLoop(ReplicaAdvisor advisor, const TrafficRecorder* traffic,
                                     MetricsRegistry* metrics)
    : advisor_(std::move(advisor)), traffic_(traffic) {
  if (metrics == nullptr) return;
  recommended_ = &metrics->AddGaugeAbout(
      "tandem_recommended_replicas",
      "Instances of each role the last router.recommend_window_s of traffic needs for the SLO at "
      "slo.attainment_target (the planner's calculation on the offered rate and length mix); "
      "role names the role recommended for",
      {"role"});
  offered_ = &metrics
                  ->AddGauge("tandem_router_offered_requests_per_second",
                             "Requests offered (admitted or refused) per second over the last "
                             "router.recommend_window_s")
                  .Get();
  capacity_ = &metrics->AddGauge(
      "tandem_router_instance_capacity_requests_per_second",
      "Requests per second one instance of the role sustains at slo.attainment_target on the "
      "recent length mix (router.latency_model)",
      {"instance_role"});
}

ReplicaAdviceLoop::~ReplicaAdviceLoop() { Stop(); }

StatusOr<ReplicaAdviceLoop::Inputs> ReplicaAdviceLoop::MakeInputs(const ClusterConfig& config) {
  Inputs inputs;
  inputs.config = config;
  if (config.router.recommend_interval_s <= 0) return inputs;
  // ValidateForServing refuses recommend_interval_s without a latency model.
  StatusOr<RouterLatencyModels> models = LoadRouterLatencyModels(config);
  if (!models.ok()) return models.status();
  if (!models->file)
    return InvalidArgument("router.recommend_interval_s: needs router.latency_model");
  inputs.models = models->file;
  return inputs;
}

Status ReplicaAdviceLoop::Start(const ClusterConfig& config) {
  TANDEM_RETURN_IF_ERROR(Reconfigure(config));
  if (!advisor_) return Status::Ok();
  thread_ = std::thread([this] { Loop(); });
  return Status::Ok();
}

Status ReplicaAdviceLoop::Reconfigure(const ClusterConfig& config) {
  TANDEM_ASSIGN_OR_RETURN(Inputs inputs, MakeInputs(config));
  MutexLock lock(&mutex_);
  inputs_ = std::make_shared<const Inputs>(std::move(inputs));
  last_error_.clear();
  wake_.notify_all();
  return Status::Ok();
}

void ReplicaAdviceLoop::Stop() {
  {
    MutexLock lock(&mutex_);
    stopping_ = true;
    wake_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

StatusOr<ReplicaAdvice> ReplicaAdviceLoop::RunOnce() {
  std::shared_ptr<const Inputs> inputs;
  {
    MutexLock lock(&mutex_);
    inputs = inputs_;
  }
  if (!inputs || !inputs->models || !advisor_)
    return FailedPrecondition("replica recommendation is off (router.recommend_interval_s: 0)");
  const RouterSection& router = inputs->config.router;
  TrafficWindow window =
      traffic_->Window(TrafficRecorder::Clock::now(), router.recommend_window_s);
  StatusOr<ReplicaAdvice> advice = advisor_(inputs->config, *inputs->models, window);
  if (!advice.ok()) return advice.status();
  if (recommended_ != nullptr) {
    recommended_->WithLabels({"prefill"}).Set(advice->prefill);
    recommended_->WithLabels({"decode"}).Set(advice->decode);
    offered_->Set(advice->rate_rps);
    capacity_->WithLabels({"prefill"}).Set(advice->prefill_capacity_rps);
    capacity_->WithLabels({"decode"}).Set(advice->decode_capacity_rps);
  }
  return advice;
}

// The analysis does not follow std::unique_lock (which the condition wait needs): mutex_ is
// held except between unlock() and lock().
void ReplicaAdviceLoop::Loop() TANDEM_NO_THREAD_SAFETY_ANALYSIS {
  std::unique_lock<Mutex> lock(mutex_);
  while (!stopping_) {
    const double interval_s = inputs_ ? inputs_->config.router.recommend_interval_s : 0;
    if (interval_s > 0 && inputs_->models) {
      lock.unlock();
      StatusOr<ReplicaAdvice> advice = RunOnce();
      lock.lock();
      // Said once per distinct reason, not every interval.
      std::string error = advice.ok() ? "" : advice.status().message();
      if (!error.empty() && error != last_error_) {
        TANDEM_LOG(kWarn) << "tandem_recommended_replicas not updated: " << error;
      }
      last_error_ = error;
      if (stopping_) break;
      // Reconfigure wakes the wait: a new interval takes effect at once.
      wake_.wait_for(lock, std::chrono::duration<double>(interval_s));
    } else {
      wake_.wait(lock);
    }
  }
}

}  // namespace tandem
