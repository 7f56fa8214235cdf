// The CUDA backend as the backend seam (common/engine/forward_backend.cc) sees it: plain C++
// declarations, no CUDA headers, so that the host code that picks a backend compiles without
// the toolkit's include paths and the rest of common/ is the same object code on CUDA builds.
// Defined in common/engine/cuda/cuda_forward.cc (built only with TANDEM_CUDA).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "common/base/status.h"
#include "common/engine/forward_backend.h"

namespace tandem::cuda {

// A CudaForward (common/engine/cuda/cuda_forward.h) on device 0 of the process; with
// options.tensor_parallel t > 1 a TpForward (common/engine/tp_forward.h) of t CudaForward ranks
// on devices 0..t-1, their partial sums reduced by NCCL (NcclClique). InvalidArgument when
// fewer than t devices are visible or the model's shape does not split t ways.
StatusOr<std::unique_ptr<ForwardBackend>> CreateCudaBackend(const Model& model,
                                                            const ForwardOptions& options);

// A zeroed KV pool of `bytes` in the memory of CUDA device `device` (kind kCudaDevice;
// cudaMalloc, so that CUDA IPC can export it). Unavailable (no device), ResourceExhausted (out of
// memory).
StatusOr<KvPoolMemory> AllocateCudaKvPool(size_t bytes, int device = 0);

// Copies `bytes` from host memory into device memory (a KV pool's), synchronously, from any
// thread (cudaMemcpyDefault: unified addressing finds the device). Internal on a CUDA error.
Status CopyHostToDevice(void* device_dst, const void* host_src, size_t bytes);

// Total memory of device 0 in bytes (a tensor-parallel instance's GPUs are alike); Unavailable
// when no device is visible.
StatusOr<uint64_t> CudaDeviceMemoryBytes();
// Free and total memory of visible device `device` now, in bytes (its context made first, so
// that what the context takes is not counted as free). Unavailable when no device is visible,
// InvalidArgument when `device` is not one of them.
StatusOr<std::pair<uint64_t, uint64_t>> CudaDeviceFreeAndTotalBytes(int device);

// One line on the devices this process sees, for `tandem --version`: "2 devices: NVIDIA H100
// 80GB HBM3 (79.2 GiB), ..." or "no usable CUDA device: <why>".
std::string DescribeCudaDevices();

}  // namespace tandem::cuda
