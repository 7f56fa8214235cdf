// UCX backend of KvPublisher / KvPuller: RMA gets over whatever UCX_TLS allows (tcp, sm, ...).
//
// Each publisher or puller owns one ucp context, one worker and one progress thread; the worker
// is touched only by that thread, callers post commands to it. The region is registered once
// (ucp_mem_map); a puller unpacks a publisher's rkey once per peer. Endpoints use
// UCP_ERR_HANDLING_MODE_PEER: when a peer dies (connection reset, endpoint timeout) every pull
// from it fails with Unavailable and the endpoint is dropped, so a restarted peer (new
// PeerInfo) can be connected again. A pull not done within `timeout` has its gets cancelled and
// fails with DeadlineExceeded; if the gets do not come back shortly after cancellation, the
// peer is treated as hung and dropped like a dead one. The puller sends the TransferResult back
// to the publisher as a UCX active message, which fires the publisher's release callback.
//
// Reads (UcxOptions::reads). UCX has no admission hook: a worker accepts endpoints from anyone
// who reaches its address, and where memory keys are not enforced by hardware (tcp: UCX then
// emulates RMA with messages) it serves remote reads and writes at any address of the process,
// whatever rkey comes with them. So by default (kMessages) the ucp context has no RMA at all and
// the puller asks for each range with an authenticated active message (kvtransfer/ucx_reads.h):
// the publisher answers only a request that carries the mac of the cluster secret for a
// published request, for a range inside it, and sends the bytes back (rendezvous, received
// straight into the puller's pool). kRma (RMA gets with the publisher's rkey) is for fabrics
// whose keys the hardware enforces; ReadsForTls picks it only when no network transport without
// them (tcp) can be in use.
//
// Metrics (when `metrics` is set), on the puller: tandem_kv_transfer_seconds,
// tandem_kv_transfer_bytes_total, tandem_kv_transfer_failures_total{reason},
// tandem_kv_transfers_inflight; on the publisher: tandem_kv_read_refusals_total{reason}
// (malformed | mac | range: read or result messages it would not act on; a stranger's probing
// shows here).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "common/base/metrics.h"
#include "common/base/status.h"
#include "kvtransfer/transfer.h"

namespace tandem {

enum class UcxReads {
  kMessages,  // authenticated read messages; no RMA on the context (the default)
  kRma,       // RMA gets with the publisher's rkey
};

// kRma when every transport in `tls` enforces memory keys (InfiniBand/RoCE verbs: rc, dc, ud
// and their variants; same-host shared memory and copies: sm, shm, posix, sysv, xpmem, cma,
// knem, self; CUDA: cuda_copy, cuda_ipc, gdr_copy); kMessages otherwise, including an empty
// `tls` (UCX's default lets tcp in).
UcxReads ReadsForTls(const std::string& tls);

struct UcxOptions {
  // UCX_TLS for this instance ("tcp", "sm", "tcp,sm,self", ...); empty keeps UCX's default
  // (which honours the UCX_TLS environment variable).
  std::string tls = "tcp";
  // UCX_NET_DEVICES: the interfaces whose addresses the worker offers (and so listens on) for
  // network transports; empty = all. The factory names the one that holds the instance's host.
  std::string net_devices;
  // A pull not finished in this time fails with DeadlineExceeded. Layer-wise pulls: counted
  // from the start and from each SetLayersAvailable that raised the layers, and not while the
  // pull waits, every available layer landed, for the next one to be announced.
  std::chrono::milliseconds timeout{5000};
  // Layer-wise pulls: the longest wait for the next layer to be announced (the publisher is
  // still computing it) before the pull fails with DeadlineExceeded; 0 = `timeout`.
  std::chrono::milliseconds layer_wait_timeout{0};
  // Publisher: a published request nobody reported on within this time is released with
  // DeadlineExceeded (the puller died or gave up without saying so).
  std::chrono::milliseconds lease_timeout{60000};
  // Puller: RMA gets (or read messages) in flight at once, over all pulls.
  size_t max_inflight_gets = 64;
  UcxReads reads = UcxReads::kMessages;
  // The cluster secret (control.secret_file): kMessages needs it on both sides (creation fails
  // with InvalidArgument without it); with it, a publisher also acts only on result messages
  // that carry the request's mac.
  std::string secret;
  // Puller: send each pull's TransferResult to its publisher (which then runs the release
  // callback); publisher: act on them. Off when the caller reports outcomes over its own
  // (authenticated) control plane (kvtransfer/factory.h): the publisher is told once, and acts
  // on no message that arrives over UCX.
  bool report_results = true;
  MetricsRegistry* metrics = nullptr;  // not owned; must outlive the object
  // Puller: copies the bytes of a read reply that UCX delivered in its own (host) buffer, an
  // eager message, into the pool. Null: memcpy. A pool in GPU memory (RegisterUcxPool with
  // cuda) needs one that copies host to device (the factory's: cudaMemcpy); rendezvous replies
  // and RMA gets land in the pool through UCX itself.
  std::function<Status(void* pool_at, const void* bytes, size_t length)> copy_into_pool;
};

// Where a pool's memory is, as UCX registers it.
enum class UcxMemory { kHost, kCuda };

// A KV pool's memory, allocated (or only registered) once by one UCX context; the publisher or
// puller created on it uses that context, so the region is registered once for its lifetime.
// Why UCX allocates it: UCX 1.13's shared-memory RMA (posix/sysv, transports "sm"/"shm") only
// reaches memory that UCX allocated (ucp_mem_map with UCP_MEM_MAP_ALLOCATE, shared memory first
// per UCX_ALLOC_PRIO); on memory allocated elsewhere it emulates gets with active messages, at a
// fraction of the bandwidth. Over tcp it makes no difference.
// Shared ownership: the KV cache living in the region keeps the pool alive (KvPoolMemory.owner)
// as does the publisher/puller, so either may be destroyed first. Thread-safe (immutable).
class UcxPool {
 public:
  virtual ~UcxPool() = default;
  virtual MemoryRegion region() const = 0;
  // The UCX_TLS the pool's context was created with (its publisher/puller use the same).
  virtual const std::string& tls() const = 0;
};

// Allocates `bytes` (page-aligned, zeroed) with UCX_TLS = options.tls. Errors: InvalidArgument
// (zero bytes, bad tls), Internal (UCX init or allocation failed).
StatusOr<std::shared_ptr<UcxPool>> AllocateUcxPool(size_t bytes, const UcxOptions& options);

// Registers memory allocated elsewhere as a pool, with UCX_TLS = options.tls: `memory` kCuda is
// GPU memory (cudaMalloc), which only a UCX with a CUDA transport among options.tls can move
// (ProbeUcx(tls).cuda_memory; the caller checks). `owner` keeps the memory alive as long as the
// pool. Errors: InvalidArgument (empty region, bad tls), Internal (UCX refused the region).
StatusOr<std::shared_ptr<UcxPool>> RegisterUcxPool(MemoryRegion region, UcxMemory memory,
                                                   std::shared_ptr<void> owner,
                                                   const UcxOptions& options);

// Registers `region` (not owned; must stay mapped until the publisher is destroyed) and starts
// the progress thread. Errors: InvalidArgument (empty region), Internal (UCX init failed).
// Destroying the publisher releases every lease still open with Cancelled.
StatusOr<std::unique_ptr<KvPublisher>> CreateUcxPublisher(MemoryRegion region,
                                                          const UcxOptions& options);

// A publisher over a pool from AllocateUcxPool; options.tls is ignored (the pool's is used).
StatusOr<std::unique_ptr<KvPublisher>> CreateUcxPublisher(std::shared_ptr<UcxPool> pool,
                                                          const UcxOptions& options);

// As CreateUcxPublisher for the decode side. Destroying the puller fails every pull in flight with
// Cancelled (on_done runs before the destructor returns) and closes all endpoints.
StatusOr<std::unique_ptr<KvPuller>> CreateUcxPuller(MemoryRegion region,
                                                    const UcxOptions& options);
StatusOr<std::unique_ptr<KvPuller>> CreateUcxPuller(std::shared_ptr<UcxPool> pool,
                                                    const UcxOptions& options);

}  // namespace tandem
