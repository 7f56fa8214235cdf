// The NCCL transport's publisher (kvtransfer/nccl_endpoints.h): the leases, the links it joins
// when a puller's first order names them, and the sends each order asks for.
#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/base/log.h"
#include "kvtransfer/nccl_endpoint_parts.h"
#include "kvtransfer/nccl_endpoints.h"
#include "kvtransfer/nccl_protocol.h"

namespace tandem {
namespace {

using nccl_detail::CheckRequestId;
using nccl_detail::Clock;
using nccl_detail::Closable;
using nccl_detail::LinksToReap;
using nccl_detail::TransferOf;

class PullDrivenPublisher final : public KvPublisher {
 public:
  PullDrivenPublisher(std::vector<MemoryRegion> pools, const KvPoolShape& shape,
                      PullDrivenOptions options, OrderedLinkMaker maker)
      : pools_(std::move(pools)), shape_(shape), options_(options), maker_(std::move(maker)) {
    info_.instance_id = NewInstanceId();
    info_.transport = std::string(kNcclTransport);
    info_.packed_rkey = EncodeKvPoolShape(shape_);
    info_.region_base = reinterpret_cast<uint64_t>(pools_[0].base);
    info_.region_bytes = shape_.pool_bytes();
  }

  // The links go before this returns, outside the lock: each aborts, drains and runs the
  // callbacks of its transfers (which take the lock); those let go of earlier first.
  ~PullDrivenPublisher() override {
    reaper_.Flush();
    std::map<std::string, Link> links;
    std::map<std::string, Lease> leases;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      links.swap(state_->links);
      leases.swap(state_->leases);
    }
    links.clear();
    for (auto& [id, lease] : leases)
      if (lease.on_release) lease.on_release(id, Cancelled("NCCL publisher closed"));
  }

  const PeerInfo& peer_info() const override { return info_; }

  StatusOr<KvDescriptor> Publish(const std::string& request_id, LayerRanges layers,
                                 ReleaseCallback on_release) override {
    TANDEM_RETURN_IF_ERROR(CheckRequestId(request_id));
    TANDEM_RETURN_IF_ERROR(CheckRanges(layers, shape_.pool_bytes()));
    if (layers.size() > kKvMaxLayers) return InvalidArgument("too many layers");
    TANDEM_ASSIGN_OR_RETURN(KvDescriptor descriptor,
                            MakeDescriptor(info_.instance_id, request_id, layers));
    std::vector<std::pair<std::string, ReleaseCallback>> expired = ExpireLeases();
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      Lease lease;
      lease.ranges = std::move(layers);
      lease.on_release = std::move(on_release);
      lease.published = Clock::now();
      if (!state_->leases.emplace(request_id, std::move(lease)).second)
        return InvalidArgument("request " + request_id + " already published");
    }
    for (auto& [id, cb] : expired)
      if (cb) cb(id, DeadlineExceeded("NCCL publication of " + id + " never released"));
    return descriptor;
  }

  // An order this publisher refuses after the puller posted its receives would leave them
  // waiting for nothing on every link it names, and the next order on them out of step: the
  // refusal drops those links (their other transfers fail now instead of at their deadline).
  Status OnPullerMessage(std::span<const uint8_t> bytes) override {
    TANDEM_ASSIGN_OR_RETURN(NcclPullOrder order, DecodeNcclPullOrder(bytes));
    // The plan, made outside the lock (tens of ms for a long prompt, during which Publish and
    // the links' callbacks would wait): the publication's kept one, or a new one.
    StatusOr<std::shared_ptr<const std::vector<NcclPairPlan>>> whole = PlanOf(order);
    LinksToReap closing(reaper_);  // let go of after the lock, on the reaper's thread
    std::lock_guard<std::mutex> lock(state_->mutex);
    Status served = whole.ok() ? Serve(order, *whole, &closing) : whole.status();
    if (!served.ok())
      for (const NcclPairOrder& pair : order.pairs) Drop(pair.unique_id, served, &closing);
    return served;
  }

  Status Release(const TransferResult& result) override {
    if (result.instance_id != info_.instance_id)
      return NotFound("result for another publisher instance");
    ReleaseCallback cb;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      auto it = state_->leases.find(result.request_id);
      if (it == state_->leases.end())
        return NotFound("request " + result.request_id + " not published");
      Lease& lease = it->second;
      if (lease.released.has_value())
        return NotFound("request " + result.request_id + " already released");
      // Sends posted cannot be withdrawn: they read the ranges until the puller's receives
      // take them or their timeout fails the link. The release completes then (SendsDone);
      // meanwhile the link stays in step and its other requests move on, and orders for this
      // one get filler.
      if (lease.sending > 0) {
        lease.released = result.ToStatus();
        return Status();
      }
      cb = std::move(lease.on_release);
      state_->leases.erase(it);
    }
    if (cb) cb(result.request_id, result.ToStatus());
    return Status();
  }

  bool StillReading(const std::string& request_id) const override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    auto it = state_->leases.find(request_id);
    return it != state_->leases.end() && it->second.released.has_value();
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
    // The copy plan of its pull, made at the first order and kept for the next batches, with
    // the puller's side it was made for.
    std::shared_ptr<const std::vector<NcclPairPlan>> plan;
    KvPoolShape plan_shape;
    LayerRanges plan_local;
    int sending = 0;                 // its transfers posted and not done
    uint32_t layers_sent = 0;        // the layers ordered so far: [0, layers_sent)
    bool failed = false;             // one of them failed: what is ordered next is filler
    // Released while sending: the release's status, reported once the sends end; what is
    // ordered next is filler.
    std::optional<Status> released;
  };
  struct Link {
    std::shared_ptr<OrderedLink> link;
    uint64_t next_seq = 0;  // the order due next
    Clock::time_point last_used;
  };
  struct State {
    std::mutex mutex;
    std::map<std::string, Lease> leases;
    std::map<std::string, Link> links;  // by unique id
  };

  // The plan the puller made its receives from, made again here, once per publication (the
  // lease keeps it for the request's next batches of layers; Serve stores it). Takes the lock
  // only to look. An order for another publisher is refused before any planning.
  StatusOr<std::shared_ptr<const std::vector<NcclPairPlan>>> PlanOf(const NcclPullOrder& order) {
    const KvDescriptor& d = order.descriptor;
    if (d.instance_id != info_.instance_id)
      return InvalidArgument("NCCL pull order for publisher " + std::to_string(d.instance_id) +
                             ", this is " + std::to_string(info_.instance_id));
    TANDEM_RETURN_IF_ERROR(CheckRequestId(d.request_id));
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      auto lease = state_->leases.find(d.request_id);
      if (lease != state_->leases.end() && KeptPlanFits(lease->second, order))
        return lease->second.plan;
    }
    TANDEM_ASSIGN_OR_RETURN(std::vector<NcclPairPlan> made,
                            PlanNcclPairs(d.layers, shape_, order.local, order.local_shape));
    return std::make_shared<const std::vector<NcclPairPlan>>(std::move(made));
  }

  static bool KeptPlanFits(const Lease& lease, const NcclPullOrder& order) {
    return lease.plan != nullptr && lease.plan_shape == order.local_shape &&
           lease.plan_local == order.local && lease.ranges == order.descriptor.layers;
  }

  // Under the lock: checks `order` against its plan (`whole`, PlanOf's) and the links, then
  // posts a transfer per pair. On an error nothing more is posted; the caller drops the links.
  Status Serve(const NcclPullOrder& order,
               const std::shared_ptr<const std::vector<NcclPairPlan>>& whole,
               LinksToReap* closing) {
    const KvDescriptor& d = order.descriptor;
    auto lease = state_->leases.find(d.request_id);
    if (lease != state_->leases.end() && lease->second.ranges == d.layers &&
        !KeptPlanFits(lease->second, order)) {  // kept for the next batches
      lease->second.plan = whole;
      lease->second.plan_shape = order.local_shape;
      lease->second.plan_local = order.local;
    }
    const std::vector<NcclPairPlan> plan =
        NcclPairsOfLayers(*whole, order.first_layer, order.end_layer);
    bool same_pairs = plan.size() == order.pairs.size();
    for (size_t i = 0; same_pairs && i < plan.size(); ++i)
      same_pairs = plan[i].remote_pool == order.pairs[i].remote_pool &&
                   plan[i].local_pool == order.pairs[i].local_pool;
    if (!same_pairs)
      return InvalidArgument("NCCL pull order of " + d.request_id +
                             ": its links are not the pairs of pools its plan moves");
    const Clock::time_point now = Clock::now();
    // Every link in step before any send is posted.
    size_t new_links = 0;
    for (const NcclPairOrder& pair : order.pairs) {
      auto found = state_->links.find(pair.unique_id);
      if (found == state_->links.end()) {
        ++new_links;
        if (pair.seq != 0)  // a link this publisher lost (or never had)
          return InvalidArgument("NCCL pull order " + std::to_string(pair.seq) +
                                 " for an unknown link");
      } else if (pair.seq != found->second.next_seq) {
        return DataLoss("NCCL pull order " + std::to_string(pair.seq) + " where order " +
                        std::to_string(found->second.next_seq) + " was due: link aborted");
      }
    }
    if (new_links > 0) {
      for (auto it = state_->links.begin(); it != state_->links.end();) {
        if (Closable(*it->second.link, it->second.last_used, now)) {
          closing->links.push_back(std::move(it->second.link));
          it = state_->links.erase(it);
        } else {
          ++it;
        }
      }
      if (state_->links.size() + new_links > kMaxPullDrivenLinks)
        return ResourceExhausted("NCCL publisher already has " +
                                 std::to_string(state_->links.size()) + " links");
    }
    // Held: the sends read the published ranges. Not held (released, never published, or
    // ranges that differ from the publication): filler of the same sizes from the ranges the
    // order names, so that the puller's receives complete and every link stays in step.
    const bool held = lease != state_->leases.end() && !lease->second.failed &&
                      !lease->second.released.has_value() && lease->second.ranges == d.layers;
    for (size_t i = 0; i < plan.size(); ++i) {
      const NcclPairOrder& pair = order.pairs[i];
      auto found = state_->links.find(pair.unique_id);
      if (found == state_->links.end()) {
        TANDEM_ASSIGN_OR_RETURN(
            std::shared_ptr<OrderedLink> made,
            maker_.start(pair.unique_id, /*rank=*/0, static_cast<int>(pair.remote_pool)));
        found = state_->links.emplace(pair.unique_id, Link{std::move(made), 0, now}).first;
      }
      Link& link = found->second;
      link.last_used = now;
      OrderedLink::Transfer t = TransferOf(d.request_id, order.first_layer, order.end_layer,
                                           plan[i], pools_[pair.remote_pool], true);
      t.held = held;
      t.deadline = now + options_.timeout;
      if (held)
        t.on_done = [state = state_, id = d.request_id](const Status& status) {
          SendsDone(*state, id, status);
        };
      TANDEM_ASSIGN_OR_RETURN(uint64_t seq, link.link->Post(std::move(t)));
      TANDEM_CHECK(seq == link.next_seq, "an NCCL publisher link posted out of its own order");
      ++link.next_seq;
      if (held) ++lease->second.sending;
    }
    if (held) lease->second.layers_sent = std::max(lease->second.layers_sent, order.end_layer);
    return Status();
  }

  // Aborts and forgets the link of `uid` (lock held); `closing` destroys it after the lock.
  void Drop(const std::string& uid, const Status& why, LinksToReap* closing) {
    auto it = state_->links.find(uid);
    if (it == state_->links.end()) return;
    it->second.link->Abort(why);
    closing->links.push_back(std::move(it->second.link));
    state_->links.erase(it);
  }

  // A link's thread: one transfer of a held request completed (OK) or failed. The last of them
  // ends the lease when it was released meanwhile (with the release's status), or when every
  // layer was sent and every transfer completed OK. One failed: the lease stays, for Release
  // or its timeout, and later orders of it get filler.
  static void SendsDone(State& state, const std::string& id, const Status& status) {
    ReleaseCallback cb;
    Status outcome;
    {
      std::lock_guard<std::mutex> lock(state.mutex);
      auto it = state.leases.find(id);
      if (it == state.leases.end() || it->second.sending == 0) return;
      Lease& lease = it->second;
      lease.failed = lease.failed || !status.ok();
      if (--lease.sending > 0) return;
      if (lease.released.has_value()) {
        outcome = *lease.released;
      } else if (lease.failed || lease.layers_sent < lease.ranges.size()) {
        return;
      }
      cb = std::move(lease.on_release);
      state.leases.erase(it);
    }
    if (cb) cb(id, outcome);
  }

  std::vector<std::pair<std::string, ReleaseCallback>> ExpireLeases() {
    std::vector<std::pair<std::string, ReleaseCallback>> expired;
    const Clock::time_point now = Clock::now();
    std::lock_guard<std::mutex> lock(state_->mutex);
    for (auto it = state_->leases.begin(); it != state_->leases.end();) {
      if (it->second.sending == 0 && now - it->second.published > options_.lease_timeout) {
        expired.emplace_back(it->first, std::move(it->second.on_release));
        it = state_->leases.erase(it);
      } else {
        ++it;
      }
    }
    return expired;
  }

  std::vector<MemoryRegion> pools_;
  KvPoolShape shape_;
  PullDrivenOptions options_;
  OrderedLinkMaker maker_;
  PeerInfo info_;
  std::shared_ptr<State> state_ = std::make_shared<State>();
  Reaper reaper_;  // lets go of the links an order closes or drops (their teardown may wait)
};

}  // namespace

StatusOr<std::unique_ptr<KvPublisher>> CreatePullDrivenPublisher(std::vector<MemoryRegion> pools,
                                                                 const KvPoolShape& shape,
                                                                 PullDrivenOptions options,
                                                                 OrderedLinkMaker maker) {
  TANDEM_RETURN_IF_ERROR(nccl_detail::CheckPools(pools, shape, maker));
  return std::unique_ptr<KvPublisher>(
      new PullDrivenPublisher(std::move(pools), shape, options, std::move(maker)));
}

}  // namespace tandem
