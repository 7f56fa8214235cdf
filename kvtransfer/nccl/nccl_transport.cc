// The NCCL KV transport: the pull-driven publisher and puller (kvtransfer/nccl_endpoints.h)
// over NcclLinks (nccl_link.cc), a link of pool r on CUDA device r.
#include "kvtransfer/nccl/nccl_transport.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

namespace tandem {
namespace {

// `roots`: the puller's (its ids' bootstrap roots in children); null for the publisher, which
// only joins links (rank 0) with the puller's ids.
OrderedLinkMaker NcclLinks(std::chrono::milliseconds timeout,
                           std::shared_ptr<NcclBootstrapRoots> roots) {
  OrderedLinkMaker maker;
  maker.new_unique_id = [roots]() -> StatusOr<std::string> {
    return roots ? roots->NewUniqueId() : CreateNcclUniqueId();
  };
  maker.start = [timeout, roots](std::string_view unique_id, int rank,
                                 int pool) -> StatusOr<std::shared_ptr<OrderedLink>> {
    std::unique_ptr<NcclBootstrapRoot> root = roots ? roots->Claim(unique_id) : nullptr;
    TANDEM_ASSIGN_OR_RETURN(
        std::shared_ptr<NcclLink> link,
        NcclLink::Start(unique_id, rank, /*device=*/pool, timeout, std::move(root)));
    return std::shared_ptr<OrderedLink>(std::move(link));
  };
  return maker;
}

}  // namespace

StatusOr<std::unique_ptr<KvPublisher>> CreateNcclPublisher(std::vector<MemoryRegion> pools,
                                                           const KvPoolShape& shape,
                                                           PullDrivenOptions options) {
  return CreatePullDrivenPublisher(std::move(pools), shape, options,
                                   NcclLinks(options.timeout, nullptr));
}

StatusOr<std::unique_ptr<KvPuller>> CreateNcclPuller(std::vector<MemoryRegion> pools,
                                                     const KvPoolShape& shape,
                                                     PullDrivenOptions options) {
  // A spare root per pool: a new peer's first pull makes a link per pool (one per pair of
  // pools when the degrees are equal), and a failed peer's links are replaced together.
  const int spares = static_cast<int>(std::max<size_t>(pools.size(), 2));
  const std::string binary = NcclRootHelperBeside("/proc/self/exe");
  auto roots = binary.empty() ? nullptr : std::make_shared<NcclBootstrapRoots>(binary, spares);
  return CreatePullDrivenPuller(std::move(pools), shape, options,
                                NcclLinks(options.timeout, std::move(roots)));
}

}  // namespace tandem
