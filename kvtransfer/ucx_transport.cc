// The UCX backend's entry points: pools, publishers and pullers (kvtransfer/ucx_transport.h).
// The handles live in ucx_handles.h, the publisher in ucx_publisher.cc, the puller in
// ucx_puller.cc.
#include "kvtransfer/ucx_transport.h"

#include <cstring>
#include <set>
#include <sstream>

#include "kvtransfer/ucx_handles.h"

namespace tandem {

using ucx_detail::UcxPoolImpl;

StatusOr<std::shared_ptr<UcxPool>> AllocateUcxPool(size_t bytes, const UcxOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(
      auto pool, UcxPoolImpl::Create({nullptr, bytes}, /*allocate=*/true, options.tls,
                                               options.net_devices, options.reads == UcxReads::kRma));
  MemoryRegion region = pool->region();
  std::memset(region.base, 0, region.bytes);  // the heap fallback of UCX_ALLOC_PRIO is not zeroed
  return std::shared_ptr<UcxPool>(std::move(pool));
}

StatusOr<std::shared_ptr<UcxPool>> RegisterUcxPool(MemoryRegion region, UcxMemory memory,
                                                   std::shared_ptr<void> owner,
                                                   const UcxOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(
      auto pool, UcxPoolImpl::Create(region, /*allocate=*/false, options.tls, options.net_devices,
                                     options.reads == UcxReads::kRma,
                                     memory == UcxMemory::kCuda ? UCS_MEMORY_TYPE_CUDA
                                                                : UCS_MEMORY_TYPE_HOST,
                                     std::move(owner)));
  return std::shared_ptr<UcxPool>(std::move(pool));
}

UcxReads ReadsForTls(const std::string& tls) {
  static const std::set<std::string> kKeyed = {
      "rc", "rc_v", "rc_x", "rc_verbs", "rc_mlx5", "dc", "dc_x", "dc_mlx5", "ud", "ud_v",
      "ud_x", "ud_verbs", "ud_mlx5", "ib", "sm", "shm", "posix", "sysv", "xpmem", "cma",
      "knem", "self", "cuda_copy", "cuda_ipc", "gdr_copy", "cuda"};
  if (tls.empty()) return UcxReads::kMessages;
  std::stringstream list(tls);
  for (std::string name; std::getline(list, name, ',');) {
    if (!name.empty() && name[0] == '^') return UcxReads::kMessages;  // "all but ...": tcp too
    if (!kKeyed.count(name)) return UcxReads::kMessages;
  }
  return UcxReads::kRma;
}

namespace {
StatusOr<std::shared_ptr<UcxPoolImpl>> ImplOf(std::shared_ptr<UcxPool> pool,
                                              const UcxOptions& options) {
  if (pool == nullptr) return InvalidArgument("kvtransfer: no UCX pool");
  if (options.reads == UcxReads::kMessages && options.secret.empty())
    return InvalidArgument("kvtransfer: authenticated UCX reads need the cluster secret");
  // UcxPoolImpl is the only implementation.
  auto impl = std::static_pointer_cast<UcxPoolImpl>(std::move(pool));
  if (impl->rma() != (options.reads == UcxReads::kRma))
    return InvalidArgument("kvtransfer: the UCX pool was made for the other kind of reads");
  return impl;
}
}  // namespace

StatusOr<std::unique_ptr<KvPublisher>> CreateUcxPublisher(MemoryRegion region,
                                                          const UcxOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(auto pool,
                          UcxPoolImpl::Create(region, /*allocate=*/false, options.tls,
                                              options.net_devices,
                                              options.reads == UcxReads::kRma));
  return CreateUcxPublisher(std::shared_ptr<UcxPool>(std::move(pool)), options);
}

StatusOr<std::unique_ptr<KvPublisher>> CreateUcxPublisher(std::shared_ptr<UcxPool> pool,
                                                          const UcxOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(auto impl, ImplOf(std::move(pool), options));
  return ucx_detail::CreatePublisherOnPool(std::move(impl), options);
}

StatusOr<std::unique_ptr<KvPuller>> CreateUcxPuller(MemoryRegion region,
                                                    const UcxOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(auto pool,
                          UcxPoolImpl::Create(region, /*allocate=*/false, options.tls,
                                              options.net_devices,
                                              options.reads == UcxReads::kRma));
  return CreateUcxPuller(std::shared_ptr<UcxPool>(std::move(pool)), options);
}

StatusOr<std::unique_ptr<KvPuller>> CreateUcxPuller(std::shared_ptr<UcxPool> pool,
                                                    const UcxOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(auto impl, ImplOf(std::move(pool), options));
  return ucx_detail::CreatePullerOnPool(std::move(impl), options);
}

}  // namespace tandem

