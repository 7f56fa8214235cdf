// A small fork-join pool for the CPU forward pass: ParallelFor(n, fn) runs fn(i) for i in
// [0, n) on the calling thread plus num_threads - 1 workers and returns when all are done.
//
// No allocation per call (the task is passed as a pointer to the caller's callable). Tasks are
// handed out one index at a time from an atomic counter, so uneven tasks balance themselves.
// One thread at a time may call ParallelFor (the engine thread); fn must not throw and must not
// call ParallelFor. Workers are joined by the destructor.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);  // num_threads >= 1 (1 = run inline)
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  template <typename Fn>
  void ParallelFor(int n, Fn& fn) {
    Run(n, [](void* ctx, int i) { (*static_cast<Fn*>(ctx))(i); }, &fn);
  }

 private:
  using TaskFn = void (*)(void* ctx, int index);
  void Run(int n, TaskFn fn, void* ctx);
  void WorkerLoop();
  void Drain();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_;
  uint64_t generation_ = 0;  // guarded by mu_
  bool stop_ = false;        // guarded by mu_
  int busy_workers_ = 0;     // guarded by mu_
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int n_ = 0;
  std::atomic<int> next_{0};
};

}  // namespace tandem
