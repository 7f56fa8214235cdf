// GPU memory of one rank of a CUDA instance, planned on the host before anything is allocated.
// CudaForward allocates exactly the buffers PlanCudaWorkspaces names, so that the KV pool can be
// sized against what is left of the GPU (kvtransfer/factory.h's InstanceKvPools) and start-up
// can say, in bytes, what does not fit (CheckDeviceMemoryFits) instead of a cudaMalloc error
// half-way through. Shared host code of the CUDA backend, tested on the CPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/engine/forward_backend.h"
#include "common/model/model_config.h"

namespace tandem {

// Every device buffer starts at this alignment; a buffer's bytes are rounded up to it.
inline constexpr size_t kCudaBufferAlign = 256;
inline size_t AlignUpCuda(size_t n) {
  return (n + kCudaBufferAlign - 1) / kCudaBufferAlign * kCudaBufferAlign;
}
// cuBLAS's workspace, one per rank (cuBLAS's own recommendation for Hopper).
inline constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

// Offsets of one batch's inputs (DeviceBatch's arrays) in one device buffer, and its size.
struct CudaInputSlots {
  size_t token_ids = 0, positions = 0, slot_mapping = 0, seq_lens = 0, last_token = 0,
         tiles = 0, block_tables = 0, bytes = 0;
};

// The bytes of each buffer one rank's forward pass holds, for passes of up to
// options.max_batch_tokens tokens and max_batch_sequences sequences. 0: not allocated.
struct CudaWorkspacePlan {
  int32_t decode_partitions = 1;  // split-K partitions of a graph pass (max_model_len)
  size_t rows = 0;                // rows of the activation buffers: max(tokens, sequences)
  // Activations (fp32) and the bf16 staging of a low-precision model's GEMM inputs.
  size_t x = 0, xn = 0, qkv = 0, attn = 0, mlp = 0, act = 0, lowp = 0, last = 0, partials = 0;
  // The LM head's output and the device's picks, on the rank that returns logits (device
  // buffers; each has a pinned host twin of the same size).
  size_t logits = 0, argmax = 0, draws = 0, logprobs = 0, edit_begin = 0;
  CudaInputSlots inputs;  // device, with a pinned host twin
  size_t cublas = kCublasWorkspaceBytes;

  // Device bytes of all of the above, each buffer rounded up to kCudaBufferAlign. Not counted:
  // the score edits' buffer (grown with the edits a step has: a few KiB a row), captured
  // graphs, and what CUDA, cuBLAS and NCCL allocate for themselves.
  size_t device_bytes() const;
};

// The plan for a rank whose model is `rank_config` (ShardConfig's under tensor parallelism),
// with options as the engine gives its backend; low_precision: bf16 weights (false: fp32);
// returns_logits: this rank runs the LM head (rank 0, or the only rank).
CudaWorkspacePlan PlanCudaWorkspaces(const ModelConfig& rank_config, const ForwardOptions& options,
                                     bool low_precision, bool returns_logits);

// What one GPU of an instance holds, in bytes: the figures start-up checks against the GPU.
struct DeviceMemoryNeed {
  uint64_t kv_pool = 0;
  uint64_t weights = 0;     // the rank's (TpRankWeightBytes)
  uint64_t workspaces = 0;  // CudaWorkspacePlan::device_bytes
  uint64_t transfer = 0;    // KV transfer buffers on the GPU (nccl: a staging buffer per link)
  uint64_t total() const { return kv_pool + weights + workspaces + transfer; }
  uint64_t besides_kv() const { return weights + workspaces + transfer; }
};

// Room left on a GPU past what an instance asks for: what CUDA's context, cuBLAS, NCCL and
// captured graphs allocate beyond the planned buffers (a CUDA context alone is ~0.3-0.5 GiB on
// Hopper, taken before the check reads the free memory; this is for the rest).
inline constexpr uint64_t kDeviceMemoryMargin = uint64_t{256} << 20;

// OK when `need` fits in `free_bytes` of GPU `device` (of `total_bytes`) with
// kDeviceMemoryMargin to spare; else ResourceExhausted naming `field` (where it was set, from
// `where`), the instance (`name`: prefill, decode, colocated), each part of the need in GiB,
// what the GPU has free, and what to change.
Status CheckDeviceMemoryFits(const std::string& where, const std::string& field,
                             const std::string& name, int device, const DeviceMemoryNeed& need,
                             uint64_t free_bytes, uint64_t total_bytes);

// What start-up planned for each GPU of an instance, and what each had free before the instance
// allocated anything: kept to say, once it is up, what its GPUs really took.
struct DeviceMemoryPlan {
  DeviceMemoryNeed need;              // per GPU (rank 0's, the largest)
  std::vector<uint64_t> free_before;  // [rank]
};

// One line for the start-up log on rank `rank`'s GPU, from what it has free now:
// "GPU 0: start-up took 57.41 GiB, 0.13 GiB more than planned (KV pool 56.00, weights 0.25,
// forward buffers 1.00, KV transfer buffers 0.03; the rest is what CUDA, cuBLAS and NCCL keep
// for themselves, within the 0.25 GiB margin)". *over_margin: whether the unplanned part exceeds
// kDeviceMemoryMargin (the check at start-up would then pass for an instance that does not fit).
std::string DescribeDeviceMemoryUse(const DeviceMemoryPlan& plan, int rank, uint64_t free_now,
                                    bool* over_margin);

}  // namespace tandem
