// A gate in seastar's sense: work enters while the gate is open; Close() refuses new entries;
// Wait() returns once everything that entered has left (or a deadline passed).
//
// Thread-safe: any thread may enter, leave, close and wait.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>

#include "common/base/thread_annotations.h"

namespace tandem {

class Gate {
 public:
  using Clock = std::chrono::steady_clock;

  // Enters unless the gate is closed. A true return must be paired with one Leave().
  bool TryEnter() {
    MutexLock lock(&mutex_);
    if (closed_) return false;
    ++inside_;
    return true;
  }
  void Leave() {
    MutexLock lock(&mutex_);
    if (--inside_ == 0) cv_.notify_all();
  }
  void Close() {
    MutexLock lock(&mutex_);
    closed_ = true;
  }
  bool closed() const {
    MutexLock lock(&mutex_);
    return closed_;
  }
  int64_t inside() const {
    MutexLock lock(&mutex_);
    return inside_;
  }
  // Until nothing is inside (true) or `deadline` passed (false). Close() first, or new work may
  // keep it busy.
  bool Wait(Clock::time_point deadline) {
    MutexLock lock(&mutex_);
    while (inside_ > 0)
      if (cv_.wait_until(mutex_, deadline) == std::cv_status::timeout) return inside_ == 0;
    return true;
  }

 private:
  mutable Mutex mutex_;
  std::condition_variable_any cv_;
  int64_t inside_ TANDEM_GUARDED_BY(mutex_) = 0;
  bool closed_ TANDEM_GUARDED_BY(mutex_) = false;
};

}  // namespace tandem
