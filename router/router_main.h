// `tandem router --config FILE [--SECTION.KEY=VALUE ...]`: the OpenAI-compatible HTTP front end
// (router/router_service.h) over the cluster's control plane (router/cluster_backend.h).
//
// Serves on router.host:router.port. SIGHUP, or a change of the config file's contents (polled
// every router.config_watch_interval_s), reloads it (with the same overrides) and applies its
// placement policy, SLOs and replica recommendation settings to new requests; requests in flight
// continue. SIGTERM/SIGINT drain: no new connections, in-flight requests finish (bounded by
// --drain-timeout-s, default 30), then
// the process exits 0. Exit 1 on a start-up failure (config, model, port), 2 on bad flags. The
// flags, config snapshot, logging and signals are the shared role main's
// (common/serving/role_main.h); this file builds only what is the router's own.
#pragma once

#include <string>
#include <vector>

#include "router/replica_advice.h"

namespace tandem {

// `advisor` computes tandem_recommended_replicas (router/replica_advice.h); the `tandem` binary
// passes the planner's (cluster/replica_advisor.h). Without one the recommendation is off.
int RouterMain(const std::vector<std::string>& args, ReplicaAdvisor advisor = {});

}  // namespace tandem
