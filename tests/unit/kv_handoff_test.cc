// The prefill side of the KV handoff (prefill/kv_handoff.h) on a real host and engine, with a
// transport double whose reads a release may outlive (as NCCL's posted sends do): the blocks
// of a request released while they are still read stay allocated until the transport lets go.
#include <catch2/catch.hpp>

#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/serving/instance_host.h"
#include "kvtransfer/transfer.h"
#include "prefill/kv_handoff.h"
#include "prefill/prefill_engine.h"
#include "tests/test_control.h"
#include "tests/unit/fake_instance.h"
#include "tests/unit/io_thread.h"
#include "tests/unit/tensor_parallel_util.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A publisher whose reads go on after a release while `reading` is set: the release callback
// then comes when the test calls EndReads, from the test's thread (a transport's thread).
class LingeringPublisher final : public KvPublisher {
 public:
  LingeringPublisher() {
    info_.instance_id = 77;
    info_.transport = "double";
  }
  const PeerInfo& peer_info() const override { return info_; }
  StatusOr<KvDescriptor> Publish(const std::string& id, LayerRanges layers,
                                 ReleaseCallback on_release) override {
    std::lock_guard<std::mutex> lock(mutex_);
    leases_[id] = std::move(on_release);
    return MakeDescriptor(info_.instance_id, id, layers);
  }
  Status Release(const TransferResult& result) override {
    ReleaseCallback cb;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = leases_.find(result.request_id);
      if (it == leases_.end() || reading_after_release_.count(result.request_id))
        return NotFound("not published");
      if (reading) {
        reading_after_release_[result.request_id] = result.ToStatus();
        return Status();
      }
      cb = std::move(it->second);
      leases_.erase(it);
    }
    cb(result.request_id, result.ToStatus());
    return Status();
  }
  bool StillReading(const std::string& id) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return reading_after_release_.count(id) > 0;
  }
  size_t published_count() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return leases_.size();
  }
  // The reads of `id` end: its release completes.
  void EndReads(const std::string& id) {
    ReleaseCallback cb;
    Status status;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = reading_after_release_.find(id);
      REQUIRE(it != reading_after_release_.end());
      status = it->second;
      reading_after_release_.erase(it);
      cb = std::move(leases_.at(id));
      leases_.erase(id);
    }
    cb(id, status);
  }

  std::atomic<bool> reading{false};

 private:
  PeerInfo info_;
  mutable std::mutex mutex_;
  std::map<std::string, ReleaseCallback> leases_;
  std::map<std::string, Status> reading_after_release_;
};

// A driver that does nothing by itself: the test runs the handoff on the engine thread.
class IdleDriver : public InstanceDriver {
 public:
  void OnMessage(ConnId, ControlMessage) override {}
  void OnClosed(ConnId, std::optional<uint64_t>) override {}
  bool Step() override { return false; }
  bool Idle() const override { return true; }
  void FailAll(const Status&) override {}
  LoadReport Load() override { return LoadReport{}; }
};

class ToHandoff : public PrefillObserver {
 public:
  explicit ToHandoff(KvHandoff& handoff) : handoff_(handoff) {}
  bool BeforeLastChunk(PrefillRequest& r) override { return handoff_.Announce(r); }
  void OnLayerComputed(int layer) override { handoff_.LayersComputed(layer + 1); }
  void OnPrefilled(Prefilled done) override { handoff_.FirstTokenSampled(std::move(done)); }

 private:
  KvHandoff& handoff_;
};

// Runs `task` on the host's engine thread (where the handoff lives) and waits for it.
template <typename T>
T OnEngine(InstanceHost& host, std::function<T()> task) {
  std::promise<T> done;
  std::future<T> result = done.get_future();
  host.Post([&] { done.set_value(task()); });
  REQUIRE(result.wait_for(5s) == std::future_status::ready);
  return result.get();
}

struct Prefill {
  test::IoThread io;
  test::FakeInstance decode{io.io, InstanceRole::kDecode, 0};
  std::unique_ptr<Model> model = tp_test::RandomModel(tp_test::Shape(4, 2, 32, 256));
  std::unique_ptr<PrefillEngine> engine;
  LingeringPublisher publisher;
  std::unique_ptr<InstanceHost> host;
  std::unique_ptr<KvHandoff> handoff;
  IdleDriver driver;

  explicit Prefill(double hold_timeout_s) {
    PrefillEngineOptions po;
    po.kv_blocks = 16;
    po.block_size = 16;
    po.max_model_len = 256;
    po.token_budget = 256;
    engine = std::move(PrefillEngine::Create(*model, po)).value();
    HostOptions ho;
    ho.name = "prefill-0";
    ho.model = "m";
    ho.control_options = test::TestControlOptions();
    host = std::move(InstanceHost::Create(ho)).value();
    handoff = std::make_unique<KvHandoff>(*host, *engine, publisher,
                                          KvHandoffOptions{hold_timeout_s, false}, nullptr);
    host->Run(&driver);
  }
  ~Prefill() { host->Stop(); }

  // Prefills `id` (40 tokens: 3 blocks) and hands it off to the decode double.
  void HandOff(const std::string& id) {
    OnEngine<bool>(*host, [&] {
      Submit s;
      s.request_id = id;
      s.decode_address = "127.0.0.1:" + std::to_string(decode.port());
      handoff->Queue(s, /*router=*/0);
      std::vector<int32_t> prompt(40);
      for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(7 + i);
      SamplingParams greedy;
      greedy.temperature = 0;
      greedy.max_tokens = 4;
      greedy.ignore_eos = true;
      greedy.seed = 1;
      engine->Add(id, prompt, greedy);
      ToHandoff observer(*handoff);
      while (engine->Step(observer)) {
      }
      return true;
    });
  }
  int32_t free_blocks() {
    return OnEngine<int32_t>(*host, [&] { return engine->free_blocks(); });
  }
  size_t draining() {
    return OnEngine<size_t>(*host, [&] { return handoff->draining(); });
  }
  void Cancel(const std::string& id) {
    OnEngine<bool>(*host, [&] {
      handoff->Cancel(id);
      return true;
    });
  }
};

}  // namespace

TEST_CASE("kv handoff: blocks released while the transport still reads them wait for it",
          "[prefill]") {
  Prefill p(/*hold_timeout_s=*/20);
  const int32_t all = p.free_blocks();
  p.HandOff("a");
  REQUIRE(OnEngine<size_t>(*p.host, [&] { return p.handoff->held(); }) == 1);
  REQUIRE(p.free_blocks() == all - 3);

  // Cancelled while the transport reads: the blocks stay allocated.
  p.publisher.reading = true;
  p.Cancel("a");
  CHECK(OnEngine<size_t>(*p.host, [&] { return p.handoff->held(); }) == 0);
  CHECK(p.draining() == 1);
  CHECK(p.free_blocks() == all - 3);
  CHECK_FALSE(OnEngine<bool>(*p.host, [&] { return p.handoff->empty(); }));
  // The reads end (on the transport's thread): the blocks come back.
  p.publisher.EndReads("a");
  CHECK(test::WaitFor([&] { return p.free_blocks() == all; }));
  CHECK(p.draining() == 0);
  CHECK(OnEngine<bool>(*p.host, [&] { return p.handoff->empty(); }));

  // A transport that stops reading at its release: freed at once.
  p.publisher.reading = false;
  p.HandOff("b");
  REQUIRE(p.free_blocks() == all - 3);
  p.Cancel("b");
  CHECK(p.draining() == 0);
  CHECK(p.free_blocks() == all);
  CHECK(p.publisher.published_count() == 0);
}

TEST_CASE("kv handoff: a transport that never lets go is outlived by the hold timeout",
          "[prefill]") {
  Prefill p(/*hold_timeout_s=*/0.3);
  const int32_t all = p.free_blocks();
  p.HandOff("stuck");
  p.publisher.reading = true;
  p.Cancel("stuck");
  const auto released = Clock::now();
  REQUIRE(p.draining() == 1);
  // ExpireHolds (the prefill server calls it every step) frees them after the hold timeout.
  CHECK(test::WaitFor([&] {
    return OnEngine<size_t>(*p.host, [&] {
             p.handoff->ExpireHolds();
             return p.handoff->draining();
           }) == 0;
  }));
  CHECK(Clock::now() - released >= 300ms);
  CHECK(p.free_blocks() == all);
  // The late release callback finds nothing to free.
  p.publisher.EndReads("stuck");
  CHECK(p.free_blocks() == all);
  // And one that comes after the handoff is gone is dropped.
  p.publisher.reading = true;
  p.HandOff("late");
  p.Cancel("late");
  REQUIRE(p.draining() == 1);
  p.host->Stop();
  p.handoff.reset();
  p.publisher.EndReads("late");
}

}  // namespace tandem
