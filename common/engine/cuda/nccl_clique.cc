#include "common/engine/cuda/nccl_clique.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <mutex>
#include <numeric>
#include <string>

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
  if (broken_) return;  // aborted: already freed
  for (ncclComm_t comm : comms_)
    if (comm != nullptr) (void)ncclCommDestroy(comm);
}

Status NcclClique::AllReduceSum(int rank, float* data, size_t count, cudaStream_t stream) {
  // An Abort between this check and the call below lets the call see an aborted communicator
  // (the window PyTorch's watchdog has too); every later call stops here.
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
  for (ncclComm_t comm : comms_)
    if (comm != nullptr) (void)ncclCommAbort(comm);
}

bool NcclClique::broken() const { return broken_; }

}  // namespace tandem::cuda
