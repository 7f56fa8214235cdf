// The threads of a tensor-parallel pass: one per rank, rank 0 being the caller. Run(fn) runs
// fn(r) for every rank r at once, fn(0) on the calling thread and fn(1..t-1) on threads this
// object owns, and returns when all have returned. TpForward (common/engine/tp_forward.h) runs
// its ranks on it, CPU ranks and CUDA ranks alike.
//
// A rank that waits for another inside fn (a collective) must bound that wait itself: Run
// waits for every fn to return, and fn is what can give up.
//
// Threads: Run is called by one thread at a time. The destructor joins the threads; it must not
// run while Run does.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem {

class RankThreads {
 public:
  // degree >= 1 ranks: degree - 1 threads start now and wait for work.
  explicit RankThreads(int degree);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int degree() const { return degree_; }
  // Runs fn(0) here and fn(1..degree-1) on the rank threads; returns once every call returned.
  // fn must not throw.
  void Run(const std::function<void(int rank)>& fn);

 private:
  void Loop(int rank);

  const int degree_;
  std::mutex mu_;
  std::condition_variable start_, done_;
  const std::function<void(int)>* fn_ = nullptr;  // guarded by mu_: the call in progress
  uint64_t call_ = 0;                             // guarded by mu_: calls started
  int running_ = 0;                               // guarded by mu_: ranks 1.. still in fn
  bool stop_ = false;                             // guarded by mu_
  std::vector<std::thread> threads_;              // ranks 1..degree-1
};

}  // namespace tandem
