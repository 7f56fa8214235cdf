// ClusterBackend's per-instance and per-request state, shared by cluster_backend.cc (connections,
// heartbeats) and cluster_backend_requests.cc (placement and the token streams). Private to
// those two files. Every field is guarded by ClusterBackend::mutex_ (the struct members cannot
// name it; router/cluster_backend.h marks the containers that hold them).
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "router/cluster_backend.h"

namespace tandem {

struct ClusterBackend::Instance {
  std::string name;
  std::string address;
  InstanceRole role = InstanceRole::kPrefill;
  std::shared_ptr<ControlConnection> connection;
  uint64_t generation = 0;  // bumps per connection, so late handlers of an old one are ignored
  // The router's session with the instance on `connection`: the instance_id of the Hello the
  // router sent there (random, new per connection); 0 without a connection.
  uint64_t session = 0;
  bool connecting = false;
  bool greeted = false;
  // Its address left the DNS name: no new requests; closed once it holds none; back if the
  // address returns.
  bool retired = false;
  Hello hello;
  LoadReport load;  // the latest report plus what this router submitted that it lacks
  // Requests this router sent here that the latest report does not include yet (a report lags:
  // a server computes it after each engine step, and takes in new requests only between
  // steps). Without them every report would erase the count of what was just placed, and a
  // burst would all land on the instance that looked emptiest. First instance: Submits with
  // seq > the report's last_submit_seq. Decode instance: requests from placement until a report
  // that follows the instance's first output for them (kDecoding; reports and tokens share the
  // connection, in order).
  struct Pending {
    uint64_t seq = 0;  // Submit::seq; 0 for decode entries
    std::string request_id;
    int64_t prompt_tokens = 0;
  };
  uint64_t next_submit_seq = 1;
  std::deque<Pending> unseen_submits;
  std::vector<Pending> incoming_handoffs;
  Clock::time_point connected_at;
  Clock::time_point last_heard;
  Clock::time_point next_attempt;
  double backoff_s = 0;
  // Decode/colocated: the residents arriving requests found here lately (router/placement.h).
  ResidentAverage typical;
};

struct ClusterBackend::Request {
  std::string id;
  std::function<void(BackendEvent)> on_event;
  RequestPhase phase = RequestPhase::kPrefilling;  // changes only through Advance()
  int prefill = -1;  // indices into instances_, -1 = none
  int decode = -1;
  int colocated = -1;
  uint64_t placed_order = 0;  // the router's count of Submit calls when it was placed
  int64_t prompt_tokens = 0;
  int32_t max_tokens = 0;
  int32_t generated = 0;  // tokens received from any of its instances
  Clock::time_point cancelled_at;                     // kCancelling: when
  std::optional<Clock::time_point> prefill_lost_at;  // kHandingOff: its prefill went away then
  // kPrefilling: decode's events that overtook prefill's first token (the last may be final).
  std::deque<BackendEvent> held_back;
  // Delivery: events queued under the backend's mutex, delivered by one thread at a time.
  std::deque<BackendEvent> queue;
  bool delivering = false;

  void Advance(RequestPhase to) { phase = tandem::Advance(phase, to); }
  bool finished() const { return phase == RequestPhase::kFinished; }
};

// The load snapshot one placement sees. Not copyable: `input` points into the vectors.
struct ClusterBackend::Snapshot {
  Snapshot() = default;
  Snapshot(const Snapshot&) = delete;
  Snapshot& operator=(const Snapshot&) = delete;
  std::vector<InstanceLoad> prefill, decode, colocated;
  PlacementInput input;
};

}  // namespace tandem
