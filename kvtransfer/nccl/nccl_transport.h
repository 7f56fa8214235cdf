// KV transfer over NCCL point-to-point (ncclSend/ncclRecv) between the GPU memory of two
// processes, on one node or across nodes (transfer.backend: nccl).
//
// Pull-driven (kvtransfer/nccl_protocol.h has the protocol and its checks): the decode side
// posts its receives and sends the prefill side a pull order over the control plane; the
// prefill side posts the matching sends. A link is one 2-rank NCCL communicator between one
// puller pool (rank 1, whose process makes the unique id and so hosts NCCL's bootstrap) and one
// publisher pool (rank 0), made by the puller at its first pull that needs that pair:
//
//   decode (puller)                                   prefill (publisher)
//   Connect(peer_info: the publisher's pool shape)
//   Pull(desc, ranges, callbacks, available):
//     plan the pairs of pools (PlanNcclPairs)
//     a pair without a link: a new one
//     (ncclGetUniqueId, rank 1, init in background)
//     per pair, post receives for the layers
//     available (header + pieces)
//     callbacks.to_publisher(NcclPullOrder) ── KvTransport ──▶ OnPullerMessage(order):
//                                                     the same plan; a new unique id: join
//                                                     that link (rank 0); per pair, post the
//                                                     sends: the lease's ranges with a "held"
//                                                     header, or filler with "gone"
//   SetLayersAvailable(id, n): the same for the next layers, one order more (layer-wise,
//     once an eighth of the layers or the last one is newly available: at most 8 orders)
//   on_layer(l) once every pair has layer l, on_done(OK / NotFound ...) once all are done
//
// What each side guarantees:
//  * Order. Orders of one link carry 0, 1, 2, ...; the publisher posts them in that order and
//    refuses (aborting that link) an order out of step. Each request starts with a 32-byte
//    header the puller checks: another order or request there means the link is out of step
//    (DataLoss for that pull, Unavailable for the others on the link, the link aborted); a "gone"
//    header fails only that pull (NotFound: the publisher released the request before the order
//    came).
//  * Messages: a link joins one publisher pool and one puller pool (tensor parallelism: a pool
//    per GPU on each side) and carries the pieces that PlanNcclPairs gives that pair: both sides
//    compute the plan from the publisher's ranges and shape and the puller's, which the order
//    carries; the KV heads are re-sharded on the way when the degrees differ. A re-sharded
//    head's slices of a run of blocks are one strided message, packed with the layer's others
//    into the link's staging buffer and sent as one NCCL message per round of at most
//    kLinkStagingBytes (kvtransfer/nccl_packing.h); contiguous messages go straight.
//  * Release. The publisher's lease ends when its sends completed (on_release OK), or by
//    Release(). A send cannot be withdrawn: a Release while sends are posted ends the lease
//    once they end (the puller's receives take them, or the timeout fails the link), and only
//    then runs on_release with the release's status (StillReading says so meanwhile), so the
//    ranges are not reused under a send and the link stays in step for its other requests.
//  * Faults. Completion is a cudaEvent per layer polled by the link's progress thread. A transfer
//    (a batch of layers of one pair) not done within `timeout` of its Post (the link's setup
//    included), an asynchronous NCCL error (dead or hung peer: ncclCommGetAsyncError) or a CUDA
//    error aborts the communicator (ncclCommAbort), waits for the stream to drain, and fails
//    every transfer of the link: the one that timed out with DeadlineExceeded, the others with
//    Unavailable. A dead link is replaced by a new one (new unique id) at the puller's next
//    order. Layer-wise, a pull whose ordered layers all landed and that waits longer than
//    `layer_wait_timeout` for the next ones fails alone (DeadlineExceeded); its links go on.
//  * Limits: at most 1024 links per publisher; the publisher closes links unused for 60 s, the
//    puller stops using its links after 30 s idle (a new one then), so it never orders on a
//    closed one; an order must fit a control message (16 MiB), else the pull is refused.
//
// Memory: pool r is device memory on CUDA device r (cudaMalloc: the KV pools); it is not
// registered with NCCL (ncclCommRegister is an optimisation left out). Every link holds a
// staging buffer of kLinkStagingBytes (16 MiB) on its GPU, made when the link is set up, before
// its communicator (no cudaMalloc while NCCL kernels of the link are posted: the allocator may
// wait on the device), and freed with the link. NCCL refuses two ranks of one communicator on
// one GPU: publisher and puller need different GPUs.
// Threads: all methods are thread-safe and return without waiting on the network; every NCCL
// call on a communicator is made by its link's progress thread, where callbacks run.
//
// Built only with the CUDA backend (kvtransfer/nccl/*.cc go to tandem_cuda): NcclLink and
// nothing else. The protocol (kvtransfer/nccl_protocol.h) and the publisher and puller
// (kvtransfer/nccl_endpoints.h) are host code, tested on the CPU over a CPU link pair
// (tests/unit/kvtransfer_nccl_*_test.cc); the link runs only on GPUs:
// tests/gpu/nccl_transfer_check.cc (two GPUs) and tests/gpu/run.sh's NCCL cluster.
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
#include "kvtransfer/nccl/nccl_bootstrap_root.h"
#include "kvtransfer/nccl_endpoints.h"
#include "kvtransfer/nccl_protocol.h"
#include "kvtransfer/transfer.h"
#include "kvtransfer/wire.h"

namespace tandem {

// A new ncclUniqueId as 128 bytes, to ship to the other rank. The process that calls this hosts
// NCCL's bootstrap root for the communicator, until every rank has checked in (the puller's
// ids come from children instead, where it can: kvtransfer/nccl/nccl_bootstrap_root.h).
// Errors: Unavailable (no network interface for the bootstrap), Internal.
StatusOr<std::string> CreateNcclUniqueId();

// A 2-rank communicator and the stream, events and progress thread that drive it.
class NcclLink final : public OrderedLink {
 public:
  // Starts joining the communicator of `unique_id_bytes` as `rank` (0 sends, 1 receives) on
  // CUDA device `device`, and returns at once: the progress thread sets the link up
  // (non-blocking NCCL init, aborted when the other rank has not joined within `timeout`), and
  // transfers posted meanwhile wait for it. A setup that fails fails them and the link.
  // `root`: the child hosting the id's bootstrap root (NcclBootstrapRoots::Claim), if any; the
  // link ends it once its setup has ended, either way.
  // Errors: InvalidArgument (id not 128 bytes, rank not 0/1).
  static StatusOr<std::shared_ptr<NcclLink>> Start(
      std::string_view unique_id_bytes, int rank, int device, std::chrono::milliseconds timeout,
      std::unique_ptr<NcclBootstrapRoot> root = nullptr);

  // Transfers still in flight fail with Cancelled (after the communicator is aborted and the
  // stream drained). The communicator is aborted (ncclCommAbort) in every case: NCCL has no
  // cheaper teardown that cannot wait on the peer.
  ~NcclLink() override;
  NcclLink(const NcclLink&) = delete;
  NcclLink& operator=(const NcclLink&) = delete;

  // OrderedLink. Each transfer is one NCCL group per layer on the link's stream (one more per
  // further packing round), the 32-byte header first in layer 0's group.
  Status health() const override;
  StatusOr<uint64_t> Post(Transfer transfer) override;
  void Abort(const Status& reason) override;
  size_t inflight_count() const override;

  class Impl;

 private:
  explicit NcclLink(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The prefill side (kvtransfer/nccl_endpoints.h over NcclLinks): publishes ranges of its pools
// (device memory, pool r on CUDA device r; not owned, must outlive the publisher) and serves
// pull orders (OnPullerMessage); a link of its pool r runs on device r.
// CreatePullDrivenPublisher's errors.
StatusOr<std::unique_ptr<KvPublisher>> CreateNcclPublisher(std::vector<MemoryRegion> pools,
                                                           const KvPoolShape& shape,
                                                           PullDrivenOptions options = {});

// The decode side (kvtransfer/nccl_endpoints.h over NcclLinks): pulls into its pools (pool s on
// CUDA device s). Connect(peer) accepts a PeerInfo with transport "nccl" and a pool shape of the
// same model; Pull needs PullCallbacks::to_publisher. CreatePullDrivenPuller's errors.
StatusOr<std::unique_ptr<KvPuller>> CreateNcclPuller(std::vector<MemoryRegion> pools,
                                                     const KvPoolShape& shape,
                                                     PullDrivenOptions options = {});

}  // namespace tandem
