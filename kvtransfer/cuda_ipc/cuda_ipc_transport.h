// KV transfer between GPU pools of one machine over CUDA IPC (transfer.backend: cuda_ipc): the
// decode instance maps the prefill instance's KV pool into its own address space and copies
// each request's blocks device to device, layer by layer, on its own stream. Also the path when
// one prefill and one decode process share a single GPU.
//
//   prefill                                           decode
//   pools = cudaMalloc per GPU; cudaIpcGetMemHandle   pools = cudaMalloc per GPU
//   peer_info(): {shape, handles, boot id}  ───────▶  Connect: cudaIpcOpenMemHandle (once each)
//   Publish(id, ranges)      ── KvDescriptor ──────▶  Pull: per layer, a cudaMemcpyAsync per
//                                                     contiguous range, CopyRowsBatch launches
//                                                     for the strided copies (PlanStridedCopies,
//                                                     LayerQueue), then an event; on_layer(l)
//                                                     when it completed
//
// Tensor parallelism (kvtransfer/sharded_copies.h): an instance of degree t has t pools, pool r
// on its GPU r, and ranges in rank 0's offsets. The publisher's PeerInfo carries its pool shape
// and t handles; the puller copies pool to pool, re-sharding the KV heads when its own degree
// differs (one strided copy per KV head, K/V and run of adjacent blocks; a layer's strided
// copies go as a few cuda::CopyRowsBatch launches). The puller maps every
// publisher pool on its GPU 0 and copies on one stream there:
// the GPUs need peer access (NVLink or PCIe P2P), as CUDA IPC between GPUs always does.
//
// The roles and guarantees of kvtransfer/transfer.h hold, with these specifics:
// - One machine: PeerInfo::worker_address carries the publisher's boot id; Connect refuses a
//   publisher on another machine (InvalidArgument naming both) instead of failing obscurely.
// - Results come over the control plane (the servers' KvReleased): the puller does not report
//   to the publisher; Release() does. A publication never released within the lease is dropped
//   (DeadlineExceeded to on_release).
// - Timeouts: the copies of the layers made available must complete within `timeout` of the
//   Pull or of the SetLayersAvailable that raised the count; with every available layer landed,
//   the next must be announced within `layer_wait_timeout`. Either failure is DeadlineExceeded;
//   copies already queued cannot be withdrawn, so on_done waits for them to drain (nothing of the
//   pull touches the local ranges once on_done runs).
// - A publisher that died: its pool stays mapped until the puller closes it (the driver keeps
//   the memory while a mapping exists), so a pull in flight completes with stale bytes; the
//   decode server fails the requests of a dead prefill peer through the control plane. The
//   puller unmaps a publisher's pool once no pull has used it for 30 s (and maps it again for
//   the next pull), so a dead or restarted prefill's memory goes back to its GPU.
// - Callbacks run on the puller's progress thread (one per puller, which polls the events).
//
// Device-only code, built with the CUDA backend (kvtransfer/cuda_ipc/*.cc go to tandem_cuda).
// The bookkeeping it shares with the in-process backend (PlanStridedCopies, LayerQueue) is tested
// on the CPU; this file runs only on a GPU (tests/gpu/run.sh: the 1 prefill + 1 decode cluster).
// Plain C++ declarations: no CUDA headers here.
#pragma once

#include <chrono>
#include <cstddef>
#include <string_view>

#include "common/base/metrics.h"
#include "common/base/status.h"
#include "kvtransfer/factory.h"

namespace tandem {

inline constexpr std::string_view kCudaIpcTransport = "cuda_ipc";

struct CudaIpcOptions {
  std::chrono::milliseconds timeout{5000};             // moving the available layers
  std::chrono::milliseconds layer_wait_timeout{5000};  // waiting for the next layer
  std::chrono::milliseconds lease_timeout{60000};      // publisher: unreleased publications
  MetricsRegistry* metrics = nullptr;                  // puller: tandem_kv_transfer_*
};

// The KV pools of `shape` in device memory (pool r on device r of the process, zeroed, kind
// kCudaDevice) and the publisher or puller over them. Errors: InvalidArgument (a shape that
// does not validate, or more pools than visible devices), Unavailable (no CUDA device),
// ResourceExhausted (out of device memory), Internal.
StatusOr<PublisherWithPool> CreateCudaIpcPublisherWithPool(const KvPoolShape& shape,
                                                           const CudaIpcOptions& options);
StatusOr<PullerWithPool> CreateCudaIpcPullerWithPool(const KvPoolShape& shape,
                                                     const CudaIpcOptions& options);

}  // namespace tandem
