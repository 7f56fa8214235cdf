#include "prefill/kv_publish_link.h"

#include <chrono>

#include "kvtransfer/inprocess_transport.h"
#include "kvtransfer/transfer.h"
#include "kvtransfer/ucx_transport.h"
#include "kvtransfer/wire.h"

namespace tandem {
namespace {

std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

class Link : public KvPublishLink {
 public:
  explicit Link(std::unique_ptr<KvPublisher> publisher)
      : publisher_(std::move(publisher)), blob_(Encode(publisher_->peer_info())) {}

  const std::string& peer_info_blob() const override { return blob_; }

  StatusOr<std::string> Publish(
      const std::string& request_id, const PublishRanges& ranges,
      std::function<void(const std::string&, const Status&)> on_release) override {
    LayerRanges layers(ranges.size());
    for (size_t l = 0; l < ranges.size(); ++l)
      for (auto [offset, length] : ranges[l]) layers[l].push_back({offset, length});
    TANDEM_ASSIGN_OR_RETURN(KvDescriptor desc, publisher_->Publish(request_id, std::move(layers),
                                                                   std::move(on_release)));
    return Encode(desc);
  }

  void Release(const std::string& request_id, const Status& status) override {
    TransferResult result;
    result.instance_id = publisher_->peer_info().instance_id;
    result.request_id = request_id;
    result.code = status.code();
    result.message = status.message();
    (void)publisher_->Release(result);  // NotFound: the transport released it already
  }

 private:
  std::unique_ptr<KvPublisher> publisher_;
  std::string blob_;
};

}  // namespace

StatusOr<std::unique_ptr<KvPublishLink>> KvPublishLink::Create(void* base, size_t bytes,
                                                               const KvPublishOptions& options) {
  MemoryRegion region{base, bytes};
  std::unique_ptr<KvPublisher> publisher;
  if (options.backend == "ucx") {
    UcxOptions uo;
    uo.tls = options.ucx_tls;
    uo.timeout = Millis(options.timeout_s);
    uo.lease_timeout = Millis(options.lease_timeout_s);
    uo.metrics = options.metrics;
    TANDEM_ASSIGN_OR_RETURN(publisher, CreateUcxPublisher(region, uo));
  } else if (options.backend == "inproc") {
    TANDEM_ASSIGN_OR_RETURN(publisher, CreateInProcessPublisher(region));
  } else {
    return InvalidArgument("transfer.backend '" + options.backend + "' is not supported on CPU");
  }
  return std::unique_ptr<KvPublishLink>(new Link(std::move(publisher)));
}

StatusOr<std::unique_ptr<KvPublishLink>> KvPublishLink::CreateWithPool(
    size_t bytes, const KvPublishOptions& options, KvPoolMemory* memory) {
  if (options.backend != "ucx") {
    TANDEM_ASSIGN_OR_RETURN(KvPoolMemory heap, AllocateKvPoolMemory(bytes));
    TANDEM_ASSIGN_OR_RETURN(auto link, Create(heap.base, heap.bytes, options));
    *memory = std::move(heap);
    return link;
  }
  UcxOptions uo;
  uo.tls = options.ucx_tls;
  uo.timeout = Millis(options.timeout_s);
  uo.lease_timeout = Millis(options.lease_timeout_s);
  uo.metrics = options.metrics;
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<UcxPool> pool, AllocateUcxPool(bytes, uo));
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<KvPublisher> publisher, CreateUcxPublisher(pool, uo));
  MemoryRegion region = pool->region();
  memory->base = static_cast<std::byte*>(region.base);
  memory->bytes = region.bytes;
  memory->owner = std::move(pool);
  return std::unique_ptr<KvPublishLink>(new Link(std::move(publisher)));
}

}  // namespace tandem
