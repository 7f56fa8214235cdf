// The one place a transfer backend is chosen: builds a KvPublisher (prefill) or a KvPuller
// (decode) together with the KV pool's memory, from the cluster config's `transfer` section.
// Callers hold a KvPublisher/KvPuller and never learn which transport it is.
//
// Pool memory: for ucx on a cuda instance, device memory registered with a UCX that moves it
// (checked at run time: kvtransfer/ucx_capabilities.h); for cuda_ipc it is device memory, a pool per GPU of the instance
// (kvtransfer/cuda_ipc/cuda_ipc_transport.h; CUDA builds only), exported to the puller's process
// by CUDA IPC handles; for nccl the same pools, moved by NCCL point-to-point
// (kvtransfer/nccl/nccl_transport.h; CUDA builds only); for ucx the transport allocates it (UCX-mapped, so that shared-memory
// transports do RMA on it: kvtransfer/ucx_transport.h UcxPool) and registers it once; for inproc
// it is heap memory as KvCache would allocate. KvPoolMemory.owner keeps it alive, so the cache
// and the publisher/puller may be destroyed in either order.
//
// Shared memory: before a UCX pool is allocated, what killed instances left in shared memory is
// removed (kvtransfer/shm_sweep.h).
//
// Reads: UCX_TLS decides (ReadsForTls): authenticated read messages wherever tcp may carry the
// KV (no RMA on the context: UCX would serve reads and writes by address to anyone), RMA gets
// on fabrics whose memory keys the hardware enforces.
//
// Results: the servers report every pull's outcome over the control plane (KvReleased), so the
// publishers and pullers built here do not report it over the transport as well
// (UcxOptions::report_results off): prefill is told once.
//
// Errors: InvalidArgument for a backend the instance servers do not run (cuda_ipc or nccl on a
// build without CUDA; unknown names), the backends' own errors otherwise.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>
#include <vector>

#include "common/base/metrics.h"
#include "common/base/status.h"
#include "common/config/config.h"
#include "common/engine/device_memory.h"
#include "common/engine/forward_backend.h"
#include "common/engine/kv_cache.h"
#include "common/model/model.h"
#include "kvtransfer/sharded_copies.h"
#include "kvtransfer/transfer.h"

namespace tandem {

// `pools`: one per rank of the instance (one unless tensor parallelism: pool_shape.degree),
// for the engine (ForwardBackend::AdoptKvPools); pools[0] is what KvCache::Create takes.
// The pools are declared first so that they go last: a transport's copies in flight read or
// write them until it is destroyed.
struct PublisherWithPool {
  std::vector<KvPoolMemory> pools;
  std::unique_ptr<KvPublisher> publisher;
};

struct PullerWithPool {
  std::vector<KvPoolMemory> pools;
  std::unique_ptr<KvPuller> puller;
};

struct TransferFactoryOptions {
  // Publisher: a publication nobody released within this long is dropped by the transport (a
  // backstop behind the prefill server's own prefill.kv_hold_timeout_s).
  double lease_timeout_s = 60;
  // Puller, layer-wise: the longest wait for the publisher to announce the next layer
  // (0 = transfer.timeout_s).
  double layer_wait_timeout_s = 0;
  MetricsRegistry* metrics = nullptr;  // not owned; may be null
  // The instance's S.host: the UCX data plane offers only the interface that holds it
  // (loopback: lo); 0.0.0.0 or empty = every interface.
  std::string host;
  // The cluster secret: UCX reads are authenticated with it (UcxReads::kMessages, chosen from
  // transfer.ucx_tls by ReadsForTls). Required for ucx.
  std::string secret;
  // The instance's KV pools (kvtransfer/sharded_copies.h): required by cuda_ipc, whose
  // publisher sends it and whose puller re-shards by it, and by nccl likewise; degree > 1
  // (tensor parallelism: a pool per GPU) only with cuda_ipc or nccl. Set, pool_bytes must be pool_shape.pool_bytes().
  KvPoolShape pool_shape;
  // The instance's S.device: with ucx, "cuda" puts the pool in GPU memory (device 0), which
  // needs a UCX that moves CUDA memory over transfer.ucx_tls (ProbeUcx; Debian's does not:
  // InvalidArgument naming what the UCX at hand moves). cuda_ipc and nccl always use GPU memory.
  std::string device = "cpu";
};

// This machine's identity for transports that work within one machine (cuda_ipc): the kernel's
// boot id (/proc/sys/kernel/random/boot_id), the same in every container and network namespace
// of one host and new at every boot. Internal when it cannot be read.
StatusOr<std::string> MachineBootId();

// The network interface that holds `ip` ("lo" for loopback), or "" for 0.0.0.0 / ::.
// NotFound when no interface of this machine has it.
StatusOr<std::string> InterfaceOfAddress(const std::string& ip);

// The KV pools of an instance of `section` (named `name`: prefill, decode, colocated) serving
// `model` with a backend given `forward` (the engine's BackendOptions): one per rank of
// S.tensor_parallel, all alike, each sized by KvPoolBlocks (the rank's KV heads, block size
// kv_cache.block_size) against one device's memory less what that device holds besides: on a
// GPU the rank's weights, its forward buffers (PlanCudaWorkspaces) and the transfer's
// (TransferDeviceBytes). On a GPU it then checks every rank's GPU has room for all of it now,
// before anything is allocated: ResourceExhausted naming kv_cache.memory_fraction (or
// <name>.kv_blocks) and the sizes otherwise (CheckDeviceMemoryFits). InvalidArgument naming
// <name>.tensor_parallel when the model does not split that many ways; KvMemoryBudgetBytes' and
// KvPoolBlocks' errors.
// `plan` (optional): on a GPU, what was planned and what each GPU had free, for
// DescribeDeviceMemoryUse once the instance is up; left empty on the CPU.
StatusOr<KvPoolShape> InstanceKvPools(const ClusterConfig& config, const InstanceSection& section,
                                      std::string_view name, const Model& model,
                                      const ForwardOptions& forward,
                                      DeviceMemoryPlan* plan = nullptr);

// Once an instance is up (its pool, weights and buffers allocated): logs, per GPU of `plan`
// (InstanceKvPools'), what start-up took against what was planned (DescribeDeviceMemoryUse), at
// warning level where the unplanned part exceeds the margin. Nothing for an empty plan (cpu).
void LogDeviceMemoryUse(const InstanceSection& section, std::string_view name,
                        const DeviceMemoryPlan& plan);

// Bytes of GPU memory the KV transfer holds on each GPU of an instance named `name` (prefill,
// decode, colocated): nccl's staging buffer (kLinkStagingBytes) for each link the GPU may have,
// one per peer instance the config names (S.instances, or S.addresses where longer) and peer
// rank that holds its KV heads; 0 for the other backends (they stage nothing on the GPU) and for
// colocated instances. NCCL's own buffers are not counted (kDeviceMemoryMargin).
uint64_t TransferDeviceBytes(const ClusterConfig& config, std::string_view name);

StatusOr<PublisherWithPool> CreatePublisherWithPool(const TransferSection& transfer,
                                                    size_t pool_bytes,
                                                    const TransferFactoryOptions& options);
StatusOr<PullerWithPool> CreatePullerWithPool(const TransferSection& transfer, size_t pool_bytes,
                                              const TransferFactoryOptions& options);

}  // namespace tandem
