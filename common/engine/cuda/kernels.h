// CUDA kernels of the Llama forward pass, as plain launch functions.
//
// Includable from plain C++: pointers are void* (their element type given by a DType) or typed
// host-language types; streams are cudaStream_t (forward-declared in cuda_util.h).
//
// Contract shared by every function here:
// - All pointers are device pointers, except where a parameter says host.
// - Work is queued on `stream` and the function returns at once; results are visible after
//   the stream is synchronised. Buffers must stay alive until then.
// - Arithmetic is fp32 whatever the storage type (bf16 values are widened on load and rounded
//   to nearest even on store), so fp32 storage matches the CPU backend to rounding.
// - Shapes that break the contract (negative sizes, head_dim > 256, num_heads not a multiple of
//   num_kv_heads) are bugs: TANDEM_CHECK aborts. The returned Status reports a failed launch
//   (Internal), which in practice means the device is in a bad state.
// - Zero-sized work launches nothing and returns OK.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/engine/cuda/cuda_util.h"
#include "common/engine/row_copy.h"
#include "common/engine/row_draw.h"
#include "common/engine/score_edits.h"
#include "common/base/status.h"

namespace tandem::cuda {

enum class DType { kF32, kBF16 };

size_t DTypeSize(DType dtype);

// out[n] = dtype_out(in[n]); kF32 <-> kBF16 (same types copy).
Status Convert(DType in_dtype, const void* in, DType out_dtype, void* out, int64_t n,
               cudaStream_t stream);

// out[t][i] = x[t][i] / sqrt(mean_i(x[t][i]^2) + eps) * weight[i], for t < num_tokens,
// i < hidden. x, weight and out share `dtype`; out may alias x.
Status RmsNorm(DType dtype, const void* x, const void* weight, void* out, int32_t num_tokens,
               int32_t hidden, float eps, cudaStream_t stream);

// out[n] = a[n] + b[n] (the residual add); out may alias a or b.
Status Add(DType dtype, const void* a, const void* b, void* out, int64_t n, cudaStream_t stream);

// out[t][i] = silu(gate[t*in_stride + i]) * up[t*in_stride + i], out row stride = inter.
// A fused [gate | up] projection passes up = gate + inter elements and in_stride = 2 * inter.
Status SiluAndMul(DType dtype, const void* gate, const void* up, void* out, int32_t num_tokens,
                  int32_t inter, int32_t in_stride, cudaStream_t stream);

// out[t][:] = table[token_ids[t]][:] (rows of `hidden`). An id outside [0, vocab) is a bug the
// kernel cannot report: it writes a zero row instead of reading out of bounds.
Status EmbeddingGather(DType dtype, const void* table, const int32_t* token_ids, void* out,
                       int32_t num_tokens, int32_t hidden, int32_t vocab, cudaStream_t stream);

// Rotary embedding in place, HF rotate_half convention: for each head, pairs (i, i + half),
// half = head_dim / 2, angle = float(position) * inv_freq[i] in fp32, cos/sin of it in double
// rounded to fp32 (as the CPU backend does). inv_freq[half] is precomputed by the caller with
// any scaling applied (llama3, linear). q row t starts at q + t * q_stride elements and holds
// num_heads heads of head_dim; k likewise with num_kv_heads (k may be null for q only).
Status Rope(DType dtype, void* q, void* k, const int32_t* positions, const float* inv_freq,
            int32_t num_tokens, int32_t num_heads, int32_t num_kv_heads, int32_t head_dim,
            int32_t q_stride, int32_t k_stride, cudaStream_t stream);

// Paged KV layout of one layer (common/engine/kv_cache.h): block b starts at
// layer_base + b * 2 * num_kv_heads * block_size * head_dim elements and holds
// [kv: K, V][kv_head][slot < block_size][head_dim].
#ifdef __CUDACC__
#define TANDEM_HOST_DEVICE __host__ __device__
#else
#define TANDEM_HOST_DEVICE
#endif
struct PagedKvShape {
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 0;
  TANDEM_HOST_DEVICE int64_t BlockElements() const {
    return int64_t{2} * num_kv_heads * block_size * head_dim;
  }
};

// Writes K and V of num_tokens new tokens into the cache: token t goes to slot
// slot_mapping[t] = block * block_size + offset. k/v row t starts at t * kv_stride elements and
// holds num_kv_heads * head_dim values of `dtype`; the cache holds `kv_dtype`. A negative slot
// skips the token (padding).
Status WriteKvCache(DType dtype, const void* k, const void* v, int32_t kv_stride,
                    DType kv_dtype, void* layer_base, const PagedKvShape& shape,
                    const int64_t* slot_mapping, int32_t num_tokens, cudaStream_t stream);

// What both paged attention kernels read. Queries and outputs are fp32 rows: token t's query
// is at q + t * q_stride (num_heads heads of head_dim; a row of the fused qkv buffer), its
// output at out + t * out_stride. block_tables: [num_seqs][max_blocks_per_seq]. GQA: head h
// reads kv head h / (num_heads / num_kv_heads). Token at position p attends over the keys of
// its sequence at positions [lo, p], lo = max(0, p - sliding_window + 1) when sliding_window > 0
// (Mistral), else 0; softmax(q.K^T * scale) V with an online softmax in fp32.
// head_dim <= 256 and num_heads % num_kv_heads == 0 (checked).
struct PagedAttentionArgs {
  const float* q = nullptr;
  int32_t q_stride = 0;
  DType kv_dtype = DType::kF32;
  const void* layer_base = nullptr;
  PagedKvShape shape;
  const int32_t* block_tables = nullptr;
  int32_t max_blocks_per_seq = 0;
  int32_t num_heads = 0;
  int32_t sliding_window = 0;
  float scale = 1.0f;
  float* out = nullptr;
  int32_t out_stride = 0;
};

// Keys one decode partition covers: a sequence's context is split into partitions of this many
// tokens, each scored by its own thread block, then merged (split-K over long contexts).
inline constexpr int32_t kDecodePartitionTokens = 512;
// The partitions a context of up to max_context tokens needs (at least 1).
inline int32_t DecodePartitions(int64_t max_context) {
  return static_cast<int32_t>(std::max<int64_t>(
      1, (max_context + kDecodePartitionTokens - 1) / kDecodePartitionTokens));
}
// Floats of the `partials` workspace PagedAttentionDecode needs.
inline int64_t DecodePartialFloats(int32_t num_seqs, int32_t num_heads, int32_t head_dim,
                                   int32_t num_partitions) {
  return int64_t{num_seqs} * num_heads * num_partitions * (head_dim + 2);
}

// Decode attention: one query token per sequence; sequence s's query is row s, and it attends
// over the seq_lens[s] cached tokens (its own K/V already written; position seq_lens[s] - 1).
// The context is split into num_partitions partitions of kDecodePartitionTokens (the partitions
// past a sequence's length do nothing, so a captured graph may fix the count for the longest
// context); with more than one, `partials` (DecodePartialFloats) holds each partition's running
// max, sum and weighted V sum until a second kernel merges them. seq_lens[s] == 0 gives a zero
// row (padding).
Status PagedAttentionDecode(const PagedAttentionArgs& args, const int32_t* seq_lens,
                            int32_t num_seqs, int32_t num_partitions, float* partials,
                            cudaStream_t stream);

// Query tokens per prefill tile: a tile is up to this many tokens of one sequence at
// consecutive positions, which share the K/V rows staged in shared memory (flash-style tiling:
// each key chunk is read from the pool once per tile, not once per query).
inline constexpr int32_t kPrefillTileTokens = 8;

// Prefill (and mixed) attention over a batch of query tokens of many sequences of different
// lengths: tiles[i] = {sequence, first token, token count <= kPrefillTileTokens} (device
// memory, [num_tiles][3]); positions[t]: token t's position (causal: it attends up to itself).
// Every token's own K/V must already be in the cache.
Status PagedAttentionPrefill(const PagedAttentionArgs& args, const int32_t* positions,
                             const int32_t* tiles, int32_t num_tiles, cudaStream_t stream);

// y[r][c] += bias[c] for r < rows, c < cols (fp32).
Status AddRowBias(float* y, const float* bias, int32_t rows, int32_t cols, cudaStream_t stream);

// Greedy sampling: out_ids[r] = argmax of logits[r][0..vocab), lowest id on ties, NaN never
// chosen (as tandem::Sampler with temperature 0 and no penalties). A row with no number gives -1
// (as ArgmaxRow).
Status ArgmaxRows(const float* logits, int32_t num_rows, int32_t vocab, int32_t* out_ids,
                  cudaStream_t stream);

// y[m][n] = x[m][k] . w[n][k]^T + beta * y (row-major, a linear layer with HF weight layout),
// through cublasGemmEx with fp32 accumulation (CUBLAS_COMPUTE_32F). x and w share in_dtype
// (kBF16 is the fast path; kF32 for checks), y is out_dtype. The handle must already be on the
// stream the caller wants (CublasHandle::SetStream). beta = 0: y is overwritten; beta = 1 adds
// into it (the residual).
Status Gemm(const CublasHandle& handle, DType in_dtype, const void* x, const void* w,
            DType out_dtype, void* y, int32_t m, int32_t n, int32_t k, float beta = 0.0f);

// Runs `count` strided copies given in HOST memory (common/engine/row_copy.h), one thread block per
// copy, kRowCopiesPerLaunch copies per launch passed as the launch's parameters (no upload): a re-
// shard's thousands of small strided copies as a few launches instead of one cudaMemcpy2DAsync (a
// few microseconds of host time each). Pointers are any memory this device can address (its own, or
// a peer's mapped through CUDA IPC with peer access). Destinations must not overlap. 16-byte loads
// and stores where a copy's addresses, pitches and width are multiples of 16.
inline constexpr size_t kRowCopiesPerLaunch = 64;
Status CopyRowsBatch(const RowCopy* copies, size_t count, cudaStream_t stream);

// Draws the token of each row whose draws[i].draw is set (kRowDrawn; kRowArgmax: the row's argmax,
// for its logprobs), from logits [num_rows, vocab], into
// out_ids[i] (-1 when no logit of the row is usable), and for a drawn row with
// draws[i].top_logprobs >= 0 its logprobs into out_logprobs[i] (when not null); the other
// rows' entries are left alone. DrawRow's algorithm (common/engine/row_draw.h, its host
// reference), one thread block a row: the Sampler's token and raw logprobs for the rows
// Sampler::NextRowDraw describes, without copying their logits to the host. `draws`,
// `out_ids` and `out_logprobs` [num_rows] in device memory. (draw_rows.cu)
Status DrawRows(const float* logits, int32_t num_rows, int32_t vocab, const RowDraw* draws,
                int32_t* out_ids, RowLogprobs* out_logprobs, cudaStream_t stream);

// Applies each row's score edits (common/engine/score_edits.h: logit_bias, the min_tokens mask,
// the penalties) to logits [num_rows, vocab] in place: row r's are edits[edit_begin[r],
// edit_begin[r + 1]), token ids checked by the caller (ValidateScoreEdits). The host's
// ApplyScoreEdits bit for bit, so that ArgmaxRows or DrawRows after it pick the Sampler's
// token. `edits` and `edit_begin` [num_rows + 1] in device memory. (score_edits.cu)
Status ApplyScoreEdits(float* logits, int32_t num_rows, int32_t vocab, const ScoreEdit* edits,
                       const int32_t* edit_begin, cudaStream_t stream);

}  // namespace tandem::cuda
