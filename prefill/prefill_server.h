// The prefill instance: FCFS queue batched by token budget (prefill/prefill_scheduler.h), one
// forward pass per batch, the first token sampled and streamed to the router, then the KV handed
// to the chosen decode instance.
//
// Per request: Submit{decode_address} -> queue -> prefill (chunked when the prompt is longer
// than the budget) -> Tokens{first token} to the router. If the request ends at its first token,
// Finish goes to the router and the blocks are freed. Otherwise its blocks are published
// (KvPublisher) and KvReady is sent on a control connection to decode_address (one per address,
// opened on first use, Hello first). The blocks are held until, whichever comes first:
// KvReleased from decode (success or failure), the publisher's own release (the puller's
// TransferResult), Cancel, loss of that decode connection, or prefill.kv_hold_timeout_s.
// After a handoff, the request's Finish is the decode instance's to send.
//
// transfer.layerwise (not over NCCL): the handoff starts before the pass that computes a
// request's last prompt chunk. Its blocks are published and KvReady (no layer ready, no first
// token; the sampling seed fixed now) goes to decode; the pass's after_layer hook sends
// KvProgress{layers_ready = l + 1} for each layer, so decode pulls layer l while prefill computes
// layer l + 1. After sampling, KvProgress carries the first token, or `finished` when the request
// ended there (prefill then sends the Finish; decode releases the KV once its pull is over).
// Announcing can fail (decode unreachable, publish error): the request then fails with that
// error after the pass, before any token went out.
//
// Threads: Asio threads run the connections and the LoadReport timer (100 ms); one engine thread
// owns the queue, the KV pool and every request; the KV publisher's progress thread and the Asio
// threads reach it through an inbox keyed by request id. Connecting to a decode instance happens
// on the engine thread (bounded: 2 s). Start/Stop from one controlling thread; Stop drains
// (bounded) and then ends what is left with Unavailable; afterwards every block is free.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/config/config.h"
#include "common/base/status.h"

namespace tandem {

struct PrefillOptions {
  ClusterConfig config;
  int index = 0;
  double drain_timeout_s = 30;
};

class PrefillServer {
 public:
  // Loads the model, allocates the pool, registers it with the KV publisher, binds the ports.
  // Errors: InvalidArgument (prefill.port 0, bad config), Unavailable (port taken), model and
  // transport errors.
  static StatusOr<std::unique_ptr<PrefillServer>> Start(const PrefillOptions& options);
  ~PrefillServer();  // Stop()

  void Stop();
  int control_port() const;

  struct Impl;

 private:
  PrefillServer() = default;
  std::unique_ptr<Impl> impl_;
};

// `tandem prefill --config FILE --index I [--SECTION.KEY=VALUE ...]`
int PrefillMain(const std::vector<std::string>& args);

}  // namespace tandem
