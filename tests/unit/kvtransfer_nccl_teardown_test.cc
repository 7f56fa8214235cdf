// The NCCL endpoints (kvtransfer/nccl_endpoints.h) let go of links on a thread of their own: an
// NCCL link's teardown frees GPU memory, which waits for the whole GPU to go idle (another
// link's receives from a dead peer included), and the threads that drop links are an engine's
// (the puller's Pull) and the I/O thread (the publisher's OnPullerMessage). Here the links are
// CPU doubles whose teardown waits at a gate that the test opens only after the call returned.
#include <catch2/catch.hpp>

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kvtransfer/nccl_endpoints.h"
#include "kvtransfer/nccl_protocol.h"
#include "kvtransfer/sharded_copies.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// What became of the links a maker made: which were destroyed, and on which thread. Their
// teardowns wait at `gate`.
struct LinkLog {
  test::Gate gate;
  std::mutex mutex;
  int made = 0;
  std::vector<int> destroyed;
  std::vector<std::thread::id> destroyed_on;
};

// Accepts transfers and never completes them; Abort marks it failed (its transfers fail when it
// is destroyed: Cancelled, as an NCCL link's do once its communicator is aborted and drained).
class SlowLink final : public OrderedLink {
 public:
  SlowLink(int id, LinkLog* log) : id_(id), log_(log) {}
  ~SlowLink() override {
    log_->gate.Wait();
    std::deque<Transfer> left;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      left.swap(transfers_);
    }
    for (Transfer& t : left)
      if (t.on_done) t.on_done(Cancelled("link closed"));
    std::lock_guard<std::mutex> lock(log_->mutex);
    log_->destroyed.push_back(id_);
    log_->destroyed_on.push_back(std::this_thread::get_id());
  }
  Status health() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return health_;
  }
  StatusOr<uint64_t> Post(Transfer transfer) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!health_.ok()) return health_;
    transfers_.push_back(std::move(transfer));
    return next_seq_++;
  }
  void Abort(const Status& reason) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (health_.ok()) health_ = Unavailable("aborted: " + reason.ToString());
  }
  size_t inflight_count() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return transfers_.size();
  }

 private:
  const int id_;
  LinkLog* const log_;
  mutable std::mutex mutex_;
  Status health_;
  uint64_t next_seq_ = 0;
  std::deque<Transfer> transfers_;
};

struct SlowLinks {
  LinkLog log;
  std::mutex mutex;
  std::vector<std::weak_ptr<OrderedLink>> links;  // by id - 1

  OrderedLinkMaker Maker() {
    OrderedLinkMaker maker;
    maker.new_unique_id = [this]() -> StatusOr<std::string> {
      std::lock_guard<std::mutex> lock(mutex);
      return std::string(kNcclUniqueIdBytes, static_cast<char>('a' + links.size()));
    };
    maker.start = [this](std::string_view, int, int) -> StatusOr<std::shared_ptr<OrderedLink>> {
      std::lock_guard<std::mutex> lock(mutex);
      std::lock_guard<std::mutex> log_lock(log.mutex);
      auto link = std::make_shared<SlowLink>(++log.made, &log);
      links.push_back(link);
      return std::shared_ptr<OrderedLink>(link);
    };
    return maker;
  }
  std::shared_ptr<OrderedLink> Link(int id) {
    std::lock_guard<std::mutex> lock(mutex);
    return links.at(id - 1).lock();
  }
  bool DestroyedElsewhere(int id) {
    std::lock_guard<std::mutex> lock(log.mutex);
    for (size_t i = 0; i < log.destroyed.size(); ++i)
      if (log.destroyed[i] == id) return log.destroyed_on[i] != std::this_thread::get_id();
    return false;
  }
};

// One layer of 2 KV heads of 1 dimension, blocks of 1 token: 16-byte blocks (K and V, fp32),
// 16 a pool.
const KvPoolShape kShape{KvLayout{1, 2, 1, 1}, 1, 16};

LayerRanges Block(int b) { return {{{uint64_t(b) * 16, 16}}}; }

std::vector<MemoryRegion> Pool(std::vector<char>& bytes) {
  bytes.assign(kShape.pool_bytes(), 0);
  return {{bytes.data(), bytes.size()}};
}

using test::Eventually;

TEST_CASE("nccl endpoints: a pull that replaces a failed link does not wait for its teardown",
          "[kvtransfer]") {
  SlowLinks links;
  std::vector<char> prefill_bytes, decode_bytes;
  std::unique_ptr<KvPublisher> publisher =
      std::move(CreatePullDrivenPublisher(Pool(prefill_bytes), kShape, {}, links.Maker()))
          .value();
  std::unique_ptr<KvPuller> puller =
      std::move(CreatePullDrivenPuller(Pool(decode_bytes), kShape, {}, links.Maker())).value();
  REQUIRE(puller->Connect(publisher->peer_info()).ok());
  StatusOr<KvDescriptor> a = publisher->Publish("a", Block(0), {});
  StatusOr<KvDescriptor> b = publisher->Publish("b", Block(1), {});
  REQUIRE(a.ok());
  REQUIRE(b.ok());

  std::mutex mutex;
  std::vector<std::pair<std::string, Status>> done;
  PullCallbacks callbacks;
  callbacks.to_publisher = [](std::string) {};  // the orders go nowhere: nothing completes
  callbacks.on_done = [&](const std::string& id, const Status& status) {
    std::lock_guard<std::mutex> lock(mutex);
    done.emplace_back(id, status);
  };
  REQUIRE(puller->Pull(*a, Block(2), callbacks).ok());  // link 1
  links.Link(1)->Abort(Unavailable("peer died"));
  // The next pull finds link 1 failed and makes link 2; link 1 goes on the reaper's thread.
  REQUIRE(puller->Pull(*b, Block(3), callbacks).ok());
  CHECK_FALSE(links.log.gate.timed_out());  // Pull did not wait for link 1's teardown
  links.log.gate.Open();
  CHECK(links.log.made == 2);
  CHECK(Eventually([&] { return links.DestroyedElsewhere(1); }));
  // Link 1's receive failed with it (its pull "a" ends), and "b" waits on link 2.
  CHECK(Eventually([&] {
    std::lock_guard<std::mutex> lock(mutex);
    return done.size() == 1;
  }));
  {
    std::lock_guard<std::mutex> lock(mutex);
    CHECK(done[0].first == "a");
    CHECK(done[0].second.code() == StatusCode::kCancelled);
  }
  puller.reset();  // waits for link 2's teardown, and ends "b"
  std::lock_guard<std::mutex> lock(mutex);
  REQUIRE(done.size() == 2);
  CHECK(done[1].first == "b");
}

TEST_CASE("nccl endpoints: an order that drops a link returns before the link is torn down",
          "[kvtransfer]") {
  SlowLinks links;
  std::vector<char> prefill_bytes;
  std::unique_ptr<KvPublisher> publisher =
      std::move(CreatePullDrivenPublisher(Pool(prefill_bytes), kShape, {}, links.Maker()))
          .value();
  std::mutex mutex;
  std::vector<Status> released;
  StatusOr<KvDescriptor> a = publisher->Publish("a", Block(0), [&](const std::string&,
                                                                   const Status& status) {
    std::lock_guard<std::mutex> lock(mutex);
    released.push_back(status);
  });
  REQUIRE(a.ok());
  NcclPullOrder order;
  order.descriptor = *a;
  order.local_shape = kShape;
  order.local = Block(5);
  order.first_layer = 0;
  order.end_layer = 1;
  order.pairs = {{0, 0, std::string(kNcclUniqueIdBytes, 'x'), 0}};
  REQUIRE(publisher->OnPullerMessage(AsBytes(Encode(order))).ok());  // link 1, its send posted
  REQUIRE(links.log.made == 1);
  // An order out of step: the publisher drops the link (its sends never pair now).
  order.pairs[0].seq = 5;
  CHECK(publisher->OnPullerMessage(AsBytes(Encode(order))).code() == StatusCode::kDataLoss);
  CHECK_FALSE(links.log.gate.timed_out());  // the order did not wait for the link's teardown
  links.log.gate.Open();
  CHECK(Eventually([&] { return links.DestroyedElsewhere(1); }));
  // The send failed with the link: the lease stays for its release, which ends it at once.
  TransferResult result{publisher->peer_info().instance_id, "a", StatusCode::kUnavailable,
                        "pull failed", 0};
  REQUIRE(publisher->Release(result).ok());
  std::lock_guard<std::mutex> lock(mutex);
  REQUIRE(released.size() == 1);
  CHECK(released[0].code() == StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tandem
