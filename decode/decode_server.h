// The decode instance (and, with role kColocated, the colocated instance): which control
// messages drive the batch engine (decode/batch_engine.h). Connections, Hello, router sessions,
// load reports, /metrics and drain are the instance host's (common/serving/instance_host.h).
//
// Decode: prefill instances send KvReady per request; the KV intake (decode/kv_intake.h) pulls
// the KV when blocks are free and hands the request to the engine; KvProgress drives layer-wise
// pulls. Submit is refused (FailedPrecondition). Colocated: Submit is prefilled and decoded
// here; there is no KV handoff.
//
// Router sessions: a request belongs to one router session (decode: KvReady.router_session;
// colocated: the connection its Submit came on), and its Tokens and Finish go to that session's
// connection. A KvReady whose session is not open is refused (its KV released to prefill, nothing
// sent to the router); when a session's connection closes, every request of that session is
// dropped at once (blocks freed, KV released).
//
// Cancel: a known request ends with a Finish (Cancelled). A Cancel for a request this instance
// does not know yet leaves a tombstone (bounded, expiring after prefill.kv_hold_timeout_s): a
// later KvReady for it is refused and its KV released at once.
//
// Threads: as the host's. Stop() drains (bounded by drain_timeout_s), then ends what is left
// with Unavailable; after Stop every request has had its Finish and every block is free.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/net/control_wire.h"
#include "common/serving/instance_setup.h"
#include "common/serving/role_main.h"

namespace tandem {

// role: kDecode or kColocated. Loads the model, allocates the pool, binds the ports and starts
// serving. Errors: InvalidArgument (port 0, bad config), Unavailable (port taken), model and
// transport errors.
StatusOr<std::unique_ptr<HostedRole>> StartBatchServer(InstanceRole role, const RoleArgs& args);

// `tandem decode|colocated [--config FILE] [--index I] [--SECTION.KEY=VALUE ...]`
int RunBatchInstanceMain(InstanceRole role, const std::vector<std::string>& args);
int DecodeMain(const std::vector<std::string>& args);

}  // namespace tandem
