#include "common/engine/cuda/nccl_clique.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <dlfcn.h>

#include <chrono>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>

namespace tandem::cuda {
namespace {

Status NcclError(ncclResult_t result, const std::string& what) {
  return Internal("NCCL " + what + ": " + ncclGetErrorString(result));
}

}  // namespace

StatusOr<std::unique_ptr<NcclClique>> NcclClique::Create(int degree) {
  TANDEM_ASSIGN_OR_RETURN(int visible, DeviceCount());
  if (degree < 1 || degree > visible)
    return InvalidArgument("tensor_parallel " + std::to_string(degree) + " needs that many GPUs; " +
                           std::to_string(visible) + " visible (CUDA_VISIBLE_DEVICES, " +
                           "cuda_devices)");
  auto clique = std::unique_ptr<NcclClique>(new NcclClique());
  clique->comms_.assign(degree, nullptr);
  std::vector<int> devices(degree);
  std::iota(devices.begin(), devices.end(), 0);
  const ncclResult_t result = ncclCommInitAll(clique->comms_.data(), degree, devices.data());
  if (result != ncclSuccess) {
    clique->comms_.clear();
    return NcclError(result, "ncclCommInitAll over " + std::to_string(degree) + " GPUs");
  }
  return clique;
}

NcclClique::~NcclClique() {
  std::lock_guard<std::mutex> lock(abort_mu_);
  if (!broken_) {
    for (ncclComm_t comm : comms_)
      if (comm != nullptr) (void)ncclCommDestroy(comm);
    return;
  }
  if (!revoked_) return;  // aborted: already freed
  // Revoked: every rank has left (the owner destroys the clique after its ranks); free each
  // communicator once its revoke has quiesced it (bounded: an abort frees it regardless).
  const auto until = std::chrono::steady_clock::now() + kAbortWaitForRanks;
  for (ncclComm_t comm : comms_) {
    if (comm == nullptr) continue;
    ncclResult_t state = ncclInProgress;
    while (ncclCommGetAsyncError(comm, &state) == ncclSuccess && state == ncclInProgress &&
           std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    (void)ncclCommAbort(comm);
  }
}

Status NcclClique::AllReduceSum(int rank, float* data, size_t count, cudaStream_t stream) {
  // Counted inside before the check: an Abort that comes after it revokes (does not free) the
  // communicator this call is about to use, and waits for the count to drop.
  inside_.fetch_add(1);
  struct Leave {
    std::atomic<int>& inside;
    ~Leave() { inside.fetch_sub(1); }
  } leave{inside_};
  if (broken_)
    return FailedPrecondition("tensor parallelism: the NCCL communicators were aborted after a "
                              "rank failed or timed out");
  TANDEM_CHECK(rank >= 0 && rank < degree(), "NcclClique: rank out of range");
  const ncclResult_t result =
      ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comms_[rank], stream);
  if (result != ncclSuccess) return NcclError(result, "ncclAllReduce");
  return Status::Ok();
}

void NcclClique::Abort() {
  std::lock_guard<std::mutex> lock(abort_mu_);
  if (broken_.exchange(true)) return;
  // ncclCommRevoke where this libnccl has it (2.28+), found at run time so that an older one
  // still loads the binary.
  using RevokeFn = ncclResult_t (*)(ncclComm_t, int);
  static const auto revoke = reinterpret_cast<RevokeFn>(dlsym(RTLD_DEFAULT, "ncclCommRevoke"));
  bool revoked = revoke != nullptr;
  for (ncclComm_t comm : comms_) {
    if (!revoked || comm == nullptr) continue;
    const ncclResult_t result = revoke(comm, /*NCCL_REVOKE_DEFAULT*/ 0);
    revoked = result == ncclSuccess || result == ncclInProgress;  // quiescing: the destructor waits
  }
  const auto until = std::chrono::steady_clock::now() + kAbortWaitForRanks;
  while (revoked && inside_.load() > 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (revoked && inside_.load() == 0) {
    revoked_ = true;  // the destructor frees them
    return;
  }
  for (ncclComm_t comm : comms_)  // no revoke, or a rank stuck inside: unblock it the old way
    if (comm != nullptr) (void)ncclCommAbort(comm);
}

bool NcclClique::broken() const { return broken_; }

}  // namespace tandem::cuda
