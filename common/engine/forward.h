// The CPU forward pass of a Llama-family decoder over a paged KV cache.
//
// One call runs ONE forward pass for a batch of sequences. Each sequence brings its new tokens
// (a prefill chunk or a single decode token; any mix in one batch, no padding), the position of
// its first new token, and its block table. The pass writes the new tokens' K (after RoPE) and V
// into the cache, attends over positions [0, position] of each token (causal; Mistral sliding
// window when configured), and returns the logits of the last token of each sequence (or of
// every new token, for tests).
//
// Compute is fp32 over fp32, bf16 or f16 weights (Model::dtype): decode batches (up to 64 rows)
// through the streaming kernels of linear_kernels.h, split by output rows over the instance's
// thread pool; prefill through OpenBLAS cblas_sgemm (bf16/f16 weights widened a panel at a
// time). TANDEM_KERNEL_ISA forces a kernel path (linear_kernels.h). RMSNorm, RoPE (incl. llama3 and
// linear scaling), GQA attention over paged blocks multi-threaded over (sequence, kv head, chunk
// of tokens) on the instance's own thread pool, SwiGLU, qkv/o bias, tied embeddings.
//
// Memory: every workspace is sized at Create for ForwardOptions::max_batch_tokens and
// max_batch_sequences; Forward allocates nothing (except, once, when LogitsMode::kAllTokens
// needs more room than the last-token buffer).
//
// Threads: a CpuForward belongs to one engine thread; Forward is not reentrant. The Model must
// outlive it. openblas_set_num_threads is process-wide: Create sets it to num_threads, so
// instances in one process should agree on the count.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "common/engine/forward_backend.h"
#include "common/engine/kv_cache.h"
#include "common/engine/linear_kernels.h"
#include "common/model/model.h"
#include "common/base/status.h"
#include "common/base/thread_pool.h"

namespace tandem {

class CpuForward final : public ForwardBackend {
 public:
  // InvalidArgument when the options or the model's shape are out of range (head_dim > 256).
  static StatusOr<std::unique_ptr<CpuForward>> Create(const Model& model,
                                                      const ForwardOptions& options);

  CpuForward(const CpuForward&) = delete;
  CpuForward& operator=(const CpuForward&) = delete;

  // The KV layout this model needs, with the given block size.
  KvLayout MakeKvLayout(int block_size = kDefaultBlockSize) const override;
  // Heap memory (AllocateKvPoolMemory).
  StatusOr<KvPoolMemory> AllocateKvPool(size_t bytes) override;

  // Runs one forward pass. Returns row-major logits: [batch.size(), vocab] for kLastToken, or
  // [total new tokens, vocab] (sequences in order) for kAllTokens. The span points into a buffer
  // owned by this object, valid until the next call.
  // Errors (nothing is written to the cache then): InvalidArgument for an empty sequence, a
  // token id outside the vocabulary, a block table that does not cover the positions or names a
  // block outside the pool, a cache whose layout does not match the model; TooLarge when the
  // batch exceeds max_batch_tokens or max_batch_sequences.
  // `hooks` (optional, not kept) see ForwardHooks; they do not change the result.
  // `greedy` (optional) see GreedyRows: on the CPU the logits are always returned as well.
  StatusOr<std::span<const float>> Forward(std::span<const SequenceInput> batch, KvCache& cache,
                                           LogitsMode mode = LogitsMode::kLastToken,
                                           const ForwardHooks* hooks = nullptr,
                                           GreedyRows* greedy = nullptr) override;

  const Model& model() const override { return model_; }
  std::string description() const override { return "cpu"; }
  int num_threads() const { return pool_.num_threads(); }

 private:
  struct AttentionTask {
    int32_t seq;
    int32_t kv_head;
    int32_t token_begin;  // global token indices [begin, end)
    int32_t token_end;
  };
  struct Buffer {  // 64-byte aligned float array
    struct Free {
      void operator()(float* p) const;
    };
    std::unique_ptr<float[], Free> data;
    size_t size = 0;
    void Resize(size_t n);
    float* get() const { return data.get(); }
  };

  CpuForward(const Model& model, const ForwardOptions& options);
  // y[m, w.rows] = x[m, w.cols] w^T + beta y, on the pool (small m) or OpenBLAS (large m).
  void Linear(const float* x, int m, const WeightMatrix& w, float* y, float beta);
  void Attention(int layer, std::span<const SequenceInput> batch, KvCache& cache);
  // Token bookkeeping, embeddings, RoPE angles and attention tasks of a batch; returns its
  // number of tokens.
  int PrepareBatch(std::span<const SequenceInput> batch);
  // x += in[m, w.cols] w^T: one GEMM into the residual, or, with an all_reduce hook, the
  // partial sum into xn_ (free at both call sites), reduced over the ranks, then added.
  void ResidualLinear(const float* in, int m, const WeightMatrix& w, const ForwardHooks* hooks);

  const Model& model_;
  ForwardOptions options_;
  ThreadPool pool_;
  KernelIsa isa_ = KernelIsa::kScalar;
  bool use_avx2_ = false;  // attention kernels
  int panel_rows_ = 0;     // rows of a widened weight panel (bf16/f16 prefill)
  std::vector<float> inv_freq_;  // [head_dim / 2]

  // Workspace, sized for max_batch_tokens / max_batch_sequences.
  Buffer x_, xn_, qkv_, attn_, mlp_, act_, cos_, sin_, last_, logits_, panel_;
  std::vector<int32_t> token_seq_;       // [T] sequence of each token
  std::vector<int32_t> token_pos_;       // [T] position of each token
  std::vector<int32_t> seq_first_token_; // [S + 1]
  std::vector<AttentionTask> tasks_;
};

}  // namespace tandem
