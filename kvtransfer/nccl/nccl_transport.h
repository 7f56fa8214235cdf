// KV transfer over NCCL point-to-point (ncclSend/ncclRecv) between GPU memory of two processes.
//
// A link is one 2-rank NCCL communicator between one prefill instance (rank 0, sends) and one
// decode instance (rank 1, receives), set up through the control plane:
//
//   prefill                                      decode
//   id = CreateNcclUniqueId()  ── 128 bytes ──▶
//   NcclLink::Connect(id, 0, dev, timeout)       NcclLink::Connect(id, 1, dev, timeout)
//   CreateNcclPublisher(link, region)            CreateNcclPuller(link, region)
//   pub->Publish(id, ranges, on_release)
//        (posts the sends now)  ── KvDescriptor ─▶ puller->Pull(desc, my_ranges, callbacks)
//                                                 (posts the matching receives)
//
// The KvPublisher/KvPuller roles of kvtransfer/transfer.h are kept, with what NCCL imposes:
//
//  * Order. NCCL matches sends and receives between two ranks by posting order, so the puller
//    MUST call Pull for the descriptors of one link in the order the publisher called Publish
//    (the order a single control-plane connection delivers them), and must pull every published
//    request. Each request starts with a 32-byte header (sequence number, total bytes, hash of the
//    request id); a receiver that finds a different header fails the pull with DataLoss and
//    the link is aborted (the stream is desynchronised; nothing after it can be trusted).
//  * Messages. Inside a request the messages are, layer-major, the pieces of NcclWireOrder():
//    the publisher's ranges in range order, cut at every multiple of `granule_bytes` of the
//    layer's byte stream (0: no extra cuts). Every piece must fall inside one of the puller's
//    local ranges, else Pull returns InvalidArgument. With the same block size on both sides,
//    granule_bytes = the bytes of one block of one layer makes any block lists compatible.
//    Both sides must use the same granule_bytes.
//  * Release. The publisher's on_release runs when its sends completed (OK: the bytes left its
//    ranges and reached the puller), or with the failure of the link. Release() of a failure
//    for a request whose sends are still posted aborts the link (a send cannot be withdrawn).
//  * Faults. Completion is a cudaEvent per layer polled by the link's progress thread. A
//    transfer not done within `timeout` (default 5 s), an asynchronous NCCL error (dead or hung
//    peer: ncclCommGetAsyncError) or a CUDA error aborts the communicator (ncclCommAbort), waits
//    for the stream to drain, and fails every transfer of the link: the one that timed out with
//    DeadlineExceeded, the others with Unavailable (a peer error is Unavailable for all). After
//    that the link is dead: Publish/Pull return Unavailable; connect a new link (new unique id
//    over the control plane) to reconnect, e.g. to a restarted peer.
//
// Memory: MemoryRegion::base is device memory on the link's device (cudaMalloc or a pool
// carved from it); it is not registered with NCCL (ncclCommRegister is an optimisation left out).
// Threads: all methods are thread-safe and return without waiting on the network; every NCCL
// call on the communicator is made by the link's progress thread. Callbacks run on that thread.
//
// Built only with the CUDA backend (kvtransfer/nccl/*.cc go to tandem_cuda). Test: the GPU
// check tests/gpu/nccl_transfer_check.cc (needs two GPUs: NCCL refuses two ranks on one device).
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
#include "kvtransfer/transfer.h"
#include "kvtransfer/wire.h"

namespace tandem {

inline constexpr size_t kNcclUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
inline constexpr std::string_view kNcclTransport = "nccl";

// A new ncclUniqueId as 128 bytes, to ship to the other rank. The process that calls this hosts
// NCCL's bootstrap root for the communicator, so the prefill side (rank 0) should call it.
// Errors: Unavailable (no network interface for the bootstrap), Internal.
StatusOr<std::string> CreateNcclUniqueId();

// One message of a request on the wire, in wire order.
struct NcclPiece {
  uint32_t layer = 0;
  uint64_t stream_offset = 0;  // position inside the layer's byte stream
  uint64_t remote_offset = 0;  // offset in the publisher's region
  uint64_t length = 0;
};

// The messages of one request, from the publisher's ranges alone: layer-major, range order,
// each range cut at multiples of `granule_bytes` of the layer stream; zero-length ranges skipped.
std::vector<NcclPiece> NcclWireOrder(const LayerRanges& layers, uint64_t granule_bytes);

// A 2-rank communicator and the stream, events and progress thread that drive it.
class NcclLink {
 public:
  // Joins the communicator of `unique_id_bytes` as `rank` (0 = publisher, 1 = puller) on CUDA
  // device `device`. Both ranks must call it; init is non-blocking (ncclConfig_t::blocking = 0)
  // and is aborted when the other rank has not joined within `timeout`.
  // Errors: InvalidArgument (id not 128 bytes, rank not 0/1), Unavailable (no such device,
  // peer unreachable), DeadlineExceeded (init timed out), Internal.
  static StatusOr<std::unique_ptr<NcclLink>> Connect(std::string_view unique_id_bytes, int rank,
                                                     int device,
                                                     std::chrono::milliseconds timeout);

  // Transfers still in flight fail with Cancelled (after the communicator is aborted and the
  // stream drained). The communicator is aborted (ncclCommAbort) in every case: NCCL has no
  // cheaper teardown that cannot wait on the peer.
  ~NcclLink();
  NcclLink(const NcclLink&) = delete;
  NcclLink& operator=(const NcclLink&) = delete;

  int rank() const;
  int device() const;
  // OK while usable; else why the link failed (it is aborted and stays dead).
  Status health() const;

  // One request's messages, posted in order on the link's stream: one NCCL group per layer,
  // the 32-byte header first in layer 0's group.
  struct Message {
    uint32_t layer = 0;
    void* data = nullptr;  // device memory
    uint64_t bytes = 0;
  };
  struct Transfer {
    std::string request_id;
    uint32_t layers = 0;
    uint64_t total_bytes = 0;
    std::vector<Message> messages;  // layer-major
    std::chrono::steady_clock::time_point deadline;
    std::function<void(uint32_t layer)> on_layer;  // optional
    std::function<void(const Status& status)> on_done;
  };
  // Queues a transfer: sends on rank 0, receives on rank 1. on_done runs exactly once unless
  // this returns an error: Unavailable (link dead), ResourceExhausted (too many in flight),
  // FailedPrecondition (link shutting down).
  Status Post(Transfer transfer);

  // Aborts the link: every transfer in flight fails with `reason` (not OK).
  void Abort(const Status& reason);

  size_t inflight_count() const;

  class Impl;

 private:
  explicit NcclLink(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct NcclTransferOptions {
  std::chrono::milliseconds timeout{5000};  // per transfer, from Publish / Pull
  uint64_t granule_bytes = 0;               // see NcclWireOrder; same on both sides
};

// The prefill side over `link` (rank 0). `region` (device memory) is not owned and must outlive
// the publisher. peer_info(): transport "nccl", a random instance_id, the region's size.
// Errors: InvalidArgument (empty region, link is not rank 0).
StatusOr<std::unique_ptr<KvPublisher>> CreateNcclPublisher(std::shared_ptr<NcclLink> link,
                                                           MemoryRegion region,
                                                           NcclTransferOptions options = {});

// The decode side over `link` (rank 1). Connect(peer) accepts a PeerInfo with transport "nccl"
// (the publisher at the other end of the link; a newer instance_id replaces the old one).
// Errors: InvalidArgument (empty region, link is not rank 1).
StatusOr<std::unique_ptr<KvPuller>> CreateNcclPuller(std::shared_ptr<NcclLink> link,
                                                     MemoryRegion region,
                                                     MetricsRegistry* metrics = nullptr,
                                                     NcclTransferOptions options = {});

}  // namespace tandem
