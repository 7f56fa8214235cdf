// The KV transfer interface, split by role.
//
// The unit moved is "a memory region registered once (the whole KV pool) + per layer a list of
// contiguous byte ranges in it". The prefill side (KvPublisher) publishes a request's ranges and
// gets a KvDescriptor to send to the decode side over the control plane; the decode side
// (KvPuller) connects to the publisher once (PeerInfo), pulls the descriptor into ranges of its
// own region, layer by layer, and both sides learn the outcome:
//
//   prefill                                    decode
//   pub->peer_info()  ── PeerInfo (once) ──▶   puller->Connect(info)
//   pub->Publish(id, ranges, on_release)
//                     ── KvDescriptor ─────▶   puller->Pull(desc, my_ranges, callbacks)
//                                              on_layer(0), on_layer(1), ... on_done(status)
//   on_release(status) ◀── TransferResult ──   (sent by the puller itself)
//
// Layer-wise streaming: a publisher may publish a request whose later layers are not computed
// yet. The puller then starts the pull with the number of layers available now and raises it
// with SetLayersAvailable as the publisher announces more (over the control plane: the puller
// has no other channel to the publisher); it never reads layer l before l < available.
//
// Per layer, the publisher's ranges and the puller's ranges are two views of one byte stream:
// they must have the same total length, but may be cut differently (see PlanCopies).
//
// Threads: every method may be called from any thread and returns without waiting on the
// network. Callbacks run on the backend's progress thread: they must be quick and must not call
// back into the same object's blocking helpers (post to a queue instead).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/base/metrics.h"
#include "common/base/status.h"
#include "common/base/thread_annotations.h"
#include "kvtransfer/wire.h"

namespace tandem {

using LayerRanges = std::vector<std::vector<ByteRange>>;

// Called once per published request when the publisher may reuse its ranges: OK when the
// puller reported success, the puller's error when it reported a failure, DeadlineExceeded when
// nobody reported within the lease, Cancelled when the publisher shut down.
using ReleaseCallback = std::function<void(const std::string& request_id, const Status& status)>;

struct PullCallbacks {
  // Layer `layer` is fully in the local ranges (layers complete in order 0, 1, ...). Optional.
  std::function<void(uint32_t layer)> on_layer;
  // Exactly once per accepted Pull, after the last byte landed or after the pull failed. When
  // it runs, nothing of this pull will touch the local ranges any more, so they may be freed.
  // Statuses: OK; DeadlineExceeded (not done within the timeout); Unavailable (peer died or
  // was unreachable); DataLoss/Internal (transport error); Cancelled (puller shut down).
  std::function<void(const std::string& request_id, const Status& status)> on_done;
  // The way back to this request's publisher over the control plane, for a transport whose
  // publisher sends only when asked (nccl: kvtransfer/nccl_protocol.h). Such a puller calls it
  // inside Pull, before Pull returns, with bytes that must reach the publisher's
  // OnPullerMessage in the order of the calls; it refuses a Pull without it
  // (FailedPrecondition). The other transports never call it.
  std::function<void(std::string bytes)> to_publisher;
};

class KvPublisher {
 public:
  virtual ~KvPublisher() = default;

  // What a puller needs to connect; fixed for the publisher's lifetime.
  virtual const PeerInfo& peer_info() const = 0;

  // Offers a request's ranges (offsets into the registered region) for one pull. The ranges
  // must stay unchanged until on_release runs. Returns the descriptor to send to the puller, or
  // InvalidArgument (range outside the region, empty/duplicate request id).
  virtual StatusOr<KvDescriptor> Publish(const std::string& request_id, LayerRanges layers,
                                         ReleaseCallback on_release) = 0;

  // Feeds a result that came over the control plane instead of the transport (the in-process
  // backend, or a decode instance that gives up before pulling). NotFound if not published.
  // on_release runs inside Release, or, where the transport still reads the ranges and cannot
  // stop (nccl: sends posted, which only their peer's receives or the transfer timeout end),
  // once those reads end: StillReading tells which. The ranges stay the caller's to keep until
  // on_release runs, as for Publish.
  virtual Status Release(const TransferResult& result) = 0;

  // Whether `request_id` was released while the transport still reads its ranges: its
  // on_release is still to come, within the transfer timeout. False for a request not
  // published, ended, or on a transport whose reads a release ends (ucx, cuda_ipc, inproc).
  virtual bool StillReading(const std::string& request_id) const {
    static_cast<void>(request_id);
    return false;
  }

  // Requests published and not yet released (those still read after their release included).
  virtual size_t published_count() const = 0;

  // Bytes a puller sent through PullCallbacks::to_publisher, relayed by the servers. Errors are
  // the sender's fault (malformed, another publisher): InvalidArgument, and for transports
  // that take no such messages (ucx, cuda_ipc, inproc) FailedPrecondition.
  virtual Status OnPullerMessage(std::span<const uint8_t> bytes) {
    static_cast<void>(bytes);
    return FailedPrecondition("transport '" + peer_info().transport +
                              "' takes no messages from its pullers");
  }
};

// Pull/SetLayersAvailable: every layer of the descriptor may be read.
inline constexpr uint32_t kAllLayers = UINT32_MAX;

class KvPuller {
 public:
  virtual ~KvPuller() = default;

  // Connects to a publisher (idempotent per instance_id; the remote key is unpacked once and
  // cached). A peer that failed is forgotten, so connecting to its restarted incarnation (new
  // instance_id) works. Errors: InvalidArgument (wrong transport, bad address or key).
  virtual Status Connect(const PeerInfo& peer) = 0;

  // Starts pulling `descriptor` into `local` (ranges of this puller's region). Returns an error
  // without calling any callback when the request cannot start: NotFound (publisher not
  // connected), InvalidArgument (ranges out of bounds, layer sizes differ), FailedPrecondition
  // (request id already being pulled, puller stopping). Otherwise on_done runs exactly once.
  // Only layers [0, layers_available) are read until SetLayersAvailable raises the count.
  // Timeouts (the backend's): moving the available bytes is bounded by the transfer timeout,
  // counted from the start and restarted whenever SetLayersAvailable raises the count; the wait
  // for the next layer to be announced (every available one landed) does not count there and
  // has a bound of its own (the publisher computing a layer may take longer than moving it),
  // so a publisher that stops announcing layers fails the pull with DeadlineExceeded.
  virtual Status Pull(const KvDescriptor& descriptor, LayerRanges local, PullCallbacks callbacks,
                      uint32_t layers_available = kAllLayers) = 0;

  // Raises the layers of a pull in flight that may be read (a lower value than before is
  // ignored; kAllLayers: all). NotFound when the request is not being pulled (done already).
  // FailedPrecondition when the backend cannot stream (NCCL).
  virtual Status SetLayersAvailable(const std::string& request_id, uint32_t layers) = 0;

  // Pulls started and not yet done.
  virtual size_t inflight_count() const = 0;
};

// One copy of a pull: `length` bytes from remote offset to local offset. A tensor-parallel
// instance has a pool per rank (kvtransfer/sharded_copies.h): the pools the offsets are in.
struct CopyPiece {
  uint32_t layer = 0;
  uint64_t remote_offset = 0;
  uint64_t local_offset = 0;
  uint64_t length = 0;
  uint32_t remote_pool = 0;
  uint32_t local_pool = 0;
};

// Cuts each layer's remote and local ranges into pieces that are contiguous on both sides, then
// merges neighbours that continue each other on both sides (CoalesceCopies). InvalidArgument
// when the layer counts or a layer's total length differ, or when a range is not inside
// [0, remote_bytes) / [0, local_bytes). Zero-length ranges are skipped.
StatusOr<std::vector<CopyPiece>> PlanCopies(const LayerRanges& remote, uint64_t remote_bytes,
                                            const LayerRanges& local, uint64_t local_bytes);

// Merges each piece into the one before it when both are of one layer and one pair of pools
// and it continues that one on both sides: a run of blocks adjacent in both pools (a fresh
// pool, or blocks freed and reused in order) moves as one get, message or memcpy instead of one
// per block. The order of the bytes on either side is unchanged.
void CoalesceCopies(std::vector<CopyPiece>* pieces);

// Checks that every range lies inside a region of `region_bytes`.
Status CheckRanges(const LayerRanges& layers, uint64_t region_bytes);

// The kvtransfer metrics of DESIGN.md, registered in one registry. Thread-safe.
class TransferMetrics {
 public:
  explicit TransferMetrics(MetricsRegistry* registry);  // nullptr: metrics off
  void Started();
  // seconds: the time the pull could move bytes (for a layer-wise pull, less the time it
  // waited with every available layer landed and none more announced).
  void Succeeded(double seconds, uint64_t bytes);
  // reason: "timeout", "peer_unavailable", "transport", "cancelled", "invalid", "refused",
  // "released"
  void Failed(double seconds, std::string_view reason);
  static std::string_view ReasonFor(const Status& status);

 private:
  Histogram* seconds_ = nullptr;
  Counter* bytes_ = nullptr;
  Family<Counter>* failures_ = nullptr;
  Gauge* inflight_ = nullptr;
};

// A blocking view of PullCallbacks for tests and tools: pass callbacks() to Pull, then Wait.
class PullWaiter {
 public:
  PullCallbacks callbacks();
  // Returns the pull's status, or DeadlineExceeded if on_done did not run within `timeout`.
  Status Wait(std::chrono::milliseconds timeout);
  uint32_t layers_done() const;

 private:
  struct State {
    Mutex mutex;
    std::condition_variable_any cv;
    std::optional<Status> status TANDEM_GUARDED_BY(mutex);
    uint32_t layers_done TANDEM_GUARDED_BY(mutex) = 0;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace tandem
