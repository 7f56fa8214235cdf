// The NCCL KV transport: the pull-driven publisher and puller (kvtransfer/nccl_endpoints.h)
// over NcclLinks (nccl_link.cc) on the region's device.
#include "kvtransfer/nccl/nccl_transport.h"

#include <memory>
#include <string>
#include <utility>

namespace tandem {
namespace {

OrderedLinkMaker NcclLinks(const NcclTransferOptions& options) {
  OrderedLinkMaker maker;
  maker.new_unique_id = [] { return CreateNcclUniqueId(); };
  maker.start = [device = options.device, timeout = options.timeout](
                    std::string_view unique_id, int rank) -> StatusOr<std::shared_ptr<OrderedLink>> {
    TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<NcclLink> link,
                            NcclLink::Start(unique_id, rank, device, timeout));
    return std::shared_ptr<OrderedLink>(std::move(link));
  };
  return maker;
}

}  // namespace

StatusOr<std::unique_ptr<KvPublisher>> CreateNcclPublisher(MemoryRegion region,
                                                           NcclTransferOptions options) {
  return CreatePullDrivenPublisher(region, options, NcclLinks(options));
}

StatusOr<std::unique_ptr<KvPuller>> CreateNcclPuller(MemoryRegion region,
                                                     NcclTransferOptions options) {
  return CreatePullDrivenPuller(region, options, NcclLinks(options));
}

}  // namespace tandem
