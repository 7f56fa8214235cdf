// The NCCL communicators of one tensor-parallel instance: `degree` ranks in one process, rank r
// on CUDA device r (of what CUDA_VISIBLE_DEVICES shows), made together by ncclCommInitAll. The
// CUDA backend's TpCudaForward sums its ranks' partial projections through it (the GPU
// counterpart of CpuAllReduce, common/engine/cpu_all_reduce.h).
//
// Errors: AllReduceSum only queues the collective on the caller's stream; a rank that never
// joins leaves the others' streams waiting on the device. The owner bounds its stream waits
// (CudaStream::SynchronizeWithin) and calls Abort when a rank failed or a wait ran out: the
// waiting kernels then end, and the clique is broken for good (AllReduceSum: FailedPrecondition).
//
// Threads: rank r's AllReduceSum is called by one thread at a time (rank r's); Abort by any
// thread, any time, also while a rank is inside ncclAllReduce (blocked in a launch behind a
// collective that never completes: the abort is what unblocks it, as PyTorch's NCCL watchdog
// does). Nothing is locked across an NCCL call.
//
// Abort does not free a communicator a rank may be inside: it revokes them (ncclCommRevoke,
// NCCL 2.28+: in-flight operations stop, the communicator stays allocated), waits up to
// kAbortWaitForRanks for every rank to leave AllReduceSum, and frees them only in the
// destructor, once they are quiescent. Where NCCL has no revoke (looked up at run time: an older
// libnccl still loads), or a rank stays inside past the wait, it aborts them at once as before
// (ncclCommAbort frees: a rank still inside may then touch freed memory). Plain C++
// declarations: no NCCL or CUDA headers here.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <vector>

#include "common/base/status.h"
#include "common/engine/cuda/cuda_util.h"

typedef struct ncclComm* ncclComm_t;

namespace tandem::cuda {

class NcclClique {
 public:
  // Communicators over devices 0..degree-1. InvalidArgument when fewer devices are visible;
  // Internal when NCCL fails (its message).
  static StatusOr<std::unique_ptr<NcclClique>> Create(int degree);
  ~NcclClique();
  NcclClique(const NcclClique&) = delete;
  NcclClique& operator=(const NcclClique&) = delete;

  int degree() const { return static_cast<int>(comms_.size()); }
  // Queues, on `stream` (rank `rank`'s device), the sum over ranks of `count` fp32 values at
  // `data`, in place. FailedPrecondition once broken; Internal when NCCL refuses.
  Status AllReduceSum(int rank, float* data, size_t count, cudaStream_t stream);
  // Aborts every communicator (the waiting collectives end); later calls fail. Idempotent.
  void Abort();
  bool broken() const;

  // How long Abort waits for the ranks to leave their NCCL calls once the communicators are
  // revoked, before it frees them under a rank that may still be inside.
  static constexpr std::chrono::milliseconds kAbortWaitForRanks{5000};

 private:
  NcclClique() = default;

  std::vector<ncclComm_t> comms_;  // [degree]; fixed once made (aborted ones are not reused)
  std::atomic<bool> broken_{false};
  std::atomic<int> inside_{0};     // ranks inside AllReduceSum's NCCL call
  std::mutex abort_mu_;            // one Abort runs the revokes or aborts
  bool revoked_ = false;           // guarded by abort_mu_: revoked, not freed (the destructor)
};

}  // namespace tandem::cuda
