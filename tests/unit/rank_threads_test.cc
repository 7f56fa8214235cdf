// RankThreads: every rank runs once per Run, rank 0 on the caller, the others on their own
// threads, all at the same time (a rank may wait for another inside fn).
#include "common/engine/rank_threads.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

namespace tandem {
namespace {

TEST_CASE("RankThreads runs every rank once per call, rank 0 on the caller", "[engine][tp]") {
  for (int degree : {1, 2, 4}) {
    RankThreads threads(degree);
    REQUIRE(threads.degree() == degree);
    for (int call = 0; call < 50; ++call) {
      std::mutex mu;
      std::vector<int> runs(degree, 0);
      std::set<std::thread::id> ids;
      std::thread::id rank0;
      threads.Run([&](int rank) {
        std::lock_guard<std::mutex> lock(mu);
        ++runs[rank];
        ids.insert(std::this_thread::get_id());
        if (rank == 0) rank0 = std::this_thread::get_id();
      });
      CHECK(runs == std::vector<int>(degree, 1));
      CHECK(static_cast<int>(ids.size()) == degree);
      CHECK(rank0 == std::this_thread::get_id());
    }
  }
}

TEST_CASE("RankThreads runs the ranks at once: they can meet at a barrier", "[engine][tp]") {
  constexpr int kDegree = 3;
  RankThreads threads(kDegree);
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  std::atomic<int> passed{0};
  threads.Run([&](int) {
    std::unique_lock<std::mutex> lock(mu);
    ++arrived;
    cv.notify_all();
    // Bounded so that a broken RankThreads fails the test instead of hanging it.
    if (cv.wait_for(lock, std::chrono::seconds(10), [&] { return arrived == kDegree; }))
      ++passed;
  });
  CHECK(passed == kDegree);
}

}  // namespace
}  // namespace tandem
