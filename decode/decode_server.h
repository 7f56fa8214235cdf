// The decode instance (and, with role kColocated, the colocated instance): a control-plane
// server around a BatchEngine.
//
// Decode: prefill instances connect and send Hello, then KvReady per request. A request waits
// in the pull queue until AdmitPulls lets it in (blocks for prompt + 1, KV usage under the
// watermark, a batch slot); then its blocks are allocated and its KV pulled with the KvPuller.
// On success KvReleased OK goes to the prefill instance and the request joins the running batch;
// on failure its blocks are freed, the router gets Finish with the error and prefill gets
// KvReleased with it. A request that waited in the pull queue for prefill.kv_hold_timeout_s
// (less 1 s) fails with DeadlineExceeded instead: prefill has freed (and may reuse) those
// blocks by then. Submit to a decode instance is refused (FailedPrecondition). Colocated: Submit (empty decode_address) is prefilled and decoded here.
// transfer.layerwise: KvReady may come before prefill computed the KV (layers_ready 0, no first
// token). The pull starts as usual with the layers available then; each KvProgress raises them
// (KvPullLink::SetLayersAvailable). Once the first token is known the request joins the running
// batch even though its pull is not over: each step's before_layer(l) waits (bounded by
// transfer.timeout_s + 1 s) until layer l has landed (decode/batch_engine.h KvArrival). If the
// pull fails meanwhile, that step discards the request's output, and the request is failed and
// its blocks freed only after the pull's on_done. KvProgress{finished}: prefill ended the request
// at its first token; it is dropped without a Finish, its KV released when the pull is over.
// tandem_kv_handoff_wait_seconds: from learning the first token to having all of the KV.
// Tokens and Finish go to the router connection (the latest that said Hello as router);
// LoadReport goes to every router connection every 100 ms.
//
// Threads: Asio threads run the connections and the LoadReport timer; one engine thread owns
// the BatchEngine, the pull queue and every request; they meet in an inbox keyed by request id.
// Start/Stop from one controlling thread. Stop drains (bounded), then ends what is left with
// Unavailable; after Stop every request has had its Finish and every block is free.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "common/config/config.h"
#include "common/net/control_wire.h"
#include "common/base/status.h"

namespace tandem {

struct InstanceOptions {
  ClusterConfig config;
  InstanceRole role = InstanceRole::kDecode;  // kDecode or kColocated
  int index = 0;
  double drain_timeout_s = 30;
};

class DecodeServer {
 public:
  // Loads the model, allocates the pool, binds the ports and starts every thread.
  // Errors: InvalidArgument (port 0, bad config), Unavailable (port taken), model errors.
  static StatusOr<std::unique_ptr<DecodeServer>> Start(const InstanceOptions& options);
  ~DecodeServer();  // Stop()

  // Refuses new work, drains in-flight requests for at most drain_timeout_s, then stops.
  void Stop();
  int control_port() const;

  struct Impl;

 private:
  DecodeServer() = default;
  std::unique_ptr<Impl> impl_;
};

// Shared by `tandem decode` and `tandem colocated`: flags, config, logging, signals.
int RunBatchInstanceMain(InstanceRole role, const std::vector<std::string>& args);

// `tandem decode --config FILE --index I [--SECTION.KEY=VALUE ...]`
int DecodeMain(const std::vector<std::string>& args);

}  // namespace tandem
