#include "kvtransfer/factory.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>

#include "common/base/log.h"
#include "common/engine/device_memory.h"
#include "common/engine/forward_backend.h"
#include "common/engine/tensor_parallel.h"
#include "kvtransfer/inprocess_transport.h"
#include "kvtransfer/nccl_packing.h"
#if TANDEM_HAVE_CUDA  // set for this file only (CMakeLists.txt)
#include "common/engine/cuda/cuda_backend.h"
#include "kvtransfer/cuda_ipc/cuda_ipc_transport.h"
#include "kvtransfer/nccl/nccl_transport.h"
#endif
#include "kvtransfer/shm_sweep.h"
#include "kvtransfer/ucx_capabilities.h"
#include "kvtransfer/ucx_transport.h"

namespace tandem {
namespace {

std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

Status CheckBackend(const TransferSection& transfer, size_t pool_bytes,
                    const TransferFactoryOptions& options) {
  const KvPoolShape& shape = options.pool_shape;
  if (shape.num_blocks > 0) {
    TANDEM_RETURN_IF_ERROR(shape.Validate());
    if (shape.pool_bytes() != pool_bytes)
      return InvalidArgument("KV pool of " + std::to_string(pool_bytes) + " bytes, its shape says " +
                             std::to_string(shape.pool_bytes()));
  }
  if (transfer.backend == "ucx" || transfer.backend == "inproc") {
    if (shape.degree > 1)
      return InvalidArgument("transfer.backend " + transfer.backend + " moves one KV pool; "
                             "tensor_parallel " + std::to_string(shape.degree) + " keeps one per "
                             "GPU: use cuda_ipc or nccl");
    return Status();
  }
  if (transfer.backend == "cuda_ipc" || transfer.backend == "nccl") {
#if TANDEM_HAVE_CUDA
    if (shape.num_blocks <= 0)  // its publisher sends the shape, its puller re-shards by it
      return InvalidArgument(transfer.backend + ": the KV pools' shape "
                             "(TransferFactoryOptions::pool_shape) is required");
    return Status();
#else
    return InvalidArgument("transfer.backend " + transfer.backend + " needs a build with the "
                           "CUDA backend (cmake -DTANDEM_CUDA=ON on a machine with nvcc)");
#endif
  }
  return InvalidArgument("transfer.backend '" + transfer.backend +
                         "' is not supported by the instance servers (ucx, cuda_ipc, nccl or "
                         "inproc)");
}

// A puller's wait for the next layer: the factory option, else the transfer timeout.
std::chrono::milliseconds LayerWait(const TransferSection& transfer,
                                    const TransferFactoryOptions& options) {
  return Millis(options.layer_wait_timeout_s > 0 ? options.layer_wait_timeout_s
                                                 : transfer.timeout_s);
}

#if TANDEM_HAVE_CUDA
CudaIpcOptions CudaIpcOptionsFor(const TransferSection& transfer,
                                 const TransferFactoryOptions& options) {
  CudaIpcOptions co;
  co.timeout = Millis(transfer.timeout_s);
  co.layer_wait_timeout = LayerWait(transfer, options);
  co.lease_timeout = Millis(options.lease_timeout_s);
  co.metrics = options.metrics;
  return co;
}

PullDrivenOptions NcclOptionsFor(const TransferSection& transfer,
                                 const TransferFactoryOptions& options) {
  PullDrivenOptions no;
  no.timeout = Millis(transfer.timeout_s);
  no.layer_wait_timeout = LayerWait(transfer, options);
  no.lease_timeout = Millis(options.lease_timeout_s);
  no.metrics = options.metrics;
  return no;
}

// The pools of an NCCL instance: pool r on CUDA device r, as the ranks' (cuda_ipc's alike).
StatusOr<std::vector<KvPoolMemory>> NcclPools(const KvPoolShape& shape,
                                              std::vector<MemoryRegion>* regions) {
  std::vector<KvPoolMemory> pools;
  for (int r = 0; r < shape.degree; ++r) {
    TANDEM_ASSIGN_OR_RETURN(KvPoolMemory pool, cuda::AllocateCudaKvPool(shape.pool_bytes(), r));
    regions->push_back({pool.base, pool.bytes});
    pools.push_back(std::move(pool));
  }
  return pools;
}
#endif

UcxOptions UcxOptionsFor(const TransferSection& transfer, const TransferFactoryOptions& options) {
  UcxOptions uo;
  uo.tls = transfer.ucx_tls;
  uo.timeout = Millis(transfer.timeout_s);
  uo.layer_wait_timeout = LayerWait(transfer, options);
  uo.lease_timeout = Millis(options.lease_timeout_s);
  uo.max_inflight_gets = static_cast<size_t>(transfer.max_inflight);
  uo.report_results = false;  // the control plane's KvReleased is the one report
  uo.reads = ReadsForTls(transfer.ucx_tls);
  uo.secret = options.secret;
  uo.metrics = options.metrics;
  return uo;
}

KvPoolMemory MemoryOf(std::shared_ptr<UcxPool> pool) {
  const MemoryRegion region = pool->region();
  KvPoolMemory memory;
  memory.base = static_cast<std::byte*>(region.base);
  memory.bytes = region.bytes;
  memory.owner = std::move(pool);
  return memory;
}

MemoryRegion RegionOf(const KvPoolMemory& memory) { return {memory.base, memory.bytes}; }

// The UCX pool of an instance: host memory UCX allocates, or on a cuda instance GPU memory
// registered with a UCX that moves it (the puller then copies eager replies with cudaMemcpy).
StatusOr<KvPoolMemory> UcxPoolFor(size_t pool_bytes, const TransferFactoryOptions& options,
                                  UcxOptions* uo, std::shared_ptr<UcxPool>* pool) {
  if (options.device != "cuda") {
    SweepOrphanedSharedMemory();  // what killed instances left: the new pool may need the room
    TANDEM_ASSIGN_OR_RETURN(*pool, AllocateUcxPool(pool_bytes, *uo));
    return MemoryOf(*pool);
  }
  StatusOr<UcxCapabilities> ucx = ProbeUcx(uo->tls);
  if (!ucx.ok() || !ucx->cuda_memory)
    return InvalidArgument("transfer.backend ucx cannot move this instance's KV: it is in GPU "
                           "memory (device cuda), and with transfer.ucx_tls '" + uo->tls +
                           "' " + DescribeUcx(ucx) + "; use cuda_ipc or nccl, or a UCX built "
                           "with CUDA");
#if TANDEM_HAVE_CUDA
  TANDEM_ASSIGN_OR_RETURN(KvPoolMemory memory, cuda::AllocateCudaKvPool(pool_bytes, 0));
  TANDEM_ASSIGN_OR_RETURN(*pool, RegisterUcxPool(RegionOf(memory), UcxMemory::kCuda,
                                                 memory.owner, *uo));
  uo->copy_into_pool = [](void* at, const void* bytes, size_t length) {
    return cuda::CopyHostToDevice(at, bytes, length);
  };
  memory.owner = *pool;  // which keeps the device memory
  return memory;
#else
  return InvalidArgument("device cuda needs a build with the CUDA backend");
#endif
}

}  // namespace

StatusOr<std::string> MachineBootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (!std::getline(in, id) || id.empty())
    return Internal("cannot read /proc/sys/kernel/random/boot_id (this machine's identity)");
  return id;
}

StatusOr<std::string> InterfaceOfAddress(const std::string& ip) {
  if (ip.empty() || ip == "0.0.0.0" || ip == "::") return std::string();
  in6_addr want6{};
  in_addr want4{};
  const bool v4 = ::inet_pton(AF_INET, ip.c_str(), &want4) == 1;
  if (!v4 && ::inet_pton(AF_INET6, ip.c_str(), &want6) != 1)
    return InvalidArgument("'" + ip + "' is not an IP address");
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return Internal(std::string("getifaddrs: ") + std::strerror(errno));
  std::string name;
  for (ifaddrs* i = list; i != nullptr && name.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    if (v4 && i->ifa_addr->sa_family == AF_INET &&
        reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == want4.s_addr)
      name = i->ifa_name;
    if (!v4 && i->ifa_addr->sa_family == AF_INET6 &&
        std::memcmp(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr, &want6,
                    sizeof want6) == 0)
      name = i->ifa_name;
  }
  ::freeifaddrs(list);
  // 127.0.0.2 and the rest of 127/8 answer on lo without being listed.
  if (name.empty() && v4 && (ntohl(want4.s_addr) >> 24) == 127) name = "lo";
  if (name.empty()) return NotFound("no network interface of this machine has the address " + ip);
  return name;
}

uint64_t TransferDeviceBytes(const ClusterConfig& config, std::string_view name) {
  if (config.transfer.backend != "nccl" || name == "colocated") return 0;
  const bool prefill = name == "prefill";
  const InstanceSection& self = prefill ? config.prefill : config.decode;
  const InstanceSection& peers = prefill ? config.decode : config.prefill;
  const int64_t peer_instances =
      std::max<int64_t>(peers.instances, static_cast<int64_t>(peers.addresses.size()));
  // A GPU of a rank links with the peer ranks that hold its KV heads: one rank of an equal or
  // smaller degree, t_peer / t_self of a larger one.
  const int64_t links_per_peer =
      std::max(1, (peers.tensor_parallel + self.tensor_parallel - 1) / self.tensor_parallel);
  return static_cast<uint64_t>(std::max<int64_t>(peer_instances, 1) * links_per_peer) *
         kLinkStagingBytes;
}

StatusOr<KvPoolShape> InstanceKvPools(const ClusterConfig& config, const InstanceSection& section,
                                      std::string_view name, const Model& model,
                                      const ForwardOptions& forward, DeviceMemoryPlan* plan) {
  const ModelConfig& mc = model.config();
  StatusOr<TpPlan> tp = MakeTpPlan(mc, section.tensor_parallel);
  if (!tp.ok())  // "decode.tensor_parallel 2 does not divide num_attention_heads 9"
    return InvalidArgument(std::string(name) + "." + tp.status().message());
  KvPoolShape shape;
  shape.full = KvLayout{mc.num_layers, mc.num_kv_heads, mc.head_dim, config.kv_cache.block_size,
                        ResolvedKvDType(config)};
  shape.degree = tp->degree;
  const bool on_gpu = section.device == "cuda";
  // What each GPU holds besides its pool (rank 0's buffers: it alone has the LM head output).
  DeviceMemoryNeed need;
  if (on_gpu) {
    need.weights = TpRankWeightBytes(model, tp->degree);
    need.workspaces = PlanCudaWorkspaces(ShardConfig(mc, *tp), forward,
                                         model.dtype() != WeightDType::kF32,
                                         /*returns_logits=*/true)
                          .device_bytes();
    need.transfer = TransferDeviceBytes(config, name);
  }
  TANDEM_ASSIGN_OR_RETURN(uint64_t budget,
                          KvMemoryBudgetBytes(section.device, need.besides_kv()));
  TANDEM_ASSIGN_OR_RETURN(shape.num_blocks,
                          KvPoolBlocks(config, section, shape.rank_layout(), budget));
  if (!on_gpu) return shape;
  // Before anything is allocated: every GPU of the instance has room for all of it now (another
  // process's pools, or an instance sharing the GPU, may have taken what the budget assumed).
  need.kv_pool = shape.pool_bytes();
  const std::string field = section.kv_blocks > 0 ? std::string(name) + ".kv_blocks"
                                                  : std::string("kv_cache.memory_fraction");
  DeviceMemoryPlan planned;
  planned.need = need;
  for (int rank = 0; rank < tp->degree; ++rank) {
    TANDEM_ASSIGN_OR_RETURN(DeviceMemoryNow memory, DeviceMemoryOf(section.device, rank));
    TANDEM_RETURN_IF_ERROR(CheckDeviceMemoryFits(config.Where(field), field, std::string(name),
                                                 rank, need, memory.free_bytes,
                                                 memory.total_bytes));
    planned.free_before.push_back(memory.free_bytes);
  }
  if (plan != nullptr) *plan = std::move(planned);
  return shape;
}

void LogDeviceMemoryUse(const InstanceSection& section, std::string_view name,
                        const DeviceMemoryPlan& plan) {
  for (size_t rank = 0; rank < plan.free_before.size(); ++rank) {
    StatusOr<DeviceMemoryNow> now = DeviceMemoryOf(section.device, static_cast<int>(rank));
    if (!now.ok()) {
      TANDEM_LOG(kWarn) << name << ": GPU " << rank << ": memory unreadable after start-up: "
                        << now.status().ToString();
      continue;
    }
    bool over_margin = false;
    const std::string line =
        DescribeDeviceMemoryUse(plan, static_cast<int>(rank), now->free_bytes, &over_margin);
    if (over_margin) {
      TANDEM_LOG(kWarn) << name << ": " << line
                        << ": the start-up check underestimates this GPU's needs";
    } else {
      TANDEM_LOG(kInfo) << name << ": " << line;
    }
  }
}

StatusOr<PublisherWithPool> CreatePublisherWithPool(const TransferSection& transfer,
                                                    size_t pool_bytes,
                                                    const TransferFactoryOptions& options) {
  TANDEM_RETURN_IF_ERROR(CheckBackend(transfer, pool_bytes, options));
#if TANDEM_HAVE_CUDA
  if (transfer.backend == "cuda_ipc")
    return CreateCudaIpcPublisherWithPool(options.pool_shape, CudaIpcOptionsFor(transfer, options));
  if (transfer.backend == "nccl") {
    PublisherWithPool out;
    std::vector<MemoryRegion> regions;
    TANDEM_ASSIGN_OR_RETURN(out.pools, NcclPools(options.pool_shape, &regions));
    TANDEM_ASSIGN_OR_RETURN(out.publisher,
                            CreateNcclPublisher(std::move(regions), options.pool_shape,
                                                NcclOptionsFor(transfer, options)));
    return out;
  }
#endif
  PublisherWithPool out;
  if (transfer.backend == "inproc") {
    TANDEM_ASSIGN_OR_RETURN(KvPoolMemory memory, AllocateKvPoolMemory(pool_bytes));
    TANDEM_ASSIGN_OR_RETURN(out.publisher, CreateInProcessPublisher(RegionOf(memory)));
    out.pools.push_back(std::move(memory));
    return out;
  }
  UcxOptions uo = UcxOptionsFor(transfer, options);
  TANDEM_ASSIGN_OR_RETURN(uo.net_devices, InterfaceOfAddress(options.host));
  std::shared_ptr<UcxPool> pool;
  TANDEM_ASSIGN_OR_RETURN(KvPoolMemory memory, UcxPoolFor(pool_bytes, options, &uo, &pool));
  TANDEM_ASSIGN_OR_RETURN(out.publisher, CreateUcxPublisher(std::move(pool), uo));
  out.pools.push_back(std::move(memory));
  return out;
}

StatusOr<PullerWithPool> CreatePullerWithPool(const TransferSection& transfer, size_t pool_bytes,
                                              const TransferFactoryOptions& options) {
  TANDEM_RETURN_IF_ERROR(CheckBackend(transfer, pool_bytes, options));
#if TANDEM_HAVE_CUDA
  if (transfer.backend == "cuda_ipc")
    return CreateCudaIpcPullerWithPool(options.pool_shape, CudaIpcOptionsFor(transfer, options));
  if (transfer.backend == "nccl") {
    PullerWithPool out;
    std::vector<MemoryRegion> regions;
    TANDEM_ASSIGN_OR_RETURN(out.pools, NcclPools(options.pool_shape, &regions));
    TANDEM_ASSIGN_OR_RETURN(out.puller,
                            CreateNcclPuller(std::move(regions), options.pool_shape,
                                             NcclOptionsFor(transfer, options)));
    return out;
  }
#endif
  PullerWithPool out;
  UcxOptions uo = UcxOptionsFor(transfer, options);
  if (transfer.backend == "inproc") {
    TANDEM_ASSIGN_OR_RETURN(KvPoolMemory memory, AllocateKvPoolMemory(pool_bytes));
    TANDEM_ASSIGN_OR_RETURN(out.puller, CreateInProcessPuller(RegionOf(memory), options.metrics,
                                                              uo.layer_wait_timeout));
    out.pools.push_back(std::move(memory));
    return out;
  }
  TANDEM_ASSIGN_OR_RETURN(uo.net_devices, InterfaceOfAddress(options.host));
  std::shared_ptr<UcxPool> pool;
  TANDEM_ASSIGN_OR_RETURN(KvPoolMemory memory, UcxPoolFor(pool_bytes, options, &uo, &pool));
  TANDEM_ASSIGN_OR_RETURN(out.puller, CreateUcxPuller(std::move(pool), uo));
  out.pools.push_back(std::move(memory));
  return out;
}

}  // namespace tandem
