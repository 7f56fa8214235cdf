#include "common/base/reaper.h"

#include <utility>

namespace tandem {

Reaper::Reaper() : thread_([this] { Run(); }) {}

Reaper::~Reaper() {
  {
    MutexLock lock(&mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Reaper::Drop(std::shared_ptr<void> object) {
  if (object == nullptr) return;
  {
    MutexLock lock(&mutex_);
    queue_.push_back(std::move(object));
    ++dropped_;
  }
  wake_.notify_one();
}

// unique_lock (for the condition wait) is not annotated: the lock is held where it says.
void Reaper::Flush() TANDEM_NO_THREAD_SAFETY_ANALYSIS {
  std::unique_lock<Mutex> lock(mutex_);
  const uint64_t target = dropped_;
  gone_.wait(lock, [&]() TANDEM_REQUIRES(mutex_) { return let_go_ >= target; });
}

uint64_t Reaper::pending() const {
  MutexLock lock(&mutex_);
  return dropped_ - let_go_;
}

void Reaper::Run() TANDEM_NO_THREAD_SAFETY_ANALYSIS {
  std::unique_lock<Mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&]() TANDEM_REQUIRES(mutex_) { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_, and everything let go
    std::shared_ptr<void> object = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    object.reset();  // the destructor, when this was the last reference: outside the lock
    lock.lock();
    ++let_go_;
    gone_.notify_all();
  }
}

}  // namespace tandem
