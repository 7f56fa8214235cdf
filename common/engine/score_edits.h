// A row's logit edits: the Sampler's steps 0-2 (logit_bias, the min_tokens mask, repetition,
// presence and frequency penalties; common/engine/sampling.h) as a short list of per-token
// edits, so that they run where the logits are. The Sampler builds the list from the request
// and its tokens (Sampler::AppendScoreEdits) and applies it to its own copy of the logits with
// ApplyScoreEdits below; a device backend applies the same list to the logits on the device
// (cuda::ApplyScoreEdits, common/engine/cuda/kernels.h) and then takes the argmax or draws the
// row (common/engine/row_draw.h) without copying the logits back.
//
// Every edit touches one token and reads only that token's logit, except the mask, which
// applies only while a token outside the masked ones stays usable (a number above -inf after
// the biases): one count over the row. The float operations are the Sampler's, one at a time
// (never fused into an fma, on the host or the device), so both give the same scores bit for
// bit (a NaN may come out as another NaN: the device's is canonical); the amounts that
// combine request numbers (frequency * count + presence) are computed once on the host, into
// the edit.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>

#include "common/base/status.h"

#if defined(__CUDACC__)
#define TANDEM_EDIT_HOST_DEVICE __host__ __device__
#else
#define TANDEM_EDIT_HOST_DEVICE
#endif

namespace tandem {

// One token's edits, applied in this order (the Sampler's): add `bias` (kEditBias); set -inf
// (kEditMask, if the row keeps another usable token); the repetition penalty (kEditRepetition:
// a negative score times `repetition`, any other divided by it); subtract `subtract`
// (kEditSubtract: frequency_penalty * count + presence_penalty). A row lists a token at most
// once (Sampler::AppendScoreEdits merges a token's edits into one; the kernel's threads rely
// on it: two edits of one token would race).
inline constexpr uint32_t kEditBias = 1;
inline constexpr uint32_t kEditMask = 2;
inline constexpr uint32_t kEditRepetition = 4;
inline constexpr uint32_t kEditSubtract = 8;

struct ScoreEdit {
  int32_t token_id = 0;
  uint32_t flags = 0;
  float bias = 0.0f;
  float repetition = 1.0f;
  float subtract = 0.0f;
};

namespace score_edits {

// Step 0's bias: the score before the mask.
TANDEM_EDIT_HOST_DEVICE inline float Biased(float logit, const ScoreEdit& edit) {
  if (!(edit.flags & kEditBias)) return logit;
#if defined(__CUDA_ARCH__)
  return __fadd_rn(logit, edit.bias);
#else
  return logit + edit.bias;
#endif
}

// The steps after the mask, on the biased (and maybe masked) score.
TANDEM_EDIT_HOST_DEVICE inline float Penalised(float score, const ScoreEdit& edit) {
#if defined(__CUDA_ARCH__)
  if (edit.flags & kEditRepetition)
    score = score < 0.0f ? __fmul_rn(score, edit.repetition) : __fdiv_rn(score, edit.repetition);
  if (edit.flags & kEditSubtract) score = __fsub_rn(score, edit.subtract);
#else
  if (edit.flags & kEditRepetition)
    score = score < 0.0f ? score * edit.repetition : score / edit.repetition;
  if (edit.flags & kEditSubtract) score = score - edit.subtract;
#endif
  return score;
}

// Whether a score can be picked: a number above -inf (NaN and -inf cannot).
TANDEM_EDIT_HOST_DEVICE inline bool Usable(float score) {
  return score > -static_cast<float>(INFINITY);
}

}  // namespace score_edits

// Applies a row's edits to `row` in place. InvalidArgument when an edit's token id is outside
// the row (nothing is changed then).
Status ApplyScoreEdits(std::span<float> row, std::span<const ScoreEdit> edits);

// Checks a batch's edit lists as GreedyRows carries them (common/engine/forward_backend.h):
// `begin` empty, or [rows + 1] non-decreasing offsets from 0 to edits.size(); every token id
// in [0, vocab).
Status ValidateScoreEdits(std::span<const ScoreEdit> edits, std::span<const int32_t> begin,
                          size_t rows, int32_t vocab);

}  // namespace tandem
