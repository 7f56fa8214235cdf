// The UCX backend's entry points: pools, publishers and pullers (kvtransfer/ucx_transport.h).
// The handles live in ucx_handles.h, the publisher in ucx_publisher.cc, the puller in
// ucx_puller.cc.
#include "kvtransfer/ucx_transport.h"

#include <cstring>

#include "kvtransfer/ucx_handles.h"

namespace tandem {

using ucx_detail::UcxPoolImpl;

StatusOr<std::shared_ptr<UcxPool>> AllocateUcxPool(size_t bytes, const UcxOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(
      auto pool, UcxPoolImpl::Create({nullptr, bytes}, /*allocate=*/true, options.tls,
                                               options.net_devices));
  MemoryRegion region = pool->region();
  std::memset(region.base, 0, region.bytes);  // the heap fallback of UCX_ALLOC_PRIO is not zeroed
  return std::shared_ptr<UcxPool>(std::move(pool));
}

namespace {
StatusOr<std::shared_ptr<UcxPoolImpl>> ImplOf(std::shared_ptr<UcxPool> pool) {
  if (pool == nullptr) return InvalidArgument("kvtransfer: no UCX pool");
  // UcxPoolImpl is the only implementation.
  return std::static_pointer_cast<UcxPoolImpl>(std::move(pool));
}
}  // namespace

StatusOr<std::unique_ptr<KvPublisher>> CreateUcxPublisher(MemoryRegion region,
                                                          const UcxOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(auto pool,
                          UcxPoolImpl::Create(region, /*allocate=*/false, options.tls,
                                              options.net_devices));
  return ucx_detail::CreatePublisherOnPool(std::move(pool), options);
}

StatusOr<std::unique_ptr<KvPublisher>> CreateUcxPublisher(std::shared_ptr<UcxPool> pool,
                                                          const UcxOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(auto impl, ImplOf(std::move(pool)));
  return ucx_detail::CreatePublisherOnPool(std::move(impl), options);
}

StatusOr<std::unique_ptr<KvPuller>> CreateUcxPuller(MemoryRegion region,
                                                    const UcxOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(auto pool,
                          UcxPoolImpl::Create(region, /*allocate=*/false, options.tls,
                                              options.net_devices));
  return ucx_detail::CreatePullerOnPool(std::move(pool), options);
}

StatusOr<std::unique_ptr<KvPuller>> CreateUcxPuller(std::shared_ptr<UcxPool> pool,
                                                    const UcxOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(auto impl, ImplOf(std::move(pool)));
  return ucx_detail::CreatePullerOnPool(std::move(impl), options);
}

}  // namespace tandem

