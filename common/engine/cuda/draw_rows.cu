// cuda::DrawRows (kernels.h): DrawRow (common/engine/row_draw.h) on the device, one thread block a
// row. The same stages and the same radix descents as the host function, on the same integer masses
// (row_draw::FixedMass): a pass's histogram is built with shared-memory integer atomics (the lanes
// of a warp that fall in one bin add theirs first: the top digits of a row's keys crowd into a few
// bins) and read by thread 0 (row_draw::ChooseDigit, shared with the host); every sum is a block
// reduction. Integer sums do not depend on their order, so the token is DrawRow's (up to the
// device's exp, row_draw.h). Block-uniform control flow throughout: every thread takes the same
// branches and every warp the same loop trips, so the __syncthreads() and the warp-wide shuffles
// inside are reached by all.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/engine/cuda/kernels.h"
#include "common/engine/row_draw.h"

namespace tandem::cuda {
namespace {

using namespace row_draw;  // the steps both sides share

constexpr int kDrawThreads = 512;
constexpr int kDrawWarps = kDrawThreads / 32;

struct DrawShared {
  unsigned long long hist[kDigits];
  unsigned long long partial[kDrawWarps];
  double partial_sum[kDrawWarps];
  float partial_max[kDrawWarps];
  uint64_t below;
  uint64_t prefix;
  int digit;
  uint64_t top_keys[kMaxTopLogprobs];  // the logprobs' top tokens, unordered
  int num_top_keys;
};

// The row as each thread reads it (row_draw.cc's RowView).
struct DeviceRow {
  const float* logits;
  RowDraw d;
  float max_score = -INFINITY;
  bool top_k_on = false;
  uint32_t kth_desc = 0;
  bool cut_on = false;
  uint64_t cut_key = 0;

  __device__ float Score(int32_t i) const { return logits[i] / d.temperature; }
  __device__ static bool Usable(float s) { return s > -INFINITY; }
  __device__ double Weight(float s) const { return RowWeight(s, max_score); }
  __device__ uint64_t Mass(float s) const { return FixedMass(Weight(s)); }
  __device__ bool KeptTopK(float s) const {
    return Usable(s) && (!top_k_on || ~ScoreKey(s) <= kth_desc);
  }
  __device__ bool Kept(float s, int32_t i) const {
    if (!KeptTopK(s)) return false;
    if (cut_on && ScoreOrderKey(s, i) > cut_key) return false;
    return d.min_p <= 0.0f || Weight(s) >= static_cast<double>(d.min_p);
  }
};

// The block's sum of v, in `partial` (one slot a warp); every thread gets it. Integers for the
// draw (exact in any order); doubles for the logprobs' normaliser (not part of the draw: its
// order shows only in the last bits of a reported logprob).
template <typename T, typename Slot>
__device__ T BlockSum(T v, Slot* partial) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  __syncthreads();  // partial[] free from its last use
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < kDrawWarps; ++w) total += partial[w];
  return total;
}

__device__ float BlockMax(float v, DrawShared& sh) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  __syncthreads();
  if (threadIdx.x % 32 == 0) sh.partial_max[threadIdx.x / 32] = v;
  __syncthreads();
  float best = -INFINITY;
  for (int w = 0; w < kDrawWarps; ++w) best = fmaxf(best, sh.partial_max[w]);
  return best;
}

__device__ uint64_t BlockMaxKey(uint64_t v, DrawShared& sh) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const uint64_t other = __shfl_xor_sync(0xffffffffu, v, offset);
    v = other > v ? other : v;
  }
  __syncthreads();
  if (threadIdx.x % 32 == 0) sh.partial[threadIdx.x / 32] = v;
  __syncthreads();
  uint64_t best = 0;
  for (int w = 0; w < kDrawWarps; ++w) best = sh.partial[w] > best ? sh.partial[w] : best;
  return best;
}

// Adds `mass` to hist[bin] (bin < 0: nothing) for every lane of the warp: the lanes of one bin
// sum theirs over shuffles and the lowest of them adds it. All 32 lanes call it together.
__device__ void WarpAddToBin(unsigned long long* hist, int bin, uint64_t mass) {
  const unsigned peers = __match_any_sync(0xffffffffu, bin);
  uint64_t sum = 0;
  for (int lane = 0; lane < 32; ++lane) {
    const uint64_t m = __shfl_sync(0xffffffffu, mass, lane);
    if (peers & (1u << lane)) sum += m;
  }
  if (bin >= 0 && (threadIdx.x % 32) == static_cast<unsigned>(__ffs(peers) - 1) && sum > 0)
    atomicAdd(&hist[bin], static_cast<unsigned long long>(sum));
}

// row_draw.cc's Descend: the first key (ascending) of the low `bits` bits at which the
// running total of mass(i) reaches target. False when it stays short.
template <typename KeyFn, typename MassFn>
__device__ bool Descend(DrawShared& sh, int32_t n, int bits, KeyFn key, MassFn mass,
                        uint64_t target, bool inclusive, uint64_t* found) {
  __syncthreads();  // every thread has read the last descent's prefix
  if (threadIdx.x == 0) {
    sh.prefix = 0;
    sh.below = 0;
  }
  for (int shift = bits - 8; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < kDigits; d += blockDim.x) sh.hist[d] = 0;
    __syncthreads();
    const uint64_t prefix = sh.prefix;
    const uint64_t high_mask = shift + 8 >= 64 ? 0 : ~uint64_t{0} << (shift + 8);
    // Every lane of a warp makes the same trips (i past the row: no bin).
    for (int32_t first = threadIdx.x - threadIdx.x % 32; first < n; first += blockDim.x) {
      const int32_t i = first + static_cast<int32_t>(threadIdx.x % 32);
      int bin = -1;
      uint64_t m = 0;
      if (i < n) {
        m = mass(i);
        const uint64_t k = m > 0 ? key(i) : 0;
        if (m > 0 && (k & high_mask) == (prefix & high_mask)) bin = (k >> shift) & 0xff;
      }
      if (__ballot_sync(0xffffffffu, bin >= 0) != 0)  // (the whole warp: same ballot)
        WarpAddToBin(sh.hist, bin, bin >= 0 ? m : 0);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      uint64_t below = sh.below;
      sh.digit = ChooseDigit(sh.hist, &below, target, inclusive);
      sh.below = below;
      if (sh.digit >= 0) sh.prefix = prefix | (static_cast<uint64_t>(sh.digit) << shift);
    }
    __syncthreads();
    if (sh.digit < 0) return false;
  }
  *found = sh.prefix;
  return true;
}

// row_draw.cc's RawLogprobs: the raw log-softmax's value at `token` and its top `top` tokens.
__device__ void RawLogprobs(const float* logits, int32_t n, int32_t token, int32_t top,
                            DrawShared& sh, RowLogprobs* out) {
  auto usable_logit = [&](int32_t i) {
    const float v = logits[i];
    return DeviceRow::Usable(v) ? v : -INFINITY;
  };
  float local_max = -INFINITY;
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) local_max = fmaxf(local_max, logits[i]);
  const float max_value = BlockMax(local_max, sh);  // fmaxf skips NaN; -inf never wins
  double local_sum = 0;
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x)
    if (DeviceRow::Usable(logits[i]))
      local_sum += exp(static_cast<double>(logits[i]) - static_cast<double>(max_value));
  const double log_z = max_value + log(BlockSum(local_sum, sh.partial_sum));
  auto logprob = [&](int32_t t) {
    return DeviceRow::Usable(logits[t]) ? static_cast<float>(logits[t] - log_z) : -INFINITY;
  };
  const int32_t count = top < n ? top : n;
  uint64_t last = 0;  // the count-th key: the top ones are the keys up to it
  const bool any = count > 0 && Descend(
                                    sh, n, 64,
                                    [&](int32_t i) { return ScoreOrderKey(usable_logit(i), i); },
                                    [](int32_t) { return uint64_t{1}; },
                                    static_cast<uint64_t>(count), true, &last);
  if (threadIdx.x == 0) sh.num_top_keys = 0;
  __syncthreads();
  if (any)
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
      const uint64_t k = ScoreOrderKey(usable_logit(i), i);
      if (k <= last) sh.top_keys[atomicAdd(&sh.num_top_keys, 1)] = k;
    }
  __syncthreads();
  if (threadIdx.x != 0) return;
  const int found = any ? sh.num_top_keys : 0;
  for (int a = 1; a < found; ++a)  // at most kMaxTopLogprobs: insertion sort
    for (int b = a; b > 0 && sh.top_keys[b] < sh.top_keys[b - 1]; --b) {
      const uint64_t t = sh.top_keys[b];
      sh.top_keys[b] = sh.top_keys[b - 1];
      sh.top_keys[b - 1] = t;
    }
  out->logprob = logprob(token);
  out->num_top = found;
  for (int j = 0; j < found; ++j) {
    out->top_ids[j] = static_cast<int32_t>(sh.top_keys[j] & 0xffffffffu);
    out->top_logprobs[j] = logprob(out->top_ids[j]);
  }
}

__global__ void DrawRowsKernel(const float* logits, int32_t vocab, const RowDraw* draws,
                               int32_t* out_ids, RowLogprobs* out_logprobs) {
  __shared__ DrawShared sh;
  const RowDraw d = draws[blockIdx.x];
  if (d.draw == kRowNotDrawn) return;  // the whole block: d is the row's
  DeviceRow row{logits + int64_t{blockIdx.x} * vocab, d};
  const int32_t n = vocab;
  if (d.draw == kRowArgmax) {  // the first usable token in score order: ArgmaxRow's
    uint64_t local_first = 0;  // as ~key, so that the block's max is the first key
    bool local_any = false;
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
      if (!DeviceRow::Usable(row.logits[i])) continue;
      const uint64_t k = ~ScoreOrderKey(row.logits[i], i);
      local_first = k > local_first ? k : local_first;
      local_any = true;
    }
    const uint64_t first = BlockMaxKey(local_any ? local_first : 0, sh);
    // 0: no usable token (a usable token's ~key is not 0: its ScoreKey is above -inf's).
    const int32_t token = first == 0 ? -1 : static_cast<int32_t>(~first & 0xffffffffu);
    if (threadIdx.x == 0) out_ids[blockIdx.x] = token;
    if (token >= 0 && d.top_logprobs >= 0 && out_logprobs != nullptr)
      RawLogprobs(row.logits, n, token, d.top_logprobs, sh, &out_logprobs[blockIdx.x]);
    return;
  }

  float local_max = -INFINITY;
  uint64_t local_usable = 0;
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float s = row.Score(i);
    if (!DeviceRow::Usable(s)) continue;
    local_usable += 1;
    local_max = fmaxf(local_max, s);
  }
  row.max_score = BlockMax(local_max, sh);
  const uint64_t usable = BlockSum(local_usable, sh.partial);
  if (usable == 0) {
    if (threadIdx.x == 0) out_ids[blockIdx.x] = -1;
    return;
  }

  // 2. top-k: the k-th key of the usable ones, higher score first (counts).
  if (d.top_k > 0 && static_cast<uint64_t>(d.top_k) < usable) {
    uint64_t kth = 0;
    row.top_k_on = Descend(
        sh, n, 32, [&](int32_t i) { return uint64_t{~ScoreKey(row.Score(i))}; },
        [&](int32_t i) { return uint64_t{DeviceRow::Usable(row.Score(i))}; },
        static_cast<uint64_t>(d.top_k), true, &kth);
    row.kth_desc = static_cast<uint32_t>(kth);
  }

  // 4. top-p: where the weight from the top first reaches top_p of what top-k kept.
  auto score_order = [&](int32_t i) { return ScoreOrderKey(row.Score(i), i); };
  if (d.top_p < 1.0f) {
    uint64_t local_total = 0;
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float s = row.Score(i);
      if (row.KeptTopK(s)) local_total += row.Mass(s);
    }
    const uint64_t total = BlockSum(local_total, sh.partial);
    uint64_t cut = 0;
    row.cut_on = Descend(
        sh, n, 64, score_order,
        [&](int32_t i) -> uint64_t {
          const float s = row.Score(i);
          return row.KeptTopK(s) ? row.Mass(s) : 0;
        },
        TopPReach(d.top_p, total), true, &cut);
    row.cut_key = cut;
  }

  // 6. the draw, over what every warper kept, in the Sampler's order.
  uint64_t local_kept = 0;
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float s = row.Score(i);
    if (row.Kept(s, i)) local_kept += row.Mass(s);
  }
  const uint64_t kept_mass = BlockSum(local_kept, sh.partial);
  auto kept_weight = [&](int32_t i) -> uint64_t {
    const float s = row.Score(i);
    return row.Kept(s, i) ? row.Mass(s) : 0;
  };
  const bool score_walk = d.top_p < 1.0f;
  const uint64_t target = DrawTarget(d.u, kept_mass);
  uint64_t chosen = 0;
  const bool found =
      score_walk ? Descend(sh, n, 64, score_order, kept_weight, target, false, &chosen)
                 : Descend(
                       sh, n, 32, [](int32_t i) { return static_cast<uint64_t>(i); },
                       kept_weight, target, false, &chosen);
  if (!found) {  // rounding left the total a hair under the target: the last kept token
    uint64_t local_last = 0;
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float s = row.Score(i);
      if (!row.Kept(s, i)) continue;
      const uint64_t k = score_walk ? score_order(i) : static_cast<uint64_t>(i);
      local_last = k > local_last ? k : local_last;
    }
    chosen = BlockMaxKey(local_last, sh);
  }
  const int32_t token = static_cast<int32_t>(chosen & 0xffffffffu);
  if (threadIdx.x == 0) out_ids[blockIdx.x] = token;
  if (d.top_logprobs >= 0 && out_logprobs != nullptr)
    RawLogprobs(row.logits, n, token, d.top_logprobs, sh, &out_logprobs[blockIdx.x]);
}

}  // namespace

Status DrawRows(const float* logits, int32_t num_rows, int32_t vocab, const RowDraw* draws,
                int32_t* out_ids, RowLogprobs* out_logprobs, cudaStream_t stream) {
  TANDEM_CHECK(num_rows >= 0 && vocab > 0, "bad sizes");
  if (num_rows == 0) return Status::Ok();
  DrawRowsKernel<<<num_rows, kDrawThreads, 0, stream>>>(logits, vocab, draws, out_ids,
                                                        out_logprobs);
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::Ok();
}

}  // namespace tandem::cuda
