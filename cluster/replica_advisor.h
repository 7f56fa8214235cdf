// The router's replica recommendation (router/replica_advice.h), computed as `tandem plan`
// sizes a cluster: the offered rate R of the window, and per role the capacity c of one
// instance of the configured shape on the window's length mix (MeasurePhaseCapacity: that
// phase simulated alone on router.latency_model, at slo.attainment_target of slo.ttft_s for
// prefill and slo.tpot_s for decode); recommended = max(1, ceil(R / c)) (DistServe's n =
// ceil(R / rate) per phase).
//
// Lives in cluster/ because it runs the simulator; the router gets it as a function.
#pragma once

#include "common/base/status.h"
#include "common/config/config.h"
#include "common/engine/latency_model.h"
#include "router/replica_advice.h"
#include "router/traffic_recorder.h"

namespace tandem {

// At most this many of the window's newest samples make the length mix (the simulation cost
// stays bounded whatever the traffic).
inline constexpr size_t kReplicaAdviceMaxSamples = 1000;

// FailedPrecondition naming the role and objective when one instance meets it at no rate;
// InvalidArgument when the latency model has no entry for a configured shape.
StatusOr<ReplicaAdvice> RecommendReplicas(const ClusterConfig& config,
                                          const LatencyModelFile& models,
                                          const TrafficWindow& window);

}  // namespace tandem
