#include "decode/kv_pull_link.h"

#include <chrono>

#include "kvtransfer/inprocess_transport.h"
#include "kvtransfer/transfer.h"
#include "kvtransfer/ucx_transport.h"
#include "kvtransfer/wire.h"

namespace tandem {
namespace {

std::chrono::milliseconds LayerWait(const KvPullOptions& o) {
  const double s = o.layer_wait_timeout_s > 0 ? o.layer_wait_timeout_s : o.timeout_s;
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
}

uint32_t Layers(int32_t n) { return n < 0 ? kAllLayers : static_cast<uint32_t>(n); }

class Link : public KvPullLink {
 public:
  explicit Link(std::unique_ptr<KvPuller> puller) : puller_(std::move(puller)) {}

  Status Prepare(const std::string& peer_info_blob, const std::string& descriptor_blob,
                 int num_layers) override {
    TANDEM_ASSIGN_OR_RETURN(PeerInfo peer, DecodePeerInfo(AsBytes(peer_info_blob)));
    TANDEM_ASSIGN_OR_RETURN(KvDescriptor desc, DecodeKvDescriptor(AsBytes(descriptor_blob)));
    if (desc.layers.size() != static_cast<size_t>(num_layers))
      return InvalidArgument("KV descriptor has " + std::to_string(desc.layers.size()) +
                             " layers, the model " + std::to_string(num_layers));
    if (desc.instance_id != peer.instance_id)
      return InvalidArgument("KV descriptor and peer info name different publishers");
    return puller_->Connect(peer);
  }

  Status Pull(const std::string& descriptor_blob, const PullRanges& local,
              std::function<void(const std::string&, const Status&)> on_done,
              std::function<void(uint32_t layer)> on_layer, int32_t layers_available) override {
    TANDEM_ASSIGN_OR_RETURN(KvDescriptor desc, DecodeKvDescriptor(AsBytes(descriptor_blob)));
    LayerRanges layers(local.size());
    for (size_t l = 0; l < local.size(); ++l)
      for (auto [offset, length] : local[l]) layers[l].push_back({offset, length});
    PullCallbacks callbacks;
    callbacks.on_done = std::move(on_done);
    callbacks.on_layer = std::move(on_layer);
    return puller_->Pull(desc, std::move(layers), std::move(callbacks), Layers(layers_available));
  }

  Status SetLayersAvailable(const std::string& request_id, int32_t layers) override {
    return puller_->SetLayersAvailable(request_id, Layers(layers));
  }

 private:
  std::unique_ptr<KvPuller> puller_;
};

}  // namespace

StatusOr<std::unique_ptr<KvPullLink>> KvPullLink::Create(void* base, size_t bytes,
                                                         const KvPullOptions& options) {
  MemoryRegion region{base, bytes};
  std::unique_ptr<KvPuller> puller;
  if (options.backend == "ucx") {
    UcxOptions uo;
    uo.tls = options.ucx_tls;
    uo.timeout = std::chrono::milliseconds(static_cast<int64_t>(options.timeout_s * 1000));
    uo.max_inflight_gets = options.max_inflight;
    uo.layer_wait_timeout = LayerWait(options);
    uo.metrics = options.metrics;
    TANDEM_ASSIGN_OR_RETURN(puller, CreateUcxPuller(region, uo));
  } else if (options.backend == "inproc") {
    TANDEM_ASSIGN_OR_RETURN(puller,
                            CreateInProcessPuller(region, options.metrics, LayerWait(options)));
  } else {
    return InvalidArgument("transfer.backend '" + options.backend + "' is not supported on CPU");
  }
  return std::unique_ptr<KvPullLink>(new Link(std::move(puller)));
}

StatusOr<std::unique_ptr<KvPullLink>> KvPullLink::CreateWithPool(size_t bytes,
                                                                 const KvPullOptions& options,
                                                                 KvPoolMemory* memory) {
  if (options.backend != "ucx") {
    TANDEM_ASSIGN_OR_RETURN(KvPoolMemory heap, AllocateKvPoolMemory(bytes));
    TANDEM_ASSIGN_OR_RETURN(auto link, Create(heap.base, heap.bytes, options));
    *memory = std::move(heap);
    return link;
  }
  UcxOptions uo;
  uo.tls = options.ucx_tls;
  uo.timeout = std::chrono::milliseconds(static_cast<int64_t>(options.timeout_s * 1000));
  uo.max_inflight_gets = options.max_inflight;
  uo.layer_wait_timeout = LayerWait(options);
  uo.metrics = options.metrics;
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<UcxPool> pool, AllocateUcxPool(bytes, uo));
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<KvPuller> puller, CreateUcxPuller(pool, uo));
  MemoryRegion region = pool->region();
  memory->base = static_cast<std::byte*>(region.base);
  memory->bytes = region.bytes;
  memory->owner = std::move(pool);
  return std::unique_ptr<KvPullLink>(new Link(std::move(puller)));
}

}  // namespace tandem
