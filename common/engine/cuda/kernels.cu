// Implementations of common/engine/cuda/kernels.h. Simple, correct kernels first: each is
// written to be checked against the CPU backend (tests/gpu/cuda_kernels_check.cc) before it is
// tuned.
#include "common/engine/cuda/kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>

namespace tandem::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;
constexpr int kMaxHeadDim = 256;
constexpr int kMaxDimsPerLane = kMaxHeadDim / 32;
constexpr int kAttnThreads = 256;
constexpr int kAttnWarps = kAttnThreads / 32;

__device__ __forceinline__ float Load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float Load(const bf16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void Store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void Store(bf16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the block; every thread gets the result. `scratch` holds blockDim.x / 32 floats.
__device__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int num_warps = blockDim.x / 32;
  v = WarpSum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < num_warps; ++w) total += scratch[w];
  return total;
}

int GridFor(int64_t n, int threads) {
  int64_t blocks = (n + threads - 1) / threads;
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(blocks, 1), 65535 * 16));
}

Status LaunchStatus() {
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::Ok();
}

// Calls f with a null pointer of the storage type of `dtype`, so one generic lambda covers both.
template <typename F>
void DispatchDType(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32: f(static_cast<float*>(nullptr)); return;
    case DType::kBF16: f(static_cast<bf16*>(nullptr)); return;
  }
  TANDEM_CHECK(false, "unknown DType");
}

// ---- kernels -------------------------------------------------------------------------------

template <typename In, typename Out>
__global__ void ConvertKernel(const In* in, Out* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    Store(out, i, Load(in, i));
  }
}

template <typename T>
__global__ void RmsNormKernel(const T* x, const T* weight, T* out, int32_t hidden, float eps) {
  __shared__ float scratch[kThreads / 32];
  const int64_t row = int64_t{blockIdx.x} * hidden;
  float sum_sq = 0.0f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    float v = Load(x, row + i);
    sum_sq += v * v;
  }
  sum_sq = BlockSum(sum_sq, scratch);
  const float inv_rms = 1.0f / sqrtf(sum_sq / static_cast<float>(hidden) + eps);
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    Store(out, row + i, Load(x, row + i) * inv_rms * Load(weight, i));
  }
}

template <typename T>
__global__ void AddKernel(const T* a, const T* b, T* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    Store(out, i, Load(a, i) + Load(b, i));
  }
}

template <typename T>
__global__ void SiluAndMulKernel(const T* gate, const T* up, T* out, int32_t inter,
                                 int32_t in_stride) {
  const int64_t t = blockIdx.x;
  for (int i = threadIdx.x; i < inter; i += blockDim.x) {
    const float g = Load(gate, t * in_stride + i);
    const float u = Load(up, t * in_stride + i);
    Store(out, t * inter + i, g / (1.0f + expf(-g)) * u);
  }
}

template <typename T>
__global__ void EmbeddingKernel(const T* table, const int32_t* ids, T* out, int32_t hidden,
                                int32_t vocab) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  const bool valid = id >= 0 && id < vocab;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    Store(out, t * hidden + i, valid ? Load(table, int64_t{id} * hidden + i) : 0.0f);
  }
}

template <typename T>
__device__ void RotateRow(T* x, int32_t heads, int32_t head_dim, int32_t position,
                          const float* inv_freq) {
  const int half = head_dim / 2;
  for (int idx = threadIdx.x; idx < heads * half; idx += blockDim.x) {
    const int head = idx / half, i = idx % half;
    const float angle = static_cast<float>(position) * inv_freq[i];  // fp32, as HF and CPU
    double s, c;
    sincos(static_cast<double>(angle), &s, &c);
    const float sf = static_cast<float>(s), cf = static_cast<float>(c);
    T* h = x + static_cast<int64_t>(head) * head_dim;
    const float a = Load(h, i), b = Load(h, i + half);
    // __fmul_rn keeps nvcc from fusing into FMAs, so rounding matches the CPU's a*c - b*s.
    Store(h, i, __fmul_rn(a, cf) - __fmul_rn(b, sf));
    Store(h, i + half, __fmul_rn(b, cf) + __fmul_rn(a, sf));
  }
}

template <typename T>
__global__ void RopeKernel(T* q, T* k, const int32_t* positions, const float* inv_freq,
                           int32_t num_heads, int32_t num_kv_heads, int32_t head_dim,
                           int32_t q_stride, int32_t k_stride) {
  const int64_t t = blockIdx.x;
  const int32_t position = positions[t];
  RotateRow(q + t * q_stride, num_heads, head_dim, position, inv_freq);
  if (k != nullptr) RotateRow(k + t * k_stride, num_kv_heads, head_dim, position, inv_freq);
}

template <typename T, typename KvT>
__global__ void WriteKvKernel(const T* k, const T* v, int32_t kv_stride, KvT* layer_base,
                              int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
                              const int64_t* slot_mapping) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slot_mapping[t];
  if (slot < 0) return;
  const int64_t block = slot / block_size, offset = slot % block_size;
  KvT* base = layer_base + block * (int64_t{2} * num_kv_heads * block_size * head_dim);
  for (int idx = threadIdx.x; idx < num_kv_heads * head_dim; idx += blockDim.x) {
    const int h = idx / head_dim, d = idx % head_dim;
    const int64_t k_dst = (int64_t{h} * block_size + offset) * head_dim + d;
    const int64_t v_dst = (int64_t{num_kv_heads + h} * block_size + offset) * head_dim + d;
    Store(base, k_dst, Load(k, t * kv_stride + idx));
    Store(base, v_dst, Load(v, t * kv_stride + idx));
  }
}

// Decode attention, one thread block per (head, sequence, partition). Each warp walks every
// kAttnWarps-th token of the partition with an online softmax (running max m, sum l, weighted V
// sum acc); the warps' partial results are merged at the end, into the output row (one
// partition) or the partition's slot of `partials` ([m, l, acc[head_dim]], merged by
// DecodeCombineKernel). Lane j holds dims j, j + 32, ... of q and acc.
template <typename KvT>
__global__ void PagedAttentionDecodeKernel(PagedAttentionArgs a, const int32_t* seq_lens,
                                           int32_t num_partitions, float* partials) {
  __shared__ float warp_m[kAttnWarps];
  __shared__ float warp_l[kAttnWarps];
  __shared__ float warp_acc[kAttnWarps][kMaxHeadDim];

  const int head = blockIdx.x, seq = blockIdx.y, part = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int head_dim = a.shape.head_dim, block_size = a.shape.block_size;
  const int num_kv_heads = a.shape.num_kv_heads;
  const int kv_head = head / (a.num_heads / num_kv_heads);
  const int32_t seq_len = seq_lens[seq];
  const int32_t lo = a.sliding_window > 0 ? max(0, seq_len - a.sliding_window) : 0;
  const int32_t begin = lo + part * kDecodePartitionTokens;
  const int32_t end = min(seq_len, begin + kDecodePartitionTokens);
  const KvT* layer_base = static_cast<const KvT*>(a.layer_base);
  const int32_t* table = a.block_tables + int64_t{seq} * a.max_blocks_per_seq;
  const int64_t block_elems = a.shape.BlockElements();
  const int64_t k_offset = int64_t{kv_head} * block_size * head_dim;
  const int64_t v_offset = int64_t{num_kv_heads + kv_head} * block_size * head_dim;
  float* out_row = a.out + int64_t{seq} * a.out_stride + int64_t{head} * head_dim;
  // Null when there is one partition (no partials): offsetting a null pointer is undefined.
  float* part_row =
      partials == nullptr
          ? nullptr
          : partials + ((int64_t{seq} * a.num_heads + head) * num_partitions + part) *
                           (head_dim + 2);

  if (begin >= end) {  // past the context (or padding): nothing to contribute
    if (num_partitions == 1) {
      for (int d = threadIdx.x; d < head_dim; d += blockDim.x) out_row[d] = 0.0f;
    } else {
      for (int d = threadIdx.x; d < head_dim + 2; d += blockDim.x)
        part_row[d] = d == 0 ? -INFINITY : 0.0f;
    }
    return;
  }

  const float* q_row = a.q + int64_t{seq} * a.q_stride + int64_t{head} * head_dim;
  float qr[kMaxDimsPerLane], acc[kMaxDimsPerLane];
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    qr[i] = d < head_dim ? q_row[d] : 0.0f;
    acc[i] = 0.0f;
  }

  float m = -INFINITY, l = 0.0f;
  for (int32_t t = begin + warp; t < end; t += kAttnWarps) {
    const KvT* block = layer_base + int64_t{table[t / block_size]} * block_elems;
    const int64_t row = int64_t{t % block_size} * head_dim;
    const KvT* k_row = block + k_offset + row;
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < head_dim) dot += qr[i] * Load(k_row, d);
    }
    const float s = WarpSum(dot) * a.scale;
    const float m_new = fmaxf(m, s);
    const float correction = expf(m - m_new);  // 0 on the first token (m = -inf)
    const float p = expf(s - m_new);
    l = l * correction + p;
    const KvT* v_row = block + v_offset + row;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < head_dim) acc[i] = acc[i] * correction + p * Load(v_row, d);
    }
    m = m_new;
  }

  if (lane == 0) {
    warp_m[warp] = m;
    warp_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < head_dim) warp_acc[warp][d] = acc[i];
  }
  __syncthreads();

  // Warp 0 had the partition's first token, so m_all is finite; idle warps weigh 0.
  float m_all = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) m_all = fmaxf(m_all, warp_m[w]);
  float l_all = 0.0f;
  for (int w = 0; w < kAttnWarps; ++w) l_all += warp_l[w] * expf(warp_m[w] - m_all);
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w) sum += warp_acc[w][d] * expf(warp_m[w] - m_all);
    if (num_partitions == 1) {
      out_row[d] = sum / l_all;
    } else {
      part_row[2 + d] = sum;
    }
  }
  if (num_partitions > 1 && threadIdx.x == 0) {
    part_row[0] = m_all;
    part_row[1] = l_all;
  }
}

// Merges the partitions of PagedAttentionDecodeKernel: one thread block per (head, sequence).
__global__ void DecodeCombineKernel(const float* partials, int32_t num_partitions,
                                    int32_t num_heads, int32_t head_dim, float* out,
                                    int32_t out_stride) {
  const int head = blockIdx.x, seq = blockIdx.y;
  const int64_t stride = head_dim + 2;
  const float* parts = partials + (int64_t{seq} * num_heads + head) * num_partitions * stride;
  float* out_row = out + int64_t{seq} * out_stride + int64_t{head} * head_dim;
  float m_all = -INFINITY;
  for (int p = 0; p < num_partitions; ++p) m_all = fmaxf(m_all, parts[p * stride]);
  if (m_all == -INFINITY) {  // an empty context: a zero row
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) out_row[d] = 0.0f;
    return;
  }
  float l_all = 0.0f;
  for (int p = 0; p < num_partitions; ++p)
    l_all += parts[p * stride + 1] * expf(parts[p * stride] - m_all);
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float sum = 0.0f;
    for (int p = 0; p < num_partitions; ++p)
      sum += parts[p * stride + 2 + d] * expf(parts[p * stride] - m_all);
    out_row[d] = sum / l_all;
  }
}

constexpr int kKeyChunk = 16;  // keys staged in shared memory at once (prefill)

// Prefill attention, one thread block per (tile, head): warp w owns the tile's w-th query
// token. The block stages kKeyChunk keys (K and V rows of the head's kv head) at a time in
// shared memory; every warp scores the staged keys its token may see (causal, sliding window)
// with an online softmax. The chunks cover the union of the tile's key ranges.
template <typename KvT>
__global__ void PagedAttentionPrefillKernel(PagedAttentionArgs a, const int32_t* positions,
                                            const int32_t* tiles) {
  __shared__ float k_s[kKeyChunk][kMaxHeadDim];
  __shared__ float v_s[kKeyChunk][kMaxHeadDim];

  const int tile = blockIdx.x, head = blockIdx.y;
  const int seq = tiles[3 * tile], first = tiles[3 * tile + 1], count = tiles[3 * tile + 2];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int head_dim = a.shape.head_dim, block_size = a.shape.block_size;
  const int num_kv_heads = a.shape.num_kv_heads;
  const int kv_head = head / (a.num_heads / num_kv_heads);
  const bool active = warp < count;
  const int t = first + min(warp, count - 1);
  const int32_t pos = positions[t];
  const int32_t window = a.sliding_window;
  const int32_t lo = window > 0 ? max(0, pos - window + 1) : 0;
  const int32_t tile_lo = window > 0 ? max(0, positions[first] - window + 1) : 0;
  const int32_t tile_hi = positions[first + count - 1];  // inclusive
  const KvT* layer_base = static_cast<const KvT*>(a.layer_base);
  const int32_t* table = a.block_tables + int64_t{seq} * a.max_blocks_per_seq;
  const int64_t block_elems = a.shape.BlockElements();
  const int64_t k_offset = int64_t{kv_head} * block_size * head_dim;
  const int64_t v_offset = int64_t{num_kv_heads + kv_head} * block_size * head_dim;

  const float* q_row = a.q + int64_t{t} * a.q_stride + int64_t{head} * head_dim;
  float qr[kMaxDimsPerLane], acc[kMaxDimsPerLane];
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    qr[i] = d < head_dim ? q_row[d] : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;

  for (int32_t chunk = tile_lo; chunk <= tile_hi; chunk += kKeyChunk) {
    const int n = min(kKeyChunk, tile_hi - chunk + 1);
    __syncthreads();  // every warp is done with the previous chunk
    for (int idx = threadIdx.x; idx < n * head_dim; idx += blockDim.x) {
      const int j = idx / head_dim, d = idx % head_dim;
      const int32_t p = chunk + j;
      const KvT* block = layer_base + int64_t{table[p / block_size]} * block_elems;
      const int64_t row = int64_t{p % block_size} * head_dim;
      k_s[j][d] = Load(block + k_offset + row, d);
      v_s[j][d] = Load(block + v_offset + row, d);
    }
    __syncthreads();
    if (!active) continue;
    for (int j = 0; j < n; ++j) {
      const int32_t p = chunk + j;
      if (p < lo || p > pos) continue;  // the same for the whole warp
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < kMaxDimsPerLane; ++i) {
        const int d = lane + 32 * i;
        if (d < head_dim) dot += qr[i] * k_s[j][d];
      }
      const float s = WarpSum(dot) * a.scale;
      const float m_new = fmaxf(m, s);
      const float correction = expf(m - m_new);
      const float pr = expf(s - m_new);
      l = l * correction + pr;
#pragma unroll
      for (int i = 0; i < kMaxDimsPerLane; ++i) {
        const int d = lane + 32 * i;
        if (d < head_dim) acc[i] = acc[i] * correction + pr * v_s[j][d];
      }
      m = m_new;
    }
  }
  if (!active) return;
  // l > 0: every token sees at least itself.
  float* out_row = a.out + int64_t{t} * a.out_stride + int64_t{head} * head_dim;
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < head_dim) out_row[d] = acc[i] / l;
  }
}

__global__ void AddRowBiasKernel(float* y, const float* bias, int32_t cols) {
  float* row = y + int64_t{blockIdx.x} * cols;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) row[c] += bias[c];
}

// Is (v, i) a better argmax than (best, best_i)? NaN never is; ties go to the lower id.
__device__ __forceinline__ bool Better(float v, int i, float best, int best_i) {
  return v > best || (v == best && i < best_i);
}

__global__ void ArgmaxKernel(const float* logits, int32_t vocab, int32_t* out_ids) {
  __shared__ float best_v[kThreads / 32];
  __shared__ int best_id[kThreads / 32];
  const float* row = logits + int64_t{blockIdx.x} * vocab;
  float best = -INFINITY;
  int best_i = INT_MAX;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = row[i];
    if (Better(v, i, best, best_i) && v > -INFINITY) {
      best = v;
      best_i = i;
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, best, offset);
    const int i = __shfl_xor_sync(0xffffffffu, best_i, offset);
    if (Better(v, i, best, best_i)) {
      best = v;
      best_i = i;
    }
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    best_v[warp] = best;
    best_id[warp] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) {
      if (Better(best_v[w], best_id[w], best, best_i)) {
        best = best_v[w];
        best_i = best_id[w];
      }
    }
    out_ids[blockIdx.x] = best_i == INT_MAX ? -1 : best_i;  // ArgmaxRow's "nothing usable"
  }
}

}  // namespace

// ---- launchers -----------------------------------------------------------------------------

size_t DTypeSize(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

// One block per copy; a batch rides in the launch's parameter space (__grid_constant__: read
// in place, not copied per thread).
struct RowCopyBatch {
  RowCopy copies[kRowCopiesPerLaunch];
};

__global__ void CopyRowsKernel(const __grid_constant__ RowCopyBatch batch) {
  const RowCopy& c = batch.copies[blockIdx.x];
  const char* src = static_cast<const char*>(c.src);
  char* dst = static_cast<char*>(c.dst);
  const bool vector = ((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) |
                        c.src_pitch | c.dst_pitch | c.width) & 15) == 0;
  if (vector) {
    const uint64_t per_row = c.width / 16, total = per_row * c.rows;
    for (uint64_t i = threadIdx.x; i < total; i += blockDim.x) {
      const uint64_t row = i / per_row, col = i % per_row;
      reinterpret_cast<uint4*>(dst + row * c.dst_pitch)[col] =
          reinterpret_cast<const uint4*>(src + row * c.src_pitch)[col];
    }
  } else {
    const uint64_t total = c.width * c.rows;
    for (uint64_t i = threadIdx.x; i < total; i += blockDim.x) {
      const uint64_t row = i / c.width, col = i % c.width;
      dst[row * c.dst_pitch + col] = src[row * c.src_pitch + col];
    }
  }
}

Status Convert(DType in_dtype, const void* in, DType out_dtype, void* out, int64_t n,
               cudaStream_t stream) {
  TANDEM_CHECK(n >= 0, "negative size");
  if (n == 0) return Status::Ok();
  DispatchDType(in_dtype, [&](auto* in_tag) {
    using In = std::remove_pointer_t<decltype(in_tag)>;
    DispatchDType(out_dtype, [&](auto* out_tag) {
      using Out = std::remove_pointer_t<decltype(out_tag)>;
      ConvertKernel<In, Out><<<GridFor(n, kThreads), kThreads, 0, stream>>>(
          static_cast<const In*>(in), static_cast<Out*>(out), n);
    });
  });
  return LaunchStatus();
}

Status RmsNorm(DType dtype, const void* x, const void* weight, void* out, int32_t num_tokens,
               int32_t hidden, float eps, cudaStream_t stream) {
  TANDEM_CHECK(num_tokens >= 0 && hidden > 0, "bad RmsNorm shape");
  if (num_tokens == 0) return Status::Ok();
  DispatchDType(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    RmsNormKernel<T><<<num_tokens, kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<T*>(out), hidden,
        eps);
  });
  return LaunchStatus();
}

Status Add(DType dtype, const void* a, const void* b, void* out, int64_t n,
           cudaStream_t stream) {
  TANDEM_CHECK(n >= 0, "negative size");
  if (n == 0) return Status::Ok();
  DispatchDType(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    AddKernel<T><<<GridFor(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), n);
  });
  return LaunchStatus();
}

Status SiluAndMul(DType dtype, const void* gate, const void* up, void* out, int32_t num_tokens,
                  int32_t inter, int32_t in_stride, cudaStream_t stream) {
  TANDEM_CHECK(num_tokens >= 0 && inter > 0 && in_stride >= inter, "bad SiluAndMul shape");
  if (num_tokens == 0) return Status::Ok();
  DispatchDType(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    SiluAndMulKernel<T><<<num_tokens, kThreads, 0, stream>>>(
        static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(out), inter,
        in_stride);
  });
  return LaunchStatus();
}

Status EmbeddingGather(DType dtype, const void* table, const int32_t* token_ids, void* out,
                       int32_t num_tokens, int32_t hidden, int32_t vocab, cudaStream_t stream) {
  TANDEM_CHECK(num_tokens >= 0 && hidden > 0 && vocab > 0, "bad EmbeddingGather shape");
  if (num_tokens == 0) return Status::Ok();
  DispatchDType(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    EmbeddingKernel<T><<<num_tokens, kThreads, 0, stream>>>(
        static_cast<const T*>(table), token_ids, static_cast<T*>(out), hidden, vocab);
  });
  return LaunchStatus();
}

Status Rope(DType dtype, void* q, void* k, const int32_t* positions, const float* inv_freq,
            int32_t num_tokens, int32_t num_heads, int32_t num_kv_heads, int32_t head_dim,
            int32_t q_stride, int32_t k_stride, cudaStream_t stream) {
  TANDEM_CHECK(num_tokens >= 0 && num_heads > 0 && head_dim > 0 && head_dim % 2 == 0,
               "bad Rope shape");
  TANDEM_CHECK(q_stride >= num_heads * head_dim, "q_stride smaller than a row");
  TANDEM_CHECK(k == nullptr || (num_kv_heads > 0 && k_stride >= num_kv_heads * head_dim),
               "bad k shape");
  if (num_tokens == 0) return Status::Ok();
  DispatchDType(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    RopeKernel<T><<<num_tokens, kThreads, 0, stream>>>(
        static_cast<T*>(q), static_cast<T*>(k), positions, inv_freq, num_heads, num_kv_heads,
        head_dim, q_stride, k_stride);
  });
  return LaunchStatus();
}

Status WriteKvCache(DType dtype, const void* k, const void* v, int32_t kv_stride,
                    DType kv_dtype, void* layer_base, const PagedKvShape& shape,
                    const int64_t* slot_mapping, int32_t num_tokens, cudaStream_t stream) {
  TANDEM_CHECK(num_tokens >= 0 && shape.num_kv_heads > 0 && shape.head_dim > 0 &&
                   shape.block_size > 0,
               "bad WriteKvCache shape");
  TANDEM_CHECK(kv_stride >= shape.num_kv_heads * shape.head_dim, "kv_stride smaller than a row");
  if (num_tokens == 0) return Status::Ok();
  DispatchDType(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    DispatchDType(kv_dtype, [&](auto* kv_tag) {
      using KvT = std::remove_pointer_t<decltype(kv_tag)>;
      WriteKvKernel<T, KvT><<<num_tokens, kThreads, 0, stream>>>(
          static_cast<const T*>(k), static_cast<const T*>(v), kv_stride,
          static_cast<KvT*>(layer_base), shape.num_kv_heads, shape.head_dim, shape.block_size,
          slot_mapping);
    });
  });
  return LaunchStatus();
}

namespace {
void CheckAttentionArgs(const PagedAttentionArgs& a) {
  TANDEM_CHECK(a.num_heads > 0 && a.shape.num_kv_heads > 0 && a.shape.block_size > 0 &&
                   a.max_blocks_per_seq > 0,
               "bad paged attention shape");
  TANDEM_CHECK(a.shape.head_dim > 0 && a.shape.head_dim <= kMaxHeadDim,
               "head_dim must be in [1, 256]");
  TANDEM_CHECK(a.num_heads % a.shape.num_kv_heads == 0,
               "num_heads must be a multiple of num_kv_heads");
  TANDEM_CHECK(a.q_stride >= a.num_heads * a.shape.head_dim &&
                   a.out_stride >= a.num_heads * a.shape.head_dim,
               "q_stride or out_stride smaller than a row");
}
}  // namespace

Status PagedAttentionDecode(const PagedAttentionArgs& args, const int32_t* seq_lens,
                            int32_t num_seqs, int32_t num_partitions, float* partials,
                            cudaStream_t stream) {
  CheckAttentionArgs(args);
  TANDEM_CHECK(num_seqs >= 0 && num_partitions >= 1, "bad PagedAttentionDecode shape");
  TANDEM_CHECK(num_partitions == 1 || partials != nullptr, "more than one partition needs partials");
  TANDEM_CHECK(num_seqs <= 65535 && num_partitions <= 65535,  // gridDim.y and .z
               "PagedAttentionDecode: over 65535 sequences or partitions");
  if (num_seqs == 0) return Status::Ok();
  const dim3 grid(args.num_heads, num_seqs, num_partitions);
  DispatchDType(args.kv_dtype, [&](auto* tag) {
    using KvT = std::remove_pointer_t<decltype(tag)>;
    PagedAttentionDecodeKernel<KvT><<<grid, kAttnThreads, 0, stream>>>(args, seq_lens,
                                                                        num_partitions, partials);
  });
  TANDEM_RETURN_IF_ERROR(LaunchStatus());
  if (num_partitions == 1) return Status::Ok();
  DecodeCombineKernel<<<dim3(args.num_heads, num_seqs), kThreads, 0, stream>>>(
      partials, num_partitions, args.num_heads, args.shape.head_dim, args.out, args.out_stride);
  return LaunchStatus();
}

Status PagedAttentionPrefill(const PagedAttentionArgs& args, const int32_t* positions,
                             const int32_t* tiles, int32_t num_tiles, cudaStream_t stream) {
  CheckAttentionArgs(args);
  static_assert(kPrefillTileTokens == kAttnWarps, "a prefill tile has one token per warp");
  TANDEM_CHECK(num_tiles >= 0, "negative tile count");
  TANDEM_CHECK(args.num_heads <= 65535, "PagedAttentionPrefill: over 65535 heads");  // gridDim.y
  if (num_tiles == 0) return Status::Ok();
  const dim3 grid(num_tiles, args.num_heads);
  DispatchDType(args.kv_dtype, [&](auto* tag) {
    using KvT = std::remove_pointer_t<decltype(tag)>;
    PagedAttentionPrefillKernel<KvT><<<grid, kAttnThreads, 0, stream>>>(args, positions, tiles);
  });
  return LaunchStatus();
}

Status AddRowBias(float* y, const float* bias, int32_t rows, int32_t cols, cudaStream_t stream) {
  TANDEM_CHECK(rows >= 0 && cols > 0, "bad AddRowBias shape");
  if (rows == 0) return Status::Ok();
  AddRowBiasKernel<<<rows, kThreads, 0, stream>>>(y, bias, cols);
  return LaunchStatus();
}

Status ArgmaxRows(const float* logits, int32_t num_rows, int32_t vocab, int32_t* out_ids,
                  cudaStream_t stream) {
  TANDEM_CHECK(num_rows >= 0 && vocab > 0, "bad ArgmaxRows shape");
  if (num_rows == 0) return Status::Ok();
  ArgmaxKernel<<<num_rows, kThreads, 0, stream>>>(logits, vocab, out_ids);
  return LaunchStatus();
}

Status CopyRowsBatch(const RowCopy* copies, size_t count, cudaStream_t stream) {
  for (size_t first = 0; first < count; first += kRowCopiesPerLaunch) {
    const size_t n = std::min(kRowCopiesPerLaunch, count - first);
    RowCopyBatch batch{};
    std::copy(copies + first, copies + first + n, batch.copies);
    CopyRowsKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(batch);
    TANDEM_RETURN_IF_ERROR(LaunchStatus());
  }
  return Status::Ok();
}

}  // namespace tandem::cuda
