// The NCCL KV transport: the pull-driven publisher and puller (kvtransfer/nccl_endpoints.h)
// over NcclLinks (nccl_link.cc), a link of pool r on CUDA device r.
#include "kvtransfer/nccl/nccl_transport.h"

#include <memory>
#include <string>
#include <utility>

namespace tandem {
namespace {

OrderedLinkMaker NcclLinks(std::chrono::milliseconds timeout) {
  OrderedLinkMaker maker;
  maker.new_unique_id = [] { return CreateNcclUniqueId(); };
  maker.start = [timeout](std::string_view unique_id, int rank,
                          int pool) -> StatusOr<std::shared_ptr<OrderedLink>> {
    TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<NcclLink> link,
                            NcclLink::Start(unique_id, rank, /*device=*/pool, timeout));
    return std::shared_ptr<OrderedLink>(std::move(link));
  };
  return maker;
}

}  // namespace

StatusOr<std::unique_ptr<KvPublisher>> CreateNcclPublisher(std::vector<MemoryRegion> pools,
                                                           const KvPoolShape& shape,
                                                           PullDrivenOptions options) {
  return CreatePullDrivenPublisher(std::move(pools), shape, options, NcclLinks(options.timeout));
}

StatusOr<std::unique_ptr<KvPuller>> CreateNcclPuller(std::vector<MemoryRegion> pools,
                                                     const KvPoolShape& shape,
                                                     PullDrivenOptions options) {
  return CreatePullDrivenPuller(std::move(pools), shape, options, NcclLinks(options.timeout));
}

}  // namespace tandem
