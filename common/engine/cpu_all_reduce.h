// An in-process all-reduce (sum) over `participants` threads: the CPU stand-in for NCCL's
// ncclAllReduce in a tensor-parallel forward pass (ForwardHooks::all_reduce,
// common/engine/forward.h), used by CreateTpCpuForward (common/engine/tp_forward.h) and tests.
//
// Rank r calls AllReduce(r, data, count) from its own thread; the call returns once every rank
// has called it with the same count, with each rank's `data` replaced by the element-wise sum
// over ranks. The sum is taken in rank order 0, 1, ..., t-1 for every element, and the same
// bits are written to every rank's buffer: all ranks get bit-identical results, run after run.
// Each rank sums a slice of the elements (reduce-scatter) and writes it into every rank's
// buffer (all-gather), between two barriers.
//
// Errors: every wait is bounded by `timeout`. A rank that waits longer (a peer died or hangs)
// gets DeadlineExceeded naming the ranks that did not arrive, and the collective is broken:
// every call after that, on every rank, fails at once with FailedPrecondition (the buffers are
// then unspecified). A count that differs between ranks is a bug (TANDEM_CHECK).
//
// Threads: one thread per rank, each calling AllReduce with its own rank; calls of one rank
// are sequential. Buffers must not overlap.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "common/base/status.h"

namespace tandem {

class CpuAllReduce {
 public:
  // participants >= 1; timeout > 0 bounds each wait for the other ranks.
  CpuAllReduce(int participants, std::chrono::milliseconds timeout);
  CpuAllReduce(const CpuAllReduce&) = delete;
  CpuAllReduce& operator=(const CpuAllReduce&) = delete;

  [[nodiscard]] Status AllReduce(int rank, float* data, size_t count);

  int participants() const { return participants_; }
  bool broken() const;
  // Breaks the collective now (the owner gave up on a rank): waiting ranks return
  // FailedPrecondition at once, and so does every later call. Any thread.
  void Break();

 private:
  // Waits until every rank reached this barrier (or the timeout: breaks the collective).
  Status Barrier(std::unique_lock<std::mutex>& lock, int rank);

  const int participants_;
  const std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<float*> buffers_;    // guarded by mu_; the ranks' buffers of the current call
  std::vector<uint64_t> arrived_;  // guarded by mu_; per rank, the barriers it passed into
  uint64_t generation_ = 0;        // guarded by mu_; barriers completed
  int waiting_ = 0;                // guarded by mu_; ranks in the current barrier
  size_t count_ = 0;               // guarded by mu_; count of the current call
  bool broken_ = false;            // guarded by mu_
};

}  // namespace tandem
