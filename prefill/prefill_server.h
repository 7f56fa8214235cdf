// The prefill instance: Submit drives the prefill engine (prefill/prefill_engine.h); the KV
// handoff (prefill/kv_handoff.h) hands each prefilled request's KV to the chosen decode instance
// and holds it until decode releases it. Everything else (connections, Hello, router sessions,
// load reports, /metrics, drain) is the instance host's (common/serving/instance_host.h).
//
// Messages: Submit (router) -> queue; Cancel (router) -> drop or release; KvReleased (decode)
// -> release. A router session that closes drops its queued requests; a decode connection that
// closes releases what was held for it.
//
// transfer.layerwise (not over NCCL): the handoff starts before the pass that computes a
// request's last prompt chunk (KvReady with no layer ready), KvProgress follows per layer, then
// the first token (or `finished`). Announcing can fail (decode unreachable, publish error): the
// request then fails with that error after the pass, before any token went out.
//
// Threads: as the host's. Stop() drains (bounded by drain_timeout_s), then ends what is left
// with Unavailable; afterwards every block is free.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/serving/instance_setup.h"
#include "common/serving/role_main.h"

namespace tandem {

// Loads the model, allocates the pool with the KV publisher, binds the ports and starts serving.
// Errors: InvalidArgument (prefill.port 0, bad config), Unavailable (port taken), model and
// transport errors.
StatusOr<std::unique_ptr<HostedRole>> StartPrefillServer(const RoleArgs& args);

// `tandem prefill --config FILE --index I [--SECTION.KEY=VALUE ...]`
int PrefillMain(const std::vector<std::string>& args);

}  // namespace tandem
