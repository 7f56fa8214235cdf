// The NCCL transport's publisher and puller (kvtransfer/nccl_endpoints.h) on the CPU: the same
// code the servers run on GPUs, over a CPU link pair that pairs transfers by posting order as
// NCCL does (NCCL itself needs GPUs: tests/gpu/nccl_transfer_check.cc). The test is the control
// plane: it carries the descriptors to the puller and the pull orders back, in order, and can
// hold orders back, drop them or forge them.
#include <catch2/catch.hpp>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "kvtransfer/nccl_endpoints.h"
#include "kvtransfer/nccl_packing.h"
#include "kvtransfer/nccl_protocol.h"
#include "kvtransfer/sharded_copies.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Both ranks of one link: a thread pairs the i-th send with the i-th receive, checks the header
// as NcclLink does (kvtransfer/nccl_protocol.h), copies message by message, and fails the whole
// link on a deadline, a mismatch or an abort, as an aborted communicator does.
class Wire {
 public:
  Wire() : thread_([this] { Run(); }) {}
  ~Wire() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    Fail(Cancelled("link closed"), -1, Status());
  }

  // As NcclLink's: an abort not yet carried out counts as a failure already.
  Status health() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (health_.ok() && !abort_.ok()) return Unavailable("aborted: " + abort_.ToString());
    return health_;
  }
  size_t inflight(int rank) {
    std::lock_guard<std::mutex> lock(mutex_);
    return queue_[rank].size() + pairing_;
  }
  StatusOr<uint64_t> Post(int rank, OrderedLink::Transfer t) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!health_.ok()) return health_;
    if (!abort_.ok()) return Unavailable("aborted: " + abort_.ToString());
    const uint64_t seq = next_seq_[rank]++;
    queue_[rank].push_back({std::move(t), seq});
    cv_.notify_all();
    return seq;
  }
  // As NcclLink's: returns at once, the link's thread fails the transfers (callers may hold
  // locks that the callbacks take).
  void Abort(const Status& reason) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (abort_.ok()) abort_ = reason;
    cv_.notify_all();
  }

 private:
  struct Entry {
    OrderedLink::Transfer t;
    uint64_t seq;
  };

  // Fails every transfer: the front one of `culprit_rank` with `culprit`, the rest `status`.
  void Fail(const Status& status, int culprit_rank, const Status& culprit) {
    std::deque<Entry> queues[2];
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (health_.ok()) health_ = Unavailable("link failed: " + status.ToString());
      queues[0].swap(queue_[0]);
      queues[1].swap(queue_[1]);
    }
    for (int rank = 0; rank < 2; ++rank)
      for (size_t i = 0; i < queues[rank].size(); ++i)
        if (queues[rank][i].t.on_done)
          queues[rank][i].t.on_done(rank == culprit_rank && i == 0 ? culprit : status);
  }

  void Run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      cv_.wait_for(lock, 2ms);
      if (!abort_.ok()) {
        const Status reason = abort_;
        if (health_.ok()) health_ = Unavailable("link failed: " + reason.ToString());
        abort_ = Status();
        lock.unlock();
        Fail(reason, -1, Status());
        lock.lock();
        continue;
      }
      for (int rank = 0; rank < 2; ++rank) {
        if (!queue_[rank].empty() && Clock::now() >= queue_[rank].front().t.deadline) {
          const std::string id = queue_[rank].front().t.request_id;
          lock.unlock();
          Fail(Unavailable("transfer " + id + " timed out"), rank,
               DeadlineExceeded("transfer " + id + " not done within its timeout"));
          lock.lock();
        }
      }
      if (queue_[0].empty() || queue_[1].empty()) continue;
      Entry send = std::move(queue_[0].front());
      Entry recv = std::move(queue_[1].front());
      queue_[0].pop_front();
      queue_[1].pop_front();
      pairing_ = 1;  // still in flight on each side
      lock.unlock();
      Pair(send, recv);
      lock.lock();
      pairing_ = 0;
    }
  }

  void Pair(Entry& send, Entry& recv) {
    const auto header = EncodeNcclHeader(
        MakeNcclHeader(send.seq, send.t.total_bytes, send.t.request_id, send.t.held,
                       MessageLayoutOf(send.t.messages, kStagingBytes)));
    Status verdict = CheckNcclHeader(header, recv.seq, recv.t.total_bytes, recv.t.request_id,
                                     MessageLayoutOf(recv.t.messages, kStagingBytes));
    bool same_messages = send.t.messages.size() == recv.t.messages.size();
    for (size_t i = 0; same_messages && i < send.t.messages.size(); ++i)
      same_messages = send.t.messages[i].bytes == recv.t.messages[i].bytes &&
                      send.t.messages[i].rows == recv.t.messages[i].rows;
    // As NcclLink posts them: a group per layer of the transfer, messages in layer order.
    for (const Entry* e : {&send, &recv})
      for (size_t i = 0; same_messages && i < e->t.messages.size(); ++i) {
        const uint32_t layer = e->t.messages[i].layer;
        same_messages = layer >= e->t.first_layer && layer < e->t.first_layer + e->t.layers &&
                        (i == 0 || e->t.messages[i - 1].layer <= layer);
      }
    // Each rank plans its own sends (receives): they must be the same NCCL operations.
    same_messages = same_messages && SameLayerPlans(send.t.messages, recv.t.messages);
    if (verdict.code() == StatusCode::kDataLoss || !same_messages) {
      if (verdict.ok()) verdict = DataLoss("messages of different sizes");
      {
        std::lock_guard<std::mutex> lock(mutex_);
        queue_[1].push_front(std::move(recv));
        queue_[0].push_front(std::move(send));
      }
      return Fail(Unavailable("out of step"), 1, verdict);
    }
    MoveAsNcclLink(send.t.messages, recv.t.messages);
    // As NcclLink: the header is checked before any layer counts; filler reports none.
    for (uint32_t l = 0; verdict.ok() && l < recv.t.layers; ++l)
      if (recv.t.on_layer) recv.t.on_layer(recv.t.first_layer + l);
    if (send.t.on_done) send.t.on_done(Status());
    if (recv.t.on_done) recv.t.on_done(verdict);
  }

  // The staging buffer of this link: small, so that layers take several rounds.
  static constexpr uint64_t kStagingBytes = 40;

  // Whether the two ranks' per-layer plans (PlanLayerSends, each from its own messages) post
  // the same operations: the same direct messages, rounds of the same parts and bytes.
  static bool SameLayerPlans(const std::vector<OrderedLink::Message>& a,
                             const std::vector<OrderedLink::Message>& b) {
    for (size_t begin = 0; begin < a.size();) {
      size_t end = begin;
      while (end < a.size() && a[end].layer == a[begin].layer) ++end;
      const LayerSends pa = PlanLayerSends({a.data() + begin, end - begin}, kStagingBytes);
      const LayerSends pb = PlanLayerSends({b.data() + begin, end - begin}, kStagingBytes);
      if (pa.direct != pb.direct || pa.rounds.size() != pb.rounds.size()) return false;
      for (size_t r = 0; r < pa.rounds.size(); ++r)
        if (pa.rounds[r].bytes != pb.rounds[r].bytes || pa.rounds[r].parts != pb.rounds[r].parts)
          return false;
      begin = end;
    }
    return true;
  }

  // As NcclLink moves them (kvtransfer/nccl_packing.h), layer by layer: the direct messages
  // row by row, the strided ones gathered into a staging buffer, round by round, and scattered
  // from it.
  static void MoveAsNcclLink(const std::vector<OrderedLink::Message>& from,
                             const std::vector<OrderedLink::Message>& to) {
    constexpr uint64_t kStaging = kStagingBytes;
    std::vector<char> staging(kStaging);
    for (size_t begin = 0; begin < from.size();) {
      size_t end = begin;
      while (end < from.size() && from[end].layer == from[begin].layer) ++end;
      const std::span<const OrderedLink::Message> src(from.data() + begin, end - begin);
      const std::span<const OrderedLink::Message> dst(to.data() + begin, end - begin);
      const LayerSends plan = PlanLayerSends(src, kStaging);
      for (size_t m : plan.direct) {
        const RowCopy direct{src[m].data, dst[m].data, src[m].stride, dst[m].stride, src[m].bytes,
                             src[m].rows};
        CopyRowsOnHost({&direct, 1});
      }
      for (const PackRound& round : plan.rounds) {
        CopyRowsOnHost(GatherCopies(round, src, staging.data()));
        CopyRowsOnHost(ScatterCopies(round, dst, staging.data()));
      }
      begin = end;
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  Status health_;
  Status abort_;  // an Abort the thread has not carried out yet
  size_t pairing_ = 0;  // a pair of transfers being copied (counted on both sides)
  uint64_t next_seq_[2] = {0, 0};
  std::deque<Entry> queue_[2];
  std::thread thread_;  // last: starts after the rest is made
};

class CpuLink final : public OrderedLink {
 public:
  CpuLink(std::shared_ptr<Wire> wire, int rank) : wire_(std::move(wire)), rank_(rank) {}
  ~CpuLink() override { wire_->Abort(Cancelled("the other end closed the link")); }
  Status health() const override { return wire_->health(); }
  StatusOr<uint64_t> Post(Transfer transfer) override {
    return wire_->Post(rank_, std::move(transfer));
  }
  void Abort(const Status& reason) override { wire_->Abort(reason); }
  size_t inflight_count() const override { return wire_->inflight(rank_); }

 private:
  std::shared_ptr<Wire> wire_;
  int rank_;
};

// The "NCCL" of these tests: unique ids name wires; both ranks of an id share one.
struct CpuLinks {
  std::mutex mutex;
  std::map<std::string, std::weak_ptr<Wire>> wires;
  int ids_made = 0;

  OrderedLinkMaker Maker() {
    OrderedLinkMaker maker;
    maker.new_unique_id = [this]() -> StatusOr<std::string> {
      std::lock_guard<std::mutex> lock(mutex);
      std::string id(kNcclUniqueIdBytes, '\0');
      std::snprintf(id.data(), id.size(), "cpu-link-%d", ++ids_made);
      return id;
    };
    maker.start = [this](std::string_view id, int rank,
                         int /*pool*/) -> StatusOr<std::shared_ptr<OrderedLink>> {
      std::lock_guard<std::mutex> lock(mutex);
      std::shared_ptr<Wire> wire = wires[std::string(id)].lock();
      if (!wire) {
        wire = std::make_shared<Wire>();
        wires[std::string(id)] = wire;
      }
      return std::shared_ptr<OrderedLink>(std::make_shared<CpuLink>(wire, rank));
    };
    return maker;
  }
};

// The model of these tests: 3 layers, 4 KV heads of 1 dimension, blocks of 2 tokens: a block of
// a layer is 64 bytes in a degree-1 pool (16 per head), pools of 32 blocks a layer.
constexpr uint64_t kBlock = 64;
constexpr int kLayers = 3, kPoolBlocks = 32;
const KvLayout kModel{kLayers, 4, 1, 2};

// A prefill and a decode side of the given degrees; the test is their control plane.
struct Cluster {
  CpuLinks links;
  KvPoolShape prefill_shape, decode_shape;
  std::vector<std::vector<char>> prefill_pools, decode_pools;
  std::unique_ptr<KvPublisher> publisher;
  std::unique_ptr<KvPuller> puller;
  std::mutex mutex;
  std::deque<std::string> orders;  // decode -> prefill, in the order the puller made them

  explicit Cluster(std::chrono::milliseconds timeout = 5000ms, int prefill_degree = 1,
                   int decode_degree = 1, std::chrono::milliseconds layer_wait = 5000ms)
      : prefill_shape{kModel, prefill_degree, kPoolBlocks},
        decode_shape{kModel, decode_degree, kPoolBlocks} {
    PullDrivenOptions options;
    options.timeout = timeout;
    options.layer_wait_timeout = layer_wait;
    publisher = std::move(CreatePullDrivenPublisher(Regions(prefill_pools, prefill_shape),
                                                    prefill_shape, options, links.Maker()))
                    .value();
    puller = std::move(CreatePullDrivenPuller(Regions(decode_pools, decode_shape), decode_shape,
                                              options, links.Maker()))
                 .value();
    REQUIRE(puller->Connect(publisher->peer_info()).ok());
  }
  static std::vector<MemoryRegion> Regions(std::vector<std::vector<char>>& pools,
                                           const KvPoolShape& shape) {
    pools.assign(shape.degree, std::vector<char>(shape.pool_bytes()));
    std::vector<MemoryRegion> regions;
    for (auto& pool : pools) regions.push_back({pool.data(), pool.size()});
    return regions;
  }
  std::vector<char>& prefill_pool() { return prefill_pools[0]; }
  std::vector<char>& decode_pool() { return decode_pools[0]; }

  PullCallbacks WithOrders(PullCallbacks callbacks) {
    callbacks.to_publisher = [this](std::string bytes) {
      std::lock_guard<std::mutex> lock(mutex);
      orders.push_back(std::move(bytes));
    };
    return callbacks;
  }
  std::string TakeOrder() {
    std::lock_guard<std::mutex> lock(mutex);
    REQUIRE_FALSE(orders.empty());
    std::string order = std::move(orders.front());
    orders.pop_front();
    return order;
  }
  Status Deliver() { return publisher->OnPullerMessage(AsBytes(TakeOrder())); }
  // An order the puller never made: every layer of `d` into `local`, over one new link whose
  // unique id is `id_byte` repeated (degree 1 on both sides).
  NcclPullOrder Forged(const KvDescriptor& d, const LayerRanges& local, char id_byte) {
    NcclPullOrder order;
    order.descriptor = d;
    order.local_shape = decode_shape;
    order.local = local;
    order.first_layer = 0;
    order.end_layer = kLayers;
    order.pairs = {{0, 0, std::string(kNcclUniqueIdBytes, id_byte), 0}};
    return order;
  }
  size_t PendingOrders() {
    std::lock_guard<std::mutex> lock(mutex);
    return orders.size();
  }

  // Blocks [first, first + n) of every layer of a pool of `degree` (whole-block ranges).
  static LayerRanges Blocks(int first, int n, int degree = 1) {
    const uint64_t block = kBlock / degree;
    LayerRanges out(kLayers);
    for (int l = 0; l < kLayers; ++l)
      for (int b = first; b < first + n; ++b)
        out[l].push_back({(uint64_t(l) * kPoolBlocks + b) * block, block});
    return out;
  }
  static std::string Read(const std::vector<char>& pool, const LayerRanges& ranges) {
    std::string s;
    for (const auto& layer : ranges)
      for (const ByteRange& r : layer) s.append(pool.data() + r.offset, r.length);
    return s;
  }
  void Fill(const LayerRanges& ranges, uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (auto& pool : prefill_pools)
      for (const auto& layer : ranges)
        for (const ByteRange& r : layer)
          for (uint64_t i = 0; i < r.length; ++i) pool[r.offset + i] = static_cast<char>(rng());
  }
};

using test::Eventually;

}  // namespace

TEST_CASE("nccl endpoints: pulls move the KV in order and release the publications",
          "[kvtransfer]") {
  Cluster c;
  std::mt19937_64 rng(3);
  std::vector<std::string> released;
  std::mutex released_mutex;
  for (int round = 0; round < 20; ++round) {
    // Several pulls in flight, the block lists shuffled differently on each side.
    std::vector<PullWaiter> waiters(3);
    std::vector<LayerRanges> mine, theirs;
    for (int i = 0; i < 3; ++i) {
      LayerRanges remote = Cluster::Blocks(i * 8, 1 + static_cast<int>(rng() % 8));
      LayerRanges local = Cluster::Blocks(31 - i * 8 - static_cast<int>(remote[0].size()) + 1,
                                          static_cast<int>(remote[0].size()));
      for (auto& layer : local) std::shuffle(layer.begin(), layer.end(), rng);
      c.Fill(remote, round * 10 + i);
      const std::string id = "r" + std::to_string(round) + "-" + std::to_string(i);
      StatusOr<KvDescriptor> d = c.publisher->Publish(
          id, remote, [&](const std::string& rid, const Status& s) {
            std::lock_guard<std::mutex> lock(released_mutex);
            if (s.ok()) released.push_back(rid);
          });
      REQUIRE(d.ok());
      REQUIRE(c.puller->Pull(*d, local, c.WithOrders(waiters[i].callbacks())).ok());
      mine.push_back(local);
      theirs.push_back(remote);
    }
    for (int i = 0; i < 3; ++i) REQUIRE(c.Deliver().ok());
    for (int i = 0; i < 3; ++i) {
      REQUIRE(waiters[i].Wait(5000ms).ok());
      CHECK(waiters[i].layers_done() == kLayers);
      CHECK(Cluster::Read(c.decode_pool(), mine[i]) == Cluster::Read(c.prefill_pool(), theirs[i]));
    }
  }
  // Every publication ended when its sends completed; one link carried them all.
  CHECK(Eventually([&] { return c.publisher->published_count() == 0; }));
  CHECK(released.size() == 60);
  CHECK(c.links.ids_made == 1);
  CHECK(c.puller->inflight_count() == 0);
}

TEST_CASE("nccl endpoints: between tensor-parallel degrees the KV is re-sharded, a link a pair",
          "[kvtransfer]") {
  for (auto [from, to] : {std::pair{1, 2}, std::pair{2, 1}, std::pair{2, 4}, std::pair{4, 4}}) {
    INFO("prefill tensor_parallel " << from << ", decode " << to);
    Cluster c(5000ms, from, to);
    const LayerRanges remote = Cluster::Blocks(2, 3, from);
    const LayerRanges local = Cluster::Blocks(10, 3, to);
    c.Fill(remote, 17);
    // What the copy plan every GPU transport shares says the decode pools must hold.
    StatusOr<std::vector<CopyPiece>> plan =
        PlanShardedCopies(remote, c.prefill_shape, local, c.decode_shape);
    REQUIRE(plan.ok());
    std::vector<std::vector<char>> want(to, std::vector<char>(c.decode_shape.pool_bytes()));
    for (const CopyPiece& p : *plan)
      std::memcpy(want[p.local_pool].data() + p.local_offset,
                  c.prefill_pools[p.remote_pool].data() + p.remote_offset, p.length);

    StatusOr<KvDescriptor> d = c.publisher->Publish("tp", remote, {});
    REQUIRE(d.ok());
    PullWaiter waiter;
    REQUIRE(c.puller->Pull(*d, local, c.WithOrders(waiter.callbacks())).ok());
    REQUIRE(c.Deliver().ok());
    REQUIRE(waiter.Wait(5000ms).ok());
    CHECK(waiter.layers_done() == kLayers);
    CHECK(c.decode_pools == want);
    CHECK(c.links.ids_made == std::max(from, to));  // one link per pair of pools
    CHECK(Eventually([&] { return c.publisher->published_count() == 0; }));
  }
}

TEST_CASE("nccl endpoints: layer by layer, each raise of the available layers orders the next",
          "[kvtransfer]") {
  Cluster c(5000ms, 1, 2);  // re-sharded too
  const LayerRanges remote = Cluster::Blocks(0, 4);
  const LayerRanges local = Cluster::Blocks(6, 4, 2);
  c.Fill(remote, 5);
  bool released = false;
  StatusOr<KvDescriptor> d = c.publisher->Publish(
      "stream", remote, [&](const std::string&, const Status& s) { released = s.ok(); });
  REQUIRE(d.ok());
  PullWaiter waiter;
  REQUIRE(c.puller->Pull(*d, local, c.WithOrders(waiter.callbacks()), 0).ok());
  CHECK(c.PendingOrders() == 0);  // nothing computed yet: nothing ordered
  REQUIRE(c.puller->SetLayersAvailable("stream", 1).ok());
  REQUIRE(c.Deliver().ok());
  CHECK(Eventually([&] { return waiter.layers_done() == 1; }));
  CHECK(c.puller->inflight_count() == 1);  // layers 1 and 2 still to come
  CHECK(c.publisher->published_count() == 1);
  REQUIRE(c.puller->SetLayersAvailable("stream", 1).ok());  // no more than before: no order
  CHECK(c.PendingOrders() == 0);
  REQUIRE(c.puller->SetLayersAvailable("stream", kAllLayers).ok());
  REQUIRE(c.Deliver().ok());
  REQUIRE(waiter.Wait(5000ms).ok());
  CHECK(waiter.layers_done() == kLayers);
  StatusOr<std::vector<CopyPiece>> plan =
      PlanShardedCopies(remote, c.prefill_shape, local, c.decode_shape);
  REQUIRE(plan.ok());
  for (const CopyPiece& p : *plan)
    CHECK(std::memcmp(c.decode_pools[p.local_pool].data() + p.local_offset,
                      c.prefill_pools[p.remote_pool].data() + p.remote_offset, p.length) == 0);
  CHECK(Eventually([&] { return released; }));  // every layer sent: the publication ends
  CHECK(c.puller->SetLayersAvailable("stream", 3).code() == StatusCode::kNotFound);
}

TEST_CASE("nccl endpoints: a pull whose next layers never come fails within the layer wait",
          "[kvtransfer]") {
  Cluster c(5000ms, 1, 1, 200ms);
  StatusOr<KvDescriptor> d = c.publisher->Publish("stalled", Cluster::Blocks(0, 2), {});
  REQUIRE(d.ok());
  PullWaiter waiter;
  const auto start = Clock::now();
  REQUIRE(c.puller->Pull(*d, Cluster::Blocks(4, 2), c.WithOrders(waiter.callbacks()), 1).ok());
  REQUIRE(c.Deliver().ok());
  const Status status = waiter.Wait(5000ms);
  CHECK(status.code() == StatusCode::kDeadlineExceeded);
  CHECK(status.message().find("layer 1 not made available") != std::string::npos);
  CHECK(Clock::now() - start < 3s);
  CHECK(waiter.layers_done() == 1);
  CHECK(c.puller->inflight_count() == 0);
  // Ended: the layers that come late order nothing.
  CHECK(c.puller->SetLayersAvailable("stalled", 2).code() == StatusCode::kNotFound);
  CHECK(c.PendingOrders() == 0);
}

TEST_CASE("nccl endpoints: an order the publisher refuses fails the pulls on its links at once",
          "[kvtransfer]") {
  Cluster c(10000ms);
  StatusOr<KvDescriptor> a = c.publisher->Publish("a", Cluster::Blocks(0, 2), {});
  StatusOr<KvDescriptor> b = c.publisher->Publish("b", Cluster::Blocks(2, 2), {});
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  PullWaiter first, second;
  REQUIRE(c.puller->Pull(*a, Cluster::Blocks(0, 2), c.WithOrders(first.callbacks())).ok());
  REQUIRE(c.Deliver().ok());
  REQUIRE(first.Wait(5000ms).ok());  // the link exists on both sides now
  REQUIRE(c.puller->Pull(*b, Cluster::Blocks(4, 2), c.WithOrders(second.callbacks())).ok());
  // The order arrives damaged: a publisher of another instance. Its receives wait for nothing,
  // so the link goes now rather than at the 10 s deadline.
  StatusOr<NcclPullOrder> order = DecodeNcclPullOrder(AsBytes(c.TakeOrder()));
  REQUIRE(order.ok());
  order->descriptor.instance_id += 1;
  CHECK(c.publisher->OnPullerMessage(AsBytes(Encode(*order))).code() ==
        StatusCode::kInvalidArgument);
  const auto start = Clock::now();
  CHECK_FALSE(second.Wait(5000ms).ok());
  CHECK(Clock::now() - start < 3s);
  CHECK(c.puller->inflight_count() == 0);
}

TEST_CASE("nccl endpoints: a request released before its order arrives fails only its pull",
          "[kvtransfer]") {
  Cluster c;
  StatusOr<KvDescriptor> gone = c.publisher->Publish("gone", Cluster::Blocks(0, 4), {});
  StatusOr<KvDescriptor> kept = c.publisher->Publish("kept", Cluster::Blocks(4, 4), {});
  REQUIRE(gone.ok());
  REQUIRE(kept.ok());
  c.Fill(Cluster::Blocks(4, 4), 9);
  // The prefill's hold ran out before decode pulled.
  TransferResult expired{c.publisher->peer_info().instance_id, "gone",
                         StatusCode::kDeadlineExceeded, "hold ran out", 0};
  REQUIRE(c.publisher->Release(expired).ok());
  PullWaiter first, second;
  REQUIRE(c.puller->Pull(*gone, Cluster::Blocks(10, 4), c.WithOrders(first.callbacks())).ok());
  REQUIRE(c.puller->Pull(*kept, Cluster::Blocks(20, 4), c.WithOrders(second.callbacks())).ok());
  REQUIRE(c.Deliver().ok());  // answered with filler and a "gone" header
  REQUIRE(c.Deliver().ok());
  const Status status = first.Wait(5000ms);
  CHECK(status.code() == StatusCode::kNotFound);
  CHECK(first.layers_done() == 0);  // filler never counts as landed
  CHECK(status.message() == "the prefill instance no longer holds the KV of gone");
  REQUIRE(second.Wait(5000ms).ok());  // the link stayed in step
  CHECK(Cluster::Read(c.decode_pool(), Cluster::Blocks(20, 4)) ==
        Cluster::Read(c.prefill_pool(), Cluster::Blocks(4, 4)));
  CHECK(c.links.ids_made == 1);
}

TEST_CASE("nccl endpoints: a lost order times the link out, and the next pull makes a new one",
          "[kvtransfer]") {
  Cluster c(300ms);
  StatusOr<KvDescriptor> a = c.publisher->Publish("a", Cluster::Blocks(0, 2), {});
  StatusOr<KvDescriptor> b = c.publisher->Publish("b", Cluster::Blocks(2, 2), {});
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  PullWaiter wa, wb;
  REQUIRE(c.puller->Pull(*a, Cluster::Blocks(0, 2), c.WithOrders(wa.callbacks())).ok());
  REQUIRE(c.puller->Pull(*b, Cluster::Blocks(2, 2), c.WithOrders(wb.callbacks())).ok());
  c.TakeOrder();  // order 0 is lost on the way
  // Order 1 names a link the publisher never joined: refused, not served out of step.
  const Status refused = c.Deliver();
  CHECK(refused.code() == StatusCode::kInvalidArgument);
  CHECK(refused.message() == "NCCL pull order 1 for an unknown link");
  CHECK(wa.Wait(5000ms).code() == StatusCode::kDeadlineExceeded);
  CHECK(wb.Wait(5000ms).code() == StatusCode::kUnavailable);
  CHECK(c.puller->inflight_count() == 0);
  // Both publications are still held: a new link serves them.
  c.Fill(Cluster::Blocks(0, 2), 4);
  PullWaiter again;
  REQUIRE(c.puller->Pull(*a, Cluster::Blocks(8, 2), c.WithOrders(again.callbacks())).ok());
  REQUIRE(c.Deliver().ok());
  REQUIRE(again.Wait(5000ms).ok());
  CHECK(Cluster::Read(c.decode_pool(), Cluster::Blocks(8, 2)) ==
        Cluster::Read(c.prefill_pool(), Cluster::Blocks(0, 2)));
  CHECK(c.links.ids_made == 2);
}

TEST_CASE("nccl endpoints: orders out of step abort the link instead of misdelivering",
          "[kvtransfer]") {
  Cluster c(2000ms);
  std::vector<StatusOr<KvDescriptor>> d;
  for (int i = 0; i < 3; ++i) d.push_back(c.publisher->Publish("q" + std::to_string(i),
                                                               Cluster::Blocks(i * 2, 2), {}));
  std::vector<PullWaiter> w(3);
  for (int i = 0; i < 3; ++i)
    REQUIRE(c.puller->Pull(*d[i], Cluster::Blocks(10 + i * 2, 2),
                           c.WithOrders(w[i].callbacks())).ok());
  REQUIRE(c.Deliver().ok());  // order 0
  CHECK(w[0].Wait(5000ms).ok());
  c.TakeOrder();                       // order 1 lost
  const Status skipped = c.Deliver();  // order 2 where 1 is due
  CHECK(skipped.code() == StatusCode::kDataLoss);
  CHECK(skipped.message() == "NCCL pull order 2 where order 1 was due: link aborted");
  CHECK_FALSE(w[1].Wait(5000ms).ok());
  CHECK_FALSE(w[2].Wait(5000ms).ok());
  CHECK(c.puller->inflight_count() == 0);
}

// The receiving end of a forged order's link, posted by hand: what the puller would post for
// layers [0, kLayers) of `d` into `local` (degree 1 on both sides).
OrderedLink::Transfer ReceiveOf(Cluster& c, const KvDescriptor& d, const LayerRanges& local,
                                PullWaiter& waiter) {
  std::vector<NcclPairPlan> plan =
      PlanNcclPairs(d.layers, c.prefill_shape, local, c.decode_shape).value();
  REQUIRE(plan.size() == 1);
  OrderedLink::Transfer t;
  t.request_id = d.request_id;
  t.layers = kLayers;
  t.total_bytes = plan[0].bytes;
  for (const StridedCopy& p : plan[0].pieces)
    t.messages.push_back(
        {p.layer, c.decode_pool().data() + p.local_offset, p.length, p.rows, p.local_stride});
  t.deadline = Clock::now() + 5s;
  PullCallbacks callbacks = waiter.callbacks();
  t.on_layer = callbacks.on_layer;
  t.on_done = [on_done = callbacks.on_done, id = d.request_id](const Status& s) {
    on_done(id, s);
  };
  return t;
}

TEST_CASE("nccl endpoints: a release while the sends are posted waits for them, the link goes on",
          "[kvtransfer]") {
  Cluster c;
  std::mutex mutex;
  std::map<std::string, std::vector<Status>> released;
  auto on_release = [&](const std::string& id, const Status& s) {
    std::lock_guard<std::mutex> lock(mutex);
    released[id].push_back(s);
  };
  auto releases = [&](const std::string& id) {
    std::lock_guard<std::mutex> lock(mutex);
    return released[id];
  };
  StatusOr<KvDescriptor> cut = c.publisher->Publish("cut", Cluster::Blocks(0, 2), on_release);
  StatusOr<KvDescriptor> next = c.publisher->Publish("next", Cluster::Blocks(2, 2), on_release);
  REQUIRE(cut.ok());
  REQUIRE(next.ok());
  c.Fill(Cluster::Blocks(0, 4), 21);
  const std::string cut_bytes = Cluster::Read(c.prefill_pool(), Cluster::Blocks(0, 2));
  // Orders for both on one link whose receiving end the test posts later: the sends wait.
  NcclPullOrder first = c.Forged(*cut, Cluster::Blocks(10, 2), 'w');
  NcclPullOrder second = c.Forged(*next, Cluster::Blocks(12, 2), 'w');
  second.pairs[0].seq = 1;
  REQUIRE(c.publisher->OnPullerMessage(AsBytes(Encode(first))).ok());
  REQUIRE(c.publisher->OnPullerMessage(AsBytes(Encode(second))).ok());

  // The router cancels "cut" with its sends posted: the release waits for them.
  TransferResult cancelled{c.publisher->peer_info().instance_id, "cut", StatusCode::kCancelled,
                           "client gone", 0};
  REQUIRE(c.publisher->Release(cancelled).ok());
  CHECK(c.publisher->StillReading("cut"));
  CHECK_FALSE(c.publisher->StillReading("next"));
  CHECK(releases("cut").empty());
  CHECK(c.publisher->published_count() == 2);
  const Status twice = c.publisher->Release(cancelled);
  CHECK(twice.code() == StatusCode::kNotFound);
  CHECK(twice.message() == "request cut already released");

  // The receives come: both transfers move the published bytes, the link in step.
  std::shared_ptr<OrderedLink> end =
      c.links.Maker().start(std::string(kNcclUniqueIdBytes, 'w'), 1, 0).value();
  PullWaiter got_cut, got_next;
  REQUIRE(end->Post(ReceiveOf(c, *cut, Cluster::Blocks(10, 2), got_cut)).ok());
  REQUIRE(end->Post(ReceiveOf(c, *next, Cluster::Blocks(12, 2), got_next)).ok());
  REQUIRE(got_cut.Wait(5000ms).ok());
  REQUIRE(got_next.Wait(5000ms).ok());
  CHECK(Cluster::Read(c.decode_pool(), Cluster::Blocks(10, 2)) == cut_bytes);
  CHECK(Cluster::Read(c.decode_pool(), Cluster::Blocks(12, 2)) ==
        Cluster::Read(c.prefill_pool(), Cluster::Blocks(2, 2)));
  // Only now is "cut" released, with the release's status; "next" ended as its sends did.
  REQUIRE(Eventually([&] { return releases("cut").size() == 1; }));
  CHECK(releases("cut")[0].code() == StatusCode::kCancelled);
  CHECK_FALSE(c.publisher->StillReading("cut"));
  REQUIRE(Eventually([&] { return releases("next").size() == 1; }));
  CHECK(releases("next")[0].ok());
  CHECK(c.publisher->published_count() == 0);
  CHECK(end->health().ok());
}

TEST_CASE("nccl endpoints: a release whose sends never pair ends within the transfer timeout",
          "[kvtransfer]") {
  Cluster c(300ms);
  std::mutex mutex;
  std::vector<Status> released;
  StatusOr<KvDescriptor> d = c.publisher->Publish(
      "cut", Cluster::Blocks(0, 2), [&](const std::string&, const Status& s) {
        std::lock_guard<std::mutex> lock(mutex);
        released.push_back(s);
      });
  REQUIRE(d.ok());
  // An order whose receives nobody posts (the puller died after ordering).
  NcclPullOrder forged = c.Forged(*d, Cluster::Blocks(9, 2), 'f');
  REQUIRE(c.publisher->OnPullerMessage(AsBytes(Encode(forged))).ok());
  const auto start = Clock::now();
  TransferResult failed{c.publisher->peer_info().instance_id, "cut", StatusCode::kUnavailable,
                        "decode instance disconnected", 0};
  REQUIRE(c.publisher->Release(failed).ok());
  CHECK(c.publisher->StillReading("cut"));
  REQUIRE(Eventually([&] {
    std::lock_guard<std::mutex> lock(mutex);
    return !released.empty();
  }));
  CHECK(Clock::now() - start < 3s);
  CHECK(released.size() == 1);
  CHECK(released[0].code() == StatusCode::kUnavailable);
  CHECK(c.publisher->published_count() == 0);
  CHECK_FALSE(c.publisher->StillReading("cut"));
  // The link timed out: nothing more is served on it.
  forged.pairs[0].seq = 1;
  CHECK_FALSE(c.publisher->OnPullerMessage(AsBytes(Encode(forged))).ok());
}

TEST_CASE("nccl endpoints: bad orders and pulls are refused, naming what is wrong",
          "[kvtransfer]") {
  Cluster c;
  StatusOr<KvDescriptor> d = c.publisher->Publish("x", Cluster::Blocks(0, 2), {});
  REQUIRE(d.ok());
  NcclPullOrder order = c.Forged(*d, Cluster::Blocks(4, 2), 'u');
  order.descriptor.instance_id += 1;
  CHECK(c.publisher->OnPullerMessage(AsBytes(Encode(order))).message().find(
            "NCCL pull order for publisher") == 0);
  order.descriptor = *d;
  order.descriptor.layers[0][0].offset = c.prefill_pool().size();  // outside the pool
  CHECK(c.publisher->OnPullerMessage(AsBytes(Encode(order))).code() ==
        StatusCode::kInvalidArgument);
  CHECK(c.publisher->OnPullerMessage(AsBytes(std::string("garbage"))).code() ==
        StatusCode::kDataLoss);

  PullWaiter w;
  CHECK(c.puller->Pull(*d, Cluster::Blocks(4, 2), w.callbacks()).code() ==
        StatusCode::kFailedPrecondition);  // no way to the publisher
  CHECK(c.puller->Pull(*d, Cluster::Blocks(4, 3), c.WithOrders(w.callbacks())).code() ==
        StatusCode::kInvalidArgument);  // sizes differ
  KvDescriptor stranger = *d;
  stranger.instance_id = 12345;
  CHECK(c.puller->Pull(stranger, Cluster::Blocks(4, 2), c.WithOrders(w.callbacks())).code() ==
        StatusCode::kNotFound);
  CHECK(c.PendingOrders() == 0);  // nothing refused sent an order
  CHECK(c.publisher->OnPullerMessage(AsBytes(std::string())).code() == StatusCode::kDataLoss);
}

}  // namespace tandem
