// The publisher and puller of the NCCL KV transport, over any link that pairs transfers by
// posting order (OrderedLink): NcclLink on GPUs (kvtransfer/nccl/nccl_transport.h), a CPU pair in
// the tests (tests/unit/kvtransfer_nccl_endpoints_test.cc). Everything here is host code: the
// leases, the links per peer, the pull orders and their sequence, what a link failure fails.
// The protocol and the guarantees are kvtransfer/nccl_protocol.h's and nccl_transport.h's; the
// publisher is nccl_publisher.cc, the puller nccl_puller.cc.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/metrics.h"
#include "common/base/status.h"
#include "kvtransfer/sharded_copies.h"
#include "kvtransfer/transfer.h"
#include "kvtransfer/wire.h"

namespace tandem {

// Two ranks that match each other's transfers by posting order: the i-th transfer posted on
// rank 0 (sends) pairs with the i-th on rank 1 (receives), message by message, after a 32-byte
// header (kvtransfer/nccl_protocol.h) that rank 0 writes and rank 1 checks.
class OrderedLink {
 public:
  // `rows` rows of `bytes` each, row i at data + i * stride: a strided copy's side
  // (kvtransfer/sharded_copies.h StridedCopy). The link moves a layer's messages as
  // PlanLayerSends (kvtransfer/nccl_packing.h) says: both ranks see the same rows and lengths.
  struct Message {
    uint32_t layer = 0;
    void* data = nullptr;  // in the region (device memory for NCCL)
    uint64_t bytes = 0;    // of each row
    uint64_t rows = 1;
    uint64_t stride = 0;   // rows > 1: at least `bytes`
    uint64_t total() const { return bytes * rows; }
  };
  struct Transfer {
    std::string request_id;
    uint32_t layers = 0;  // how many
    uint64_t total_bytes = 0;
    bool held = true;  // rank 0: the header's "held" flag (false: the messages are filler)
    // Layers [first_layer, first_layer + layers): one group each, in order; every message's
    // layer is one of them.
    uint32_t first_layer = 0;
    std::vector<Message> messages;  // layer-major
    std::chrono::steady_clock::time_point deadline;
    std::function<void(uint32_t layer)> on_layer;  // optional
    // Exactly once, on the link's thread: OK; NotFound (rank 1: the header said "gone"); else
    // the link's failure (DeadlineExceeded for the transfer that timed out, DataLoss for the
    // one whose header was out of step, Unavailable for the others).
    std::function<void(const Status& status)> on_done;
  };

  // Fails what is still in flight (Cancelled) and may run those callbacks in the caller, and
  // may wait (an NCCL link's frees wait for its GPU to go idle): the endpoints let go of links
  // outside their lock, on a thread of their own (common/base/reaper.h), and wait for those
  // only in their destructors.
  virtual ~OrderedLink() = default;
  // OK while usable (setting up included); else why it failed (it stays dead).
  virtual Status health() const = 0;
  // Queues a transfer; returns its place on the link (0, 1, 2, ...: the header's seq). Errors
  // (on_done will not run): Unavailable (dead), ResourceExhausted, FailedPrecondition.
  virtual StatusOr<uint64_t> Post(Transfer transfer) = 0;
  // Every transfer in flight fails with `reason`; the link is dead. Returns at once: the
  // callbacks run on the link's thread (the endpoints call it holding their lock).
  virtual void Abort(const Status& reason) = 0;
  virtual size_t inflight_count() const = 0;
};

// How the endpoints make links: the puller draws a unique id and starts rank 1 with it; the
// publisher starts rank 0 with the id from the puller's first order. `pool`: the local pool the
// link's end reads or writes (for NCCL, the GPU it runs on).
struct OrderedLinkMaker {
  std::function<StatusOr<std::string>()> new_unique_id;
  std::function<StatusOr<std::shared_ptr<OrderedLink>>(std::string_view unique_id, int rank,
                                                       int pool)>
      start;
};

struct PullDrivenOptions {
  std::chrono::milliseconds timeout{5000};  // per transfer (a batch of layers), from its Post
  // Puller, layer-wise: the longest wait for the next layers to be made available
  // (SetLayersAvailable) once every layer ordered so far has landed.
  std::chrono::milliseconds layer_wait_timeout{5000};
  std::chrono::milliseconds lease_timeout{60000};  // publisher: unreleased publications
  MetricsRegistry* metrics = nullptr;              // puller: tandem_kv_transfer_*
};

// Limits: a publisher serves at most kMaxPullDrivenLinks links (an order for more is
// ResourceExhausted) and closes links unused for kIdleLinkSeconds; the puller replaces its
// links idle for half that, and refuses a pull whose order would not fit a KvTransport.
inline constexpr size_t kMaxPullDrivenLinks = 1024;
inline constexpr int kIdleLinkSeconds = 60;

// An instance's KV pools: shape.degree of them, pool r its rank r's (kvtransfer/sharded_copies.h;
// ranges are offsets in each). Tensor parallelism on either side: a pull moves each KV head from
// the publisher pool that holds it to the puller pool that wants it, one link per pair of pools
// (kvtransfer/nccl_protocol.h PlanNcclPairs), re-sharding when the degrees differ.
// The publisher's PeerInfo: transport "nccl", a new instance_id, its shape in packed_rkey
// (EncodeKvPoolShape), region_bytes = one pool's bytes.
// Errors: InvalidArgument (a shape that does not validate, not one region of at least
// shape.pool_bytes() per rank, a maker without functions).
StatusOr<std::unique_ptr<KvPublisher>> CreatePullDrivenPublisher(std::vector<MemoryRegion> pools,
                                                                 const KvPoolShape& shape,
                                                                 PullDrivenOptions options,
                                                                 OrderedLinkMaker maker);
StatusOr<std::unique_ptr<KvPuller>> CreatePullDrivenPuller(std::vector<MemoryRegion> pools,
                                                           const KvPoolShape& shape,
                                                           PullDrivenOptions options,
                                                           OrderedLinkMaker maker);

}  // namespace tandem
