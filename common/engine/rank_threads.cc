#include "common/engine/rank_threads.h"

#include "common/base/status.h"

namespace tandem {

RankThreads::RankThreads(int degree) : degree_(degree) {
  TANDEM_CHECK(degree >= 1, "RankThreads: degree must be at least 1");
  for (int r = 1; r < degree; ++r) threads_.emplace_back([this, r] { Loop(r); });
}

RankThreads::~RankThreads() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void RankThreads::Loop(int rank) {
  uint64_t seen = 0;
  while (true) {
    const std::function<void(int)>* fn = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Waits for work with no bound: this thread is idle until Run or the destructor.
      start_.wait(lock, [&] { return stop_ || call_ != seen; });
      if (stop_) return;
      seen = call_;
      fn = fn_;
    }
    (*fn)(rank);
    {
      std::lock_guard<std::mutex> lock(mu_);
      --running_;
    }
    done_.notify_all();
  }
}

void RankThreads::Run(const std::function<void(int rank)>& fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    running_ = degree_ - 1;
    ++call_;
  }
  start_.notify_all();
  fn(0);
  // Bounded by the ranks' own work (see the header: fn bounds its waits).
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return running_ == 0; });
  fn_ = nullptr;
}

}  // namespace tandem
