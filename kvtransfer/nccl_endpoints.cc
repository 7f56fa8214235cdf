#include "kvtransfer/nccl_endpoints.h"

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/base/log.h"
#include "kvtransfer/nccl_protocol.h"

namespace tandem {

using Clock = std::chrono::steady_clock;

// ---- publisher ---------------------------------------------------------------------------------

namespace {

constexpr size_t kMaxLinks = kMaxPullDrivenLinks;
constexpr auto kIdleLinkTimeout = std::chrono::seconds(kIdleLinkSeconds);

Status CheckRequestId(const std::string& id) {
  if (id.empty()) return InvalidArgument("empty request id");
  if (id.size() > kKvMaxRequestIdBytes) return InvalidArgument("request id too long");
  return Status();
}

// A link that failed, or that nothing used for a minute and has nothing in flight.
bool Closable(const OrderedLink& link, Clock::time_point last_used, Clock::time_point now) {
  if (link.inflight_count() > 0) return false;
  return !link.health().ok() || now - last_used > kIdleLinkTimeout;
}

class PullDrivenPublisher final : public KvPublisher {
 public:
  PullDrivenPublisher(MemoryRegion region, PullDrivenOptions options, OrderedLinkMaker maker)
      : region_(region), options_(options), maker_(std::move(maker)) {
    info_.instance_id = NewInstanceId();
    info_.transport = std::string(kNcclTransport);
    info_.region_base = reinterpret_cast<uint64_t>(region.base);
    info_.region_bytes = region.bytes;
  }

  // The links go with state_ once their callbacks are done: each aborts and drains.
  ~PullDrivenPublisher() override {
    std::map<uint64_t, Link> links;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      links.swap(state_->links);
    }
  }

  const PeerInfo& peer_info() const override { return info_; }

  StatusOr<KvDescriptor> Publish(const std::string& request_id, LayerRanges layers,
                                 ReleaseCallback on_release) override {
    TANDEM_RETURN_IF_ERROR(CheckRequestId(request_id));
    TANDEM_RETURN_IF_ERROR(CheckRanges(layers, region_.bytes));
    if (layers.size() > kKvMaxLayers) return InvalidArgument("too many layers");
    TANDEM_ASSIGN_OR_RETURN(KvDescriptor descriptor,
                            MakeDescriptor(info_.instance_id, request_id, layers));
    std::vector<std::pair<std::string, ReleaseCallback>> expired = ExpireLeases();
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      Lease lease{std::move(layers), std::move(on_release), Clock::now()};
      if (!state_->leases.emplace(request_id, std::move(lease)).second)
        return InvalidArgument("request " + request_id + " already published");
    }
    for (auto& [id, cb] : expired)
      if (cb) cb(id, DeadlineExceeded("NCCL publication of " + id + " never released"));
    return descriptor;
  }

  Status OnPullerMessage(std::span<const uint8_t> bytes) override {
    TANDEM_ASSIGN_OR_RETURN(NcclPullOrder order, DecodeNcclPullOrder(bytes));
    const KvDescriptor& d = order.descriptor;
    if (d.instance_id != info_.instance_id)
      return InvalidArgument("NCCL pull order for publisher " + std::to_string(d.instance_id) +
                             ", this is " + std::to_string(info_.instance_id));
    TANDEM_RETURN_IF_ERROR(CheckRequestId(d.request_id));
    TANDEM_RETURN_IF_ERROR(CheckRanges(d.layers, region_.bytes));

    // Links let go of are destroyed after the lock is released: a link's destructor runs the
    // callbacks of its transfers, which take the lock.
    std::vector<Link> closing;
    std::lock_guard<std::mutex> lock(state_->mutex);
    const Clock::time_point now = Clock::now();
    auto found = state_->links.find(order.link_token);
    if (found == state_->links.end()) {
      if (order.seq != 0)  // the link this order belongs to is gone here
        return InvalidArgument("NCCL pull order " + std::to_string(order.seq) +
                               " for an unknown link");
      for (auto it = state_->links.begin(); it != state_->links.end();) {
        if (Closable(*it->second.link, it->second.last_used, now)) {
          closing.push_back(std::move(it->second));
          it = state_->links.erase(it);
        } else {
          ++it;
        }
      }
      if (state_->links.size() >= kMaxLinks)
        return ResourceExhausted("NCCL publisher already has " + std::to_string(kMaxLinks) +
                                 " links");
      TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<OrderedLink> made,
                              maker_.start(order.unique_id, /*rank=*/0));
      found = state_->links.emplace(order.link_token, Link{std::move(made), 0, now}).first;
    }
    Link& link = found->second;
    link.last_used = now;
    if (order.seq != link.next_seq) {
      link.link->Abort(DataLoss("NCCL pull orders out of step"));
      const uint64_t due = link.next_seq;
      closing.push_back(std::move(link));
      state_->links.erase(found);
      return DataLoss("NCCL pull order " + std::to_string(order.seq) + " where order " +
                      std::to_string(due) + " was due: link aborted");
    }
    // Held: the sends read the published ranges. Not held (released, never published, or
    // ranges that differ from the publication): filler of the same sizes from the ranges the
    // order names, so that the puller's receives complete and the link stays in step.
    auto lease = state_->leases.find(d.request_id);
    const bool held =
        lease != state_->leases.end() && !lease->second.sending && lease->second.ranges == d.layers;
    OrderedLink::Transfer t;
    t.request_id = d.request_id;
    t.layers = static_cast<uint32_t>(d.layers.size());
    t.total_bytes = d.total_bytes;
    t.held = held;
    for (const NcclPiece& p : NcclWireOrder(d.layers, options_.granule_bytes))
      t.messages.push_back({p.layer, static_cast<char*>(region_.base) + p.remote_offset, p.length});
    t.deadline = now + options_.timeout;
    if (held) {
      t.on_done = [state = state_, id = d.request_id](const Status& status) {
        SendsDone(*state, id, status);
      };
    }
    StatusOr<uint64_t> seq = link.link->Post(std::move(t));
    if (!seq.ok()) {
      link.link->Abort(seq.status());
      closing.push_back(std::move(link));
      state_->links.erase(found);
      return seq.status();
    }
    TANDEM_CHECK(*seq == link.next_seq, "an NCCL publisher link posted out of its own order");
    ++link.next_seq;
    if (held) {
      lease->second.sending = true;
      lease->second.link_token = order.link_token;
    }
    return Status();
  }

  Status Release(const TransferResult& result) override {
    if (result.instance_id != info_.instance_id)
      return NotFound("result for another publisher instance");
    ReleaseCallback cb;
    std::vector<Link> closing;  // destroyed after the lock (see OnPullerMessage)
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      auto it = state_->leases.find(result.request_id);
      if (it == state_->leases.end())
        return NotFound("request " + result.request_id + " not published");
      // A failure while the sends are posted: they cannot be withdrawn and the ranges are
      // about to be reused, so their link goes (the puller's pull fails; it would have failed).
      if (result.code != StatusCode::kOk && it->second.sending) {
        if (auto link = state_->links.find(it->second.link_token); link != state_->links.end()) {
          link->second.link->Abort(result.ToStatus());
          closing.push_back(std::move(link->second));
          state_->links.erase(link);
        }
      }
      cb = std::move(it->second.on_release);
      state_->leases.erase(it);
    }
    if (cb) cb(result.request_id, result.ToStatus());
    return Status();
  }

  size_t published_count() const override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->leases.size();
  }

 private:
  struct Lease {
    LayerRanges ranges;
    ReleaseCallback on_release;
    Clock::time_point published;
    bool sending = false;  // its sends are posted on link `link_token`
    uint64_t link_token = 0;
  };
  struct Link {
    std::shared_ptr<OrderedLink> link;
    uint64_t next_seq = 0;  // the order due next
    Clock::time_point last_used;
  };
  struct State {
    std::mutex mutex;
    std::map<std::string, Lease> leases;
    std::map<uint64_t, Link> links;  // by the puller's link token
  };

  // The link's thread: the sends of a held request completed (OK: the lease ends) or failed
  // (the lease stays, for Release or its timeout).
  static void SendsDone(State& state, const std::string& id, const Status& status) {
    ReleaseCallback cb;
    {
      std::lock_guard<std::mutex> lock(state.mutex);
      auto it = state.leases.find(id);
      if (it == state.leases.end()) return;
      it->second.sending = false;
      if (!status.ok()) return;
      cb = std::move(it->second.on_release);
      state.leases.erase(it);
    }
    if (cb) cb(id, Status());
  }

  std::vector<std::pair<std::string, ReleaseCallback>> ExpireLeases() {
    std::vector<std::pair<std::string, ReleaseCallback>> expired;
    const Clock::time_point now = Clock::now();
    std::lock_guard<std::mutex> lock(state_->mutex);
    for (auto it = state_->leases.begin(); it != state_->leases.end();) {
      if (!it->second.sending && now - it->second.published > options_.lease_timeout) {
        expired.emplace_back(it->first, std::move(it->second.on_release));
        it = state_->leases.erase(it);
      } else {
        ++it;
      }
    }
    return expired;
  }

  MemoryRegion region_;
  PullDrivenOptions options_;
  OrderedLinkMaker maker_;
  PeerInfo info_;
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

// ---- puller ------------------------------------------------------------------------------------

uint64_t NewLinkToken() {
  uint64_t token = 0;
  while (token == 0) token = NewInstanceId();
  return token;
}

class PullDrivenPuller final : public KvPuller {
 public:
  PullDrivenPuller(MemoryRegion region, PullDrivenOptions options, OrderedLinkMaker maker)
      : region_(region),
        options_(options),
        maker_(std::move(maker)),
        metrics_(std::make_shared<TransferMetrics>(options.metrics)) {}

  ~PullDrivenPuller() override {
    std::map<uint64_t, Peer> peers;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      peers.swap(state_->peers);
    }  // each link aborts, drains and fails its pulls with Cancelled
  }

  Status Connect(const PeerInfo& peer) override {
    if (peer.transport != kNcclTransport)
      return InvalidArgument("NCCL puller cannot connect to transport '" + peer.transport + "'");
    if (peer.instance_id == 0) return InvalidArgument("publisher instance id 0");
    std::vector<Peer> closing;  // destroyed after the lock: a link's destructor takes it
    std::lock_guard<std::mutex> lock(state_->mutex);
    const Clock::time_point now = Clock::now();
    for (auto it = state_->peers.begin(); it != state_->peers.end();) {
      const Peer& p = it->second;
      if (it->first != peer.instance_id && now - p.last_used > kIdleLinkTimeout &&
          (p.link == nullptr || Closable(*p.link, p.last_used, now))) {
        closing.push_back(std::move(it->second));
        it = state_->peers.erase(it);
      } else {
        ++it;
      }
    }
    Peer& p = state_->peers[peer.instance_id];
    p.region_bytes = peer.region_bytes;
    p.last_used = now;
    return Status();
  }

  // The publisher sends when asked: no layer-wise streaming.
  Status Pull(const KvDescriptor& descriptor, LayerRanges local, PullCallbacks callbacks,
              uint32_t layers_available) override {
    if (layers_available != kAllLayers && layers_available < descriptor.layers.size())
      return FailedPrecondition("NCCL transfers cannot stream layers (transfer.layerwise)");
    if (!callbacks.to_publisher)
      return FailedPrecondition("an NCCL pull needs a way to the publisher (to_publisher)");
    TANDEM_RETURN_IF_ERROR(CheckRequestId(descriptor.request_id));
    TANDEM_ASSIGN_OR_RETURN(uint64_t total, TotalBytes(descriptor.layers));
    if (total != descriptor.total_bytes) return InvalidArgument("descriptor total_bytes mismatch");
    TANDEM_RETURN_IF_ERROR(CheckRanges(local, region_.bytes));
    TANDEM_ASSIGN_OR_RETURN(std::vector<NcclReceive> receives,
                            PlanNcclReceives(descriptor.layers, local, options_.granule_bytes));

    // Post and order under one lock: the orders leave in the order the receives were posted.
    std::shared_ptr<OrderedLink> failed;  // destroyed after the lock (see Connect)
    std::lock_guard<std::mutex> lock(state_->mutex);
    auto peer = state_->peers.find(descriptor.instance_id);
    if (peer == state_->peers.end())
      return NotFound("NCCL publisher " + std::to_string(descriptor.instance_id) +
                      " not connected");
    TANDEM_RETURN_IF_ERROR(CheckRanges(descriptor.layers, peer->second.region_bytes));
    if (state_->inflight.count(descriptor.request_id))
      return FailedPrecondition("request " + descriptor.request_id + " already being pulled");
    Peer& p = peer->second;
    if (p.link == nullptr || !p.link->health().ok()) {  // first pull, or the last link failed
      failed = std::move(p.link);
      TANDEM_ASSIGN_OR_RETURN(p.unique_id, maker_.new_unique_id());
      TANDEM_ASSIGN_OR_RETURN(p.link, maker_.start(p.unique_id, /*rank=*/1));
      p.token = NewLinkToken();
    }
    p.last_used = Clock::now();

    OrderedLink::Transfer t;
    t.request_id = descriptor.request_id;
    t.layers = static_cast<uint32_t>(descriptor.layers.size());
    t.total_bytes = total;
    for (const NcclReceive& r : receives)
      t.messages.push_back({r.layer, static_cast<char*>(region_.base) + r.local_offset, r.length});
    const Clock::time_point start = Clock::now();
    t.deadline = start + options_.timeout;
    t.on_layer = std::move(callbacks.on_layer);
    t.on_done = [state = state_, metrics = metrics_, start, total, id = descriptor.request_id,
                 on_done = std::move(callbacks.on_done)](const Status& status) {
      {
        std::lock_guard<std::mutex> lock(state->mutex);
        state->inflight.erase(id);
      }
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      if (status.ok()) {
        metrics->Succeeded(seconds, total);
      } else {
        metrics->Failed(seconds, TransferMetrics::ReasonFor(status));
      }
      if (on_done) on_done(id, status);
    };
    state_->inflight.insert(descriptor.request_id);
    metrics_->Started();
    StatusOr<uint64_t> seq = p.link->Post(std::move(t));
    if (!seq.ok()) {
      state_->inflight.erase(descriptor.request_id);
      metrics_->Failed(0.0, TransferMetrics::ReasonFor(seq.status()));
      return seq.status();
    }
    NcclPullOrder order;
    order.link_token = p.token;
    order.unique_id = p.unique_id;
    order.seq = *seq;
    order.descriptor = descriptor;
    callbacks.to_publisher(Encode(order));
    return Status();
  }

  Status SetLayersAvailable(const std::string&, uint32_t) override {
    return FailedPrecondition("NCCL transfers cannot stream layers (transfer.layerwise)");
  }

  size_t inflight_count() const override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->inflight.size();
  }

 private:
  struct Peer {
    uint64_t region_bytes = 0;
    std::shared_ptr<OrderedLink> link;  // made at the first pull from this publisher
    uint64_t token = 0;
    std::string unique_id;
    Clock::time_point last_used;
  };
  struct State {
    std::mutex mutex;
    std::set<std::string> inflight;
    std::map<uint64_t, Peer> peers;  // by publisher instance id
  };
  MemoryRegion region_;
  PullDrivenOptions options_;
  OrderedLinkMaker maker_;
  std::shared_ptr<TransferMetrics> metrics_;
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

Status CheckMaker(const MemoryRegion& region, const OrderedLinkMaker& maker) {
  if (region.base == nullptr || region.bytes == 0) return InvalidArgument("empty region");
  if (!maker.new_unique_id || !maker.start) return InvalidArgument("a link maker without functions");
  return Status();
}

}  // namespace

StatusOr<std::unique_ptr<KvPublisher>> CreatePullDrivenPublisher(MemoryRegion region,
                                                                 PullDrivenOptions options,
                                                                 OrderedLinkMaker maker) {
  TANDEM_RETURN_IF_ERROR(CheckMaker(region, maker));
  return std::unique_ptr<KvPublisher>(new PullDrivenPublisher(region, options, std::move(maker)));
}

StatusOr<std::unique_ptr<KvPuller>> CreatePullDrivenPuller(MemoryRegion region,
                                                           PullDrivenOptions options,
                                                           OrderedLinkMaker maker) {
  TANDEM_RETURN_IF_ERROR(CheckMaker(region, maker));
  return std::unique_ptr<KvPuller>(new PullDrivenPuller(region, options, std::move(maker)));
}

}  // namespace tandem
