// cuda::ApplyScoreEdits (kernels.h): ApplyScoreEdits (common/engine/score_edits.h) on the device,
// one thread block a row. The per-token steps are score_edits.h's own functions (their device
// branch rounds each operation alone, as the host's -ffp-contract=off build does); the mask's
// question (does a token outside it stay usable?) is one count over the row. Each token is
// listed once per row, so the threads' writes never meet. Block-uniform control flow: every
// __syncthreads() is reached by all.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/engine/cuda/kernels.h"
#include "common/engine/score_edits.h"

namespace tandem::cuda {
namespace {

constexpr int kEditThreads = 256;

__global__ void ApplyScoreEditsKernel(float* logits, int32_t vocab, const ScoreEdit* edits,
                                      const int32_t* edit_begin) {
  const int32_t first = edit_begin[blockIdx.x];
  const int32_t last = edit_begin[blockIdx.x + 1];
  if (first == last) return;  // the same for the whole block
  float* row = logits + static_cast<size_t>(blockIdx.x) * vocab;
  __shared__ int any_mask;
  __shared__ unsigned long long usable_outside_mask;
  if (threadIdx.x == 0) {
    any_mask = 0;
    usable_outside_mask = 0;
  }
  __syncthreads();
  // Step 0: the biases, before the mask's count.
  for (int32_t j = first + threadIdx.x; j < last; j += blockDim.x) {
    const ScoreEdit e = edits[j];
    row[e.token_id] = score_edits::Biased(row[e.token_id], e);
    if (e.flags & kEditMask) atomicOr(&any_mask, 1);
  }
  __syncthreads();
  bool mask = false;
  if (any_mask) {  // usable tokens of the row minus the usable masked ones (modulo 2^64: the
                   // block's total is the true count, never negative)
    unsigned long long local = 0;
    for (int32_t i = threadIdx.x; i < vocab; i += blockDim.x) local += score_edits::Usable(row[i]);
    for (int32_t j = first + threadIdx.x; j < last; j += blockDim.x)
      if ((edits[j].flags & kEditMask) && score_edits::Usable(row[edits[j].token_id])) --local;
    atomicAdd(&usable_outside_mask, local);
    __syncthreads();
    mask = usable_outside_mask > 0;
  }
  for (int32_t j = first + threadIdx.x; j < last; j += blockDim.x) {
    const ScoreEdit e = edits[j];
    float score = row[e.token_id];
    if (mask && (e.flags & kEditMask)) score = -INFINITY;
    row[e.token_id] = score_edits::Penalised(score, e);
  }
}

}  // namespace

Status ApplyScoreEdits(float* logits, int32_t num_rows, int32_t vocab, const ScoreEdit* edits,
                       const int32_t* edit_begin, cudaStream_t stream) {
  TANDEM_CHECK(num_rows >= 0 && vocab > 0, "bad sizes");
  if (num_rows == 0) return Status::Ok();
  ApplyScoreEditsKernel<<<num_rows, kEditThreads, 0, stream>>>(logits, vocab, edits, edit_begin);
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::Ok();
}

}  // namespace tandem::cuda
