// The NCCL transport's puller (kvtransfer/nccl_endpoints.h): its links per pair of pools, the
// receives and the pull orders that ask the publisher for the matching sends, and a watchdog
// for the pulls that wait on layers.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/base/log.h"
#include "common/net/control_wire.h"
#include "kvtransfer/nccl_endpoint_parts.h"
#include "kvtransfer/nccl_endpoints.h"
#include "kvtransfer/nccl_protocol.h"

namespace tandem {
namespace {

using nccl_detail::CheckRequestId;
using nccl_detail::Clock;
using nccl_detail::Closable;
using nccl_detail::kIdleLinkTimeout;
using nccl_detail::LinksToReap;
using nccl_detail::TransferOf;

// The puller stops using a link idle for half of kIdleLinkTimeout (and makes a new one), so that it never
// orders on a link the publisher may have closed as idle.
constexpr auto kPullerLinkIdle = kIdleLinkTimeout / 2;
// Layer-wise, a pull orders its layers in at most this many batches (each order carries the
// request's ranges, and each costs both sides a plan lookup): a raise of the available layers
// orders once it adds a batch's worth, or reaches the last layer.
constexpr uint32_t kOrderBatches = 8;
// An order travels in a KvTransport, whose bytes the control plane bounds.
constexpr size_t kMaxNcclOrderBytes = kMaxBlobBytes;

using PairKey = std::pair<uint32_t, uint32_t>;  // (publisher pool, puller pool)

// One pull: what it moves, what it has ordered, and what it has told its caller. Layer-wise, a
// pull is ordered in batches of layers (Pull, then each SetLayersAvailable that raises the
// count), each batch one transfer per pair of pools.
struct PullEntry {
  // Set by Pull, then read only.
  std::string request_id;
  uint64_t publisher = 0;
  KvDescriptor descriptor;
  LayerRanges local;
  std::vector<NcclPairPlan> plan;  // the whole request's
  uint32_t layers = 0;
  std::function<void(std::string)> to_publisher;
  Clock::time_point start;
  uint64_t total_bytes = 0;
  uint32_t ordered = 0;  // layers [0, ordered) are ordered; guarded by the puller's lock

  // Guarded by `mutex` (the links' threads report here).
  std::mutex mutex;
  std::map<PairKey, uint32_t> layers_done;  // per pair: layers [0, n) landed
  uint32_t layers_reported = 0;
  size_t transfers_left = 0;
  Clock::time_point idle_since;  // when the last transfer in flight completed
  Status status;                 // the first failure
  bool refused = false;          // Pull returned an error: no callback runs
  bool finished = false;         // on_done ran
  std::function<void(uint32_t layer)> on_layer;
  std::function<void(const std::string& request_id, const Status& status)> on_done;
};

class PullDrivenPuller final : public KvPuller {
 public:
  PullDrivenPuller(std::vector<MemoryRegion> pools, const KvPoolShape& shape,
                   PullDrivenOptions options, OrderedLinkMaker maker)
      : pools_(std::move(pools)),
        shape_(shape),
        options_(options),
        maker_(std::move(maker)),
        metrics_(std::make_shared<TransferMetrics>(options.metrics)),
        watchdog_([this] { Watch(); }) {}

  // The links go first (each aborts, drains and fails its transfers: Cancelled), then the pulls
  // that had nothing in flight end with Cancelled too.
  ~PullDrivenPuller() override {
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      stop_ = true;
    }
    wake_.notify_all();
    watchdog_.join();
    reaper_.Flush();  // the links let go of earlier, and the callbacks of their transfers
    std::map<uint64_t, Peer> peers;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      peers.swap(state_->peers);
    }
    peers.clear();
    std::vector<std::shared_ptr<PullEntry>> left;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      for (auto& [id, entry] : state_->pulls) left.push_back(entry);
    }
    for (auto& entry : left)
      if (Claim(*entry)) Complete(*state_, *metrics_, *entry, Cancelled("NCCL puller closed"));
  }

  Status Connect(const PeerInfo& peer) override {
    if (peer.transport != kNcclTransport)
      return InvalidArgument("NCCL puller cannot connect to transport '" + peer.transport + "'");
    if (peer.instance_id == 0) return InvalidArgument("publisher instance id 0");
    size_t consumed = 0;
    TANDEM_ASSIGN_OR_RETURN(KvPoolShape shape, DecodeKvPoolShape(peer.packed_rkey, &consumed));
    if (consumed != peer.packed_rkey.size())
      return InvalidArgument("NCCL publisher's key is " + std::to_string(peer.packed_rkey.size()) +
                             " bytes, its pool shape " + std::to_string(consumed));
    if (shape.full != shape_.full)
      return InvalidArgument("NCCL publisher serves another model's KV: " +
                             shape.full.ToString() + ", here " + shape_.full.ToString());
    LinksToReap closing(reaper_);  // let go of after the lock: a link's destructor takes it
    std::lock_guard<std::mutex> lock(state_->mutex);
    const Clock::time_point now = Clock::now();
    for (auto it = state_->peers.begin(); it != state_->peers.end();) {
      if (it->first != peer.instance_id && Idle(it->first, it->second, now)) {
        for (auto& [pair, link] : it->second.links) closing.links.push_back(std::move(link.link));
        it = state_->peers.erase(it);
      } else {
        ++it;
      }
    }
    Peer& p = state_->peers[peer.instance_id];
    p.shape = shape;
    p.last_used = now;
    return Status();
  }

  Status Pull(const KvDescriptor& descriptor, LayerRanges local, PullCallbacks callbacks,
              uint32_t layers_available) override {
    if (!callbacks.to_publisher)
      return FailedPrecondition("an NCCL pull needs a way to the publisher (to_publisher)");
    TANDEM_RETURN_IF_ERROR(CheckRequestId(descriptor.request_id));
    TANDEM_ASSIGN_OR_RETURN(uint64_t total, TotalBytes(descriptor.layers));
    if (total != descriptor.total_bytes) return InvalidArgument("descriptor total_bytes mismatch");

    // The plan, made outside the lock (tens of ms for a long prompt, during which the links'
    // callbacks and other pulls would wait) from the publisher's shape, fixed for its life.
    auto entry = std::make_shared<PullEntry>();
    KvPoolShape remote_shape;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      auto peer = state_->peers.find(descriptor.instance_id);
      if (peer == state_->peers.end())
        return NotFound("NCCL publisher " + std::to_string(descriptor.instance_id) +
                        " not connected");
      remote_shape = peer->second.shape;
    }
    TANDEM_ASSIGN_OR_RETURN(entry->plan,
                            PlanNcclPairs(descriptor.layers, remote_shape, local, shape_));
    if (entry->plan.empty())  // every pull ends with a transfer's completion
      return InvalidArgument("NCCL pull of " + descriptor.request_id + " moves no bytes");

    LinksToReap failed(reaper_);  // let go of after the lock, on the reaper's thread
    std::lock_guard<std::mutex> lock(state_->mutex);
    auto peer = state_->peers.find(descriptor.instance_id);
    if (peer == state_->peers.end())  // forgotten meanwhile
      return NotFound("NCCL publisher " + std::to_string(descriptor.instance_id) +
                      " not connected");
    Peer& p = peer->second;
    if (state_->pulls.count(descriptor.request_id))
      return FailedPrecondition("request " + descriptor.request_id + " already being pulled");
    entry->request_id = descriptor.request_id;
    entry->publisher = descriptor.instance_id;
    entry->descriptor = descriptor;
    entry->local = std::move(local);
    entry->layers = static_cast<uint32_t>(descriptor.layers.size());
    entry->to_publisher = std::move(callbacks.to_publisher);
    entry->start = entry->idle_since = Clock::now();
    entry->total_bytes = total;
    entry->on_layer = std::move(callbacks.on_layer);
    entry->on_done = std::move(callbacks.on_done);
    for (const NcclPairPlan& pair : entry->plan) entry->layers_done[{pair.remote_pool, pair.local_pool}] = 0;
    p.last_used = Clock::now();
    state_->pulls[entry->request_id] = entry;
    metrics_->Started();
    const uint32_t available = std::min(layers_available, entry->layers);
    if (WorthOrdering(*entry, available)) {
      Status posted = Order(p, entry, available, /*refuse_on_error=*/true, &failed.links);
      if (!posted.ok()) {  // refused (Order marked it): no callback of this pull runs
        state_->pulls.erase(entry->request_id);
        metrics_->Failed(0.0, TransferMetrics::ReasonFor(posted));
        return posted;
      }
    }
    return Status();
  }

  Status SetLayersAvailable(const std::string& request_id, uint32_t layers) override {
    LinksToReap failed(reaper_);  // let go of after the lock, on the reaper's thread
    std::lock_guard<std::mutex> lock(state_->mutex);
    auto it = state_->pulls.find(request_id);
    if (it == state_->pulls.end()) return NotFound("request " + request_id + " is not being pulled");
    std::shared_ptr<PullEntry> entry = it->second;
    const uint32_t available = std::min(layers, entry->layers);
    if (available <= entry->ordered) return Status();
    if (!WorthOrdering(*entry, available)) {  // announced: the layer wait starts again
      std::lock_guard<std::mutex> pull_lock(entry->mutex);
      if (entry->transfers_left == 0) entry->idle_since = Clock::now();
      return Status();
    }
    auto peer = state_->peers.find(entry->publisher);
    Status posted = peer == state_->peers.end()
                        ? Unavailable("NCCL publisher " + std::to_string(entry->publisher) +
                                      " forgotten")
                        : Order(peer->second, entry, available, /*refuse_on_error=*/false,
                                &failed.links);
    if (posted.code() == StatusCode::kCancelled) return Status();  // ending already
    if (!posted.ok()) {  // the pull fails (the watchdog ends it once nothing is in flight)
      std::lock_guard<std::mutex> pull_lock(entry->mutex);
      if (entry->status.ok()) entry->status = posted;
    }
    wake_.notify_all();
    return Status();
  }

  size_t inflight_count() const override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->pulls.size();
  }

 private:
  struct PairLink {
    std::shared_ptr<OrderedLink> link;  // made at the first pull that needs it
    std::string unique_id;
    Clock::time_point last_used;
  };
  struct Peer {
    KvPoolShape shape;  // the publisher's pools
    std::map<PairKey, PairLink> links;
    Clock::time_point last_used;
  };
  struct State {
    std::mutex mutex;
    std::map<uint64_t, Peer> peers;                            // by publisher instance id
    std::map<std::string, std::shared_ptr<PullEntry>> pulls;  // by request id
  };

  // Orders layers [entry.ordered, end): posts a transfer per pair on its link (a new link where
  // there is none, it failed, or it idled long enough that the publisher may close it), then
  // sends the order. Under the lock, so that orders leave in the order their receives were
  // posted. Cancelled (nothing done) when the pull is ending already. A transfer that cannot be
  // posted: the ones posted before it lose their links (nothing would pair with them), the pull
  // is refused (`refuse_on_error`: Pull's first order, no callback will run) or failed, and the
  // error is returned.
  Status Order(Peer& p, const std::shared_ptr<PullEntry>& entry, uint32_t end,
               bool refuse_on_error, std::vector<std::shared_ptr<OrderedLink>>* failed) {
    const uint32_t first = entry->ordered;
    const std::vector<NcclPairPlan> part = NcclPairsOfLayers(entry->plan, first, end);
    const Clock::time_point now = Clock::now();
    NcclPullOrder order;
    order.descriptor = entry->descriptor;
    order.local_shape = shape_;
    order.local = entry->local;
    order.first_layer = first;
    order.end_layer = end;
    for (const NcclPairPlan& pair : part) {
      PairLink& link = p.links[{pair.remote_pool, pair.local_pool}];
      const bool stale = link.link != nullptr && link.link->inflight_count() == 0 &&
                         now - link.last_used > kPullerLinkIdle;
      if (link.link == nullptr || !link.link->health().ok() || stale) {
        failed->push_back(std::move(link.link));
        TANDEM_ASSIGN_OR_RETURN(link.unique_id, maker_.new_unique_id());
        TANDEM_ASSIGN_OR_RETURN(link.link, maker_.start(link.unique_id, /*rank=*/1,
                                                        static_cast<int>(pair.local_pool)));
      }
      order.pairs.push_back({pair.remote_pool, pair.local_pool, link.unique_id, 0});
    }
    // The order must fit the control plane's message (its seqs do not change its size).
    if (const size_t bytes = Encode(order).size(); bytes > kMaxNcclOrderBytes)
      return ResourceExhausted("NCCL pull order of " + entry->request_id + " would be " +
                               std::to_string(bytes) + " bytes, over the control plane's " +
                               std::to_string(kMaxNcclOrderBytes));
    {
      // One critical section with the decisions to end the pull (Claim): either it is ending
      // and nothing is posted, or these transfers count before any can complete.
      std::lock_guard<std::mutex> pull_lock(entry->mutex);
      if (entry->finished || entry->refused || !entry->status.ok())
        return Cancelled("NCCL pull of " + entry->request_id + " is ending");
      entry->transfers_left += part.size();
      for (auto& [key, done] : entry->layers_done) {  // pairs with nothing in these layers
        const bool moves = std::any_of(part.begin(), part.end(), [&](const NcclPairPlan& q) {
          return PairKey{q.remote_pool, q.local_pool} == key;
        });
        if (!moves) done = std::max(done, end);
      }
    }
    const Clock::time_point deadline = now + options_.timeout;
    for (size_t i = 0; i < part.size(); ++i) {
      const PairKey key{part[i].remote_pool, part[i].local_pool};
      OrderedLink::Transfer t = TransferOf(entry->request_id, first, end, part[i],
                                           pools_[part[i].local_pool], false);
      t.deadline = deadline;
      t.on_layer = [entry, key](uint32_t layer) { LayerDone(*entry, key, layer); };
      t.on_done = [state = state_, metrics = metrics_, entry](const Status& status) {
        TransferDone(*state, *metrics, *entry, status);
      };
      PairLink& link = p.links[key];
      StatusOr<uint64_t> seq = link.link->Post(std::move(t));
      if (!seq.ok()) {
        {
          std::lock_guard<std::mutex> pull_lock(entry->mutex);
          entry->transfers_left -= part.size() - i;
          if (entry->status.ok()) entry->status = seq.status();
          entry->refused = entry->refused || refuse_on_error;
        }
        for (size_t j = 0; j < i; ++j)
          p.links[{part[j].remote_pool, part[j].local_pool}].link->Abort(seq.status());
        return seq.status();
      }
      link.last_used = now;
      order.pairs[i].seq = *seq;
    }
    entry->ordered = end;
    p.last_used = now;
    entry->to_publisher(Encode(order));
    return Status();
  }

  // Whether `available` layers make a batch worth an order: a batch's worth more than ordered,
  // or every layer.
  static bool WorthOrdering(const PullEntry& entry, uint32_t available) {
    const uint32_t batch = std::max<uint32_t>(1, (entry.layers + kOrderBatches - 1) / kOrderBatches);
    return available > entry.ordered &&
           (available == entry.layers || available - entry.ordered >= batch);
  }

  // A peer whose links are all closable and that no pull waits on.
  bool Idle(uint64_t id, const Peer& peer, Clock::time_point now) const {
    if (now - peer.last_used <= kIdleLinkTimeout) return false;
    for (const auto& [pair, link] : peer.links)
      if (link.link != nullptr && !Closable(*link.link, peer.last_used, now)) return false;
    for (const auto& [request, entry] : state_->pulls)
      if (entry->publisher == id) return false;
    return true;
  }

  static uint32_t AllLanded(const PullEntry& entry) {
    uint32_t all = entry.layers;
    for (const auto& [key, done] : entry.layers_done) all = std::min(all, done);
    return all;
  }

  // A link's thread: layer `layer` of pair `key` landed; report the layers every pair has.
  static void LayerDone(PullEntry& entry, PairKey key, uint32_t layer) {
    std::vector<uint32_t> report;
    std::function<void(uint32_t)> on_layer;
    {
      std::lock_guard<std::mutex> lock(entry.mutex);
      uint32_t& done = entry.layers_done[key];
      done = std::max(done, layer + 1);
      if (entry.refused || entry.finished || !entry.status.ok()) return;
      for (const uint32_t all = AllLanded(entry); entry.layers_reported < all;)
        report.push_back(entry.layers_reported++);
      on_layer = entry.on_layer;
    }
    if (on_layer)
      for (uint32_t l : report) on_layer(l);
  }

  // A link's thread: one transfer ended. The pull ends when nothing of it is in flight and it
  // failed or every layer landed; else it waits for more layers (the watchdog bounds that).
  static void TransferDone(State& state, TransferMetrics& metrics, PullEntry& entry,
                           const Status& status) {
    Status outcome;
    {
      std::lock_guard<std::mutex> lock(entry.mutex);
      if (entry.status.ok() && !status.ok()) entry.status = status;
      if (--entry.transfers_left > 0 || entry.refused || entry.finished) return;
      entry.idle_since = Clock::now();
      if (entry.status.ok() && AllLanded(entry) < entry.layers) return;
      entry.finished = true;  // claimed here, in the section that saw it end (see Order)
      outcome = entry.status;
    }
    Complete(state, metrics, entry, outcome);
  }

  // Marks a pull as ending, once; false when it already is (or was refused).
  static bool Claim(PullEntry& entry) {
    std::lock_guard<std::mutex> lock(entry.mutex);
    if (entry.finished || entry.refused) return false;
    entry.finished = true;
    return true;
  }

  // Ends a claimed pull: forgets it, counts it, tells the caller.
  static void Complete(State& state, TransferMetrics& metrics, PullEntry& entry,
                       const Status& status) {
    {
      std::lock_guard<std::mutex> lock(state.mutex);
      auto it = state.pulls.find(entry.request_id);
      if (it != state.pulls.end() && it->second.get() == &entry) state.pulls.erase(it);
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - entry.start).count();
    if (status.ok()) {
      metrics.Succeeded(seconds, entry.total_bytes);
    } else {
      metrics.Failed(seconds, TransferMetrics::ReasonFor(status));
    }
    if (entry.on_done) entry.on_done(entry.request_id, status);
  }

  // Ends the pulls that have nothing in flight and failed (an order that could not be posted),
  // or waited longer than layer_wait_timeout for their next layers.
  void Watch() {
    std::unique_lock<std::mutex> lock(state_->mutex);
    while (!stop_) {
      wake_.wait_for(lock, std::chrono::milliseconds(20));
      const Clock::time_point now = Clock::now();
      std::vector<std::pair<std::shared_ptr<PullEntry>, Status>> ending;
      for (auto& [id, entry] : state_->pulls) {
        // Decided and claimed under both locks: an Order in between sees it ending.
        std::lock_guard<std::mutex> pull_lock(entry->mutex);
        if (entry->transfers_left > 0 || entry->finished || entry->refused) continue;
        if (!entry->status.ok()) {
          ending.emplace_back(entry, entry->status);
        } else if (AllLanded(*entry) >= entry->layers) {  // its last batch moved no bytes
          ending.emplace_back(entry, Status());
        } else if (entry->ordered < entry->layers &&
                   now - entry->idle_since > options_.layer_wait_timeout) {
          ending.emplace_back(entry, DeadlineExceeded(
                                         "NCCL pull of " + id + ": layer " +
                                         std::to_string(entry->ordered) + " not made available "
                                         "within the layer wait timeout"));
        } else {
          continue;
        }
        entry->finished = true;
      }
      lock.unlock();
      for (auto& [entry, status] : ending) Complete(*state_, *metrics_, *entry, status);
      lock.lock();
    }
  }

  std::vector<MemoryRegion> pools_;
  KvPoolShape shape_;
  PullDrivenOptions options_;
  OrderedLinkMaker maker_;
  std::shared_ptr<TransferMetrics> metrics_;
  std::shared_ptr<State> state_ = std::make_shared<State>();
  bool stop_ = false;  // guarded by state_->mutex
  std::condition_variable wake_;
  Reaper reaper_;  // lets go of the links replaced or closed (their teardown may wait)
  std::thread watchdog_;  // last: starts once the rest is made
};


}  // namespace

StatusOr<std::unique_ptr<KvPuller>> CreatePullDrivenPuller(std::vector<MemoryRegion> pools,
                                                           const KvPoolShape& shape,
                                                           PullDrivenOptions options,
                                                           OrderedLinkMaker maker) {
  TANDEM_RETURN_IF_ERROR(nccl_detail::CheckPools(pools, shape, maker));
  return std::unique_ptr<KvPuller>(
      new PullDrivenPuller(std::move(pools), shape, options, std::move(maker)));
}

}  // namespace tandem
