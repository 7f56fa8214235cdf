// Reaper (common/base/reaper.h): objects whose teardown waits are let go on the reaper's thread,
// in order, without the thread that drops them waiting.
#include "common/base/reaper.h"

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/unit/test_util.h"

namespace tandem {
namespace {

// Records where and in what order instances were destroyed.
struct Teardowns {
  std::mutex mutex;
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  std::vector<int> Order() {
    std::lock_guard<std::mutex> lock(mutex);
    return order;
  }
};

// Its destructor waits at `gate` (when given) before it records itself.
struct SlowToDestroy {
  SlowToDestroy(int id, Teardowns* log, test::Gate* gate = nullptr)
      : id(id), log(log), gate(gate) {}
  ~SlowToDestroy() {
    if (gate != nullptr) gate->Wait();
    std::lock_guard<std::mutex> lock(log->mutex);
    log->order.push_back(id);
    log->threads.push_back(std::this_thread::get_id());
  }
  int id;
  Teardowns* log;
  test::Gate* gate;
};

TEST_CASE("reaper: a teardown that waits runs on the reaper's thread, in the order dropped",
          "[base]") {
  Teardowns log;
  test::Gate gate;
  Reaper reaper;
  for (int id = 0; id < 3; ++id) reaper.Drop(std::make_shared<SlowToDestroy>(id, &log, &gate));
  reaper.Drop(nullptr);  // nothing to let go
  // The teardowns wait for the gate, which opens only now: Drop waited for none of them.
  CHECK_FALSE(gate.timed_out());
  CHECK(reaper.pending() == 3);
  gate.Open();
  reaper.Flush();
  CHECK(reaper.pending() == 0);
  CHECK(log.Order() == std::vector<int>{0, 1, 2});  // Flush returned after all three
  std::lock_guard<std::mutex> lock(log.mutex);
  for (std::thread::id where : log.threads) CHECK(where != std::this_thread::get_id());
}

TEST_CASE("reaper: an object another owner still holds goes with that owner's reference",
          "[base]") {
  Teardowns log;
  Reaper reaper;
  auto shared = std::make_shared<SlowToDestroy>(7, &log);
  reaper.Drop(shared);
  reaper.Flush();
  CHECK(log.Order().empty());  // the reaper let go of its reference only
  shared.reset();
  CHECK(log.Order() == std::vector<int>{7});
  std::lock_guard<std::mutex> lock(log.mutex);
  CHECK(log.threads[0] == std::this_thread::get_id());
}

TEST_CASE("reaper: its destructor lets go of everything still queued", "[base]") {
  Teardowns log;
  test::Gate gate;
  {
    Reaper reaper;
    for (int id = 0; id < 4; ++id) reaper.Drop(std::make_shared<SlowToDestroy>(id, &log, &gate));
    gate.Open();
  }
  CHECK(log.Order() == std::vector<int>{0, 1, 2, 3});
  CHECK_FALSE(gate.timed_out());
}

TEST_CASE("reaper: many threads drop at once, and each Flush sees its own drops gone", "[base]") {
  Teardowns log;
  Reaper reaper;
  std::atomic<int> flushed{0};
  std::vector<std::thread> droppers;
  for (int t = 0; t < 4; ++t)
    droppers.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) reaper.Drop(std::make_shared<SlowToDestroy>(t * 100 + i, &log));
      reaper.Flush();
      int mine = 0;
      for (int id : log.Order()) mine += id / 100 == t;
      CHECK(mine == 50);
      ++flushed;
    });
  for (std::thread& t : droppers) t.join();
  CHECK(flushed == 4);
  CHECK(reaper.pending() == 0);
}

}  // namespace
}  // namespace tandem
