// The prefill side of the KV handoff: for every request on this prefill instance, where it is
// between Submit and the moment its blocks are free again, as one state with one transition
// function:
//
//   kQueued ──▶ kPrefilling ──▶ kPublished ──▶ kReleased
//      │             │               │
//      └─────────────┴───────────────┴────────▶ kFailed
//   kQueued ──▶ kPublished    (handed off after the pass: not layer-wise)
//   kQueued ──▶ kReleased     (the request ended at its first token; nothing was published)
//
//   kQueued      in the prefill engine's queue; the engine owns its blocks.
//   kPrefilling  layer-wise: its KV is published and KvReady went to decode before the pass that
//                computes its last chunk; KvProgress follows per layer. The handoff holds the
//                blocks from here on.
//   kPublished   the first token is known (KvReady, or KvProgress after a layer-wise pass);
//                the blocks are held for decode until, whichever comes first: decode's
//                KvReleased (the one release path: the transport does not report as well,
//                kvtransfer/factory.h), Cancel, loss of that decode connection, or
//                prefill.kv_hold_timeout_s.
//   kReleased / kFailed  terminal: the entry is gone and the blocks are free, or, when the
//                transport still reads them after the release (nccl: sends posted, which cannot
//                be withdrawn; KvPublisher::StillReading), draining: freed once the publisher's
//                release callback reaches the engine thread (within transfer.timeout_s), or at
//                the latest after prefill.kv_hold_timeout_s more.
// Any other transition is a bug and aborts (TANDEM_CHECK).
//
// After a handoff the request's Finish is the decode instance's to send; before it, prefill's
// (to the connection the Submit came on: the request's router session).
//
// Threads: the engine thread only. Outbound connections go through the InstanceHost.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/base/metrics.h"
#include "common/base/status.h"
#include "common/base/thread_annotations.h"
#include "common/net/control_wire.h"
#include "common/serving/instance_host.h"
#include "kvtransfer/transfer.h"
#include "prefill/prefill_engine.h"

namespace tandem {

enum class HandoffState { kQueued, kPrefilling, kPublished, kReleased, kFailed };
const char* HandoffStateName(HandoffState state);
// Whether `from` may become `to`.
bool HandoffTransitionAllowed(HandoffState from, HandoffState to);

struct KvHandoffOptions {
  double hold_timeout_s = 20;  // prefill.kv_hold_timeout_s
  bool layerwise = false;      // transfer.layerwise over a backend that streams
};

class KvHandoff {
 public:
  using Clock = std::chrono::steady_clock;

  // `host`, `engine` and `publisher` must outlive the handoff. `failures` (may be null) counts
  // requests whose KV could not be handed to decode.
  KvHandoff(InstanceHost& host, PrefillEngine& engine, KvPublisher& publisher,
            KvHandoffOptions options, Counter* failures);
  // The publisher's release callbacks that come later are dropped (the host has stopped).
  ~KvHandoff();
  KvHandoff(const KvHandoff&) = delete;
  KvHandoff& operator=(const KvHandoff&) = delete;

  // A Submit taken into the engine's queue: kQueued. `router` is the connection it came on.
  void Queue(const Submit& submit, ConnId router);

  // Layer-wise, before the pass computing r's last chunk: publishes r's blocks and sends
  // KvReady without a first token (kPrefilling). False when it could not (the request then
  // fails after the pass, before its first token goes out).
  bool Announce(const PrefillRequest& r);
  // Layer-wise, during the pass: layers [0, layers_ready) of the announced requests are computed.
  void LayersComputed(int32_t layers_ready);
  // After the pass: the request's first token is sampled. Sends the token to the router, then
  // hands the KV to decode (or finishes the request when it ended here).
  void FirstTokenSampled(Prefilled done);

  // KvReleased from decode: kPublished ends (kReleased, or kFailed with decode's error).
  void Released(const std::string& id, const Status& status);
  // Cancel from the router: a queued request ends with a Finish; a handed-off one releases its
  // KV (decode sends the Finish).
  void Cancel(const std::string& id);
  // A connection closed: requests held for that decode instance are released, and requests
  // still queued for that router session are dropped (the router has failed them).
  void ConnectionClosed(ConnId conn);
  // Releases holds older than hold_timeout_s (and frees draining blocks the transport kept
  // that long past their release: a transport bug, logged).
  void ExpireHolds();
  // The publisher released `id` (its release callback, posted to the engine thread): blocks
  // kept draining for it are freed.
  void TransportReleased(const std::string& id);
  // Ends every request with `why` (drain over).
  void FailAll(const Status& why);

  size_t held() const;  // kPrefilling + kPublished
  size_t draining() const { return draining_.size(); }  // released, blocks still read
  bool empty() const { return requests_.empty() && draining_.empty(); }

 private:
  // Carries the publisher's release callbacks (any thread) to the engine thread while the
  // handoff lives.
  struct ReleaseRelay {
    Mutex mutex;
    InstanceHost* host TANDEM_GUARDED_BY(mutex) = nullptr;  // null once the handoff is gone
    KvHandoff* handoff = nullptr;
  };
  struct Draining {
    std::vector<int32_t> blocks;
    Clock::time_point deadline;  // freed then, whatever the transport says
  };
  struct Entry {
    HandoffState state = HandoffState::kQueued;
    ConnId router = 0;            // where Tokens/Finish go
    uint64_t decode_session = 0;  // Submit.decode_session, passed on as KvReady.router_session
    std::string decode_address;
    ConnId decode = 0;            // kPrefilling/kPublished: the connection KvReady went on
    std::vector<int32_t> blocks;  // kPrefilling/kPublished: the held blocks
    Clock::time_point deadline;   // kPublished: the hold ends
    Status announce_error;        // kQueued, layer-wise: announcing failed
  };

  // The one transition function: checks the edge, frees the blocks on entering a terminal
  // state (and drops the transport's publication), and erases the entry then.
  void Transition(const std::string& id, Entry& entry, HandoffState to, const Status& why);
  // Publishes `blocks` and builds the KvReady (without prompt, token or layers) on success.
  StatusOr<KvReady> Publish(const std::string& id, Entry& entry,
                            const std::vector<int32_t>& blocks);
  void HandOff(Prefilled& done, Entry& entry);
  void SendFinish(ConnId router, const std::string& id, const Status& status,
                  const std::string& reason, int32_t completion_tokens);
  Clock::time_point HoldDeadline() const;

  InstanceHost& host_;
  PrefillEngine& engine_;
  KvPublisher& publisher_;
  const KvHandoffOptions options_;
  Counter* failures_;
  std::string peer_info_blob_;
  std::map<std::string, Entry> requests_;
  std::map<std::string, Draining> draining_;  // terminal, blocks kept for the transport
  std::shared_ptr<ReleaseRelay> relay_ = std::make_shared<ReleaseRelay>();
  std::vector<std::string> announced_;  // during one pass: the kPrefilling requests announced
};

}  // namespace tandem
