// The CUDA forward pass: the ForwardBackend (common/engine/forward_backend.h) of `device: cuda`.
//
// The same pass as CpuForward, on device 0 of the process (CUDA_VISIBLE_DEVICES picks it):
// - Weights in device memory: bf16 when the model is stored as bf16 or f16 (f16 is rounded to
//   bf16 on upload: the GEMMs take one 16-bit type), fp32 when it is fp32 (for checks against the
//   CPU backend: the same arithmetic, tokens equal). Norms and biases fp32.
// - Activations and the residual stream fp32; a projection's input is rounded to the weights'
//   dtype just before its cuBLAS GEMM (fp32 accumulation); o_proj and down_proj add into the
//   residual in the GEMM (beta = 1).
// - The KV pool in device memory with the CPU pool's block layout (AllocateKvPool), its values
//   fp32 as on the CPU or bf16 (ForwardOptions::kv_dtype, from kv_cache.dtype: half the bytes a
//   token), written by WriteKvCache (rounding fp32 K/V once); attention reads them back to fp32
//   and is PagedAttentionPrefill (tiles of consecutive tokens, any mix of
//   sequences and lengths) or, for batches of one token per sequence, PagedAttentionDecode split
//   into partitions of kDecodePartitionTokens.
// - Decode steps without hooks are captured as CUDA graphs, one per batch size of
//   DecodeGraphSizes (padded up to it) and decode-attention partitions for the batch's longest
//   context (DecodeGraphShapeFor: powers of two), on first use (after one eager run of that
//   pass, to warm cuBLAS and CUDA's lazy module loading up), and replayed: a step is then one
//   launch.
// - Every last-token pass also takes each row's argmax on the device (ArgmaxRows): rows whose
//   next token is the plain argmax (GreedyRows) need nothing else, and when all rows are such,
//   the logits are not copied back at all (the ids are: 4 bytes a row).
// - Rows that need nothing but their logits and a few numbers (temperature, top-k, top-p,
//   min-p: Sampler::NextRowDraw, GreedyRows::draws) are drawn on the device too (DrawRows,
//   DrawRow's algorithm: the Sampler's token up to rounding at a cut), after the pass and its
//   graph, over those rows' argmax ids: their logits are not copied back either. Raw logprobs
//   (the default mode) come with the draw; greedy rows that want them are "drawn" as their
//   argmax (kRowArgmax) for them.
// - Rows with logit_bias, penalties or a min_tokens mask and no logprobs get their score edits
//   (GreedyRows::edits: a few entries a row, uploaded) applied on the device first
//   (ApplyScoreEdits, bit for bit the host's), then the argmax of every row is taken again and
//   the draws made: those rows stay on the device too.
// - The other rows (logprobs with edits, processed logprobs) have their logits copied to the
//   host (page-locked memory) and the engine samples them there with the host Sampler, which
//   does every field and is what the CPU backend is checked against. Why not all on the host: the copy is vocab * 4 bytes a row (SmolLM2: 192 KiB; Llama 3: 500 KiB),
//   12-32 MiB for a 64-sequence step, 0.5-1.3 ms at PCIe 5 rates, and the sampling costs more
//   (perf/README.md, Host sampling: one thread of a 2-core VM, vocab 49152: greedy 62 us a
//   row, temperature 0.4 ms, top-p 1.4 ms): at batch 64, longer than a small model's decode
//   step on an H100. Those rows are sampled on S.threads host threads at once (BatchSampling,
//   common/engine/batch_sampling.h).
//
// Tensor parallelism (CudaRank::clique, set by TpCudaForward): the model is one rank's shard
// (common/engine/tensor_parallel.h); o_proj and down_proj write their partial sums into a
// scratch buffer, NCCL sums it over the ranks in place on this pass's stream, and it is added to
// the residual (o_bias after). Such a pass is never captured as a graph: NCCL can capture its
// collectives, but its guide warns that several GPUs per process with graph capture may
// deadlock (a cudaGraphLaunch may block), and requires every rank to replay the same capture;
// TpForward drives all ranks from one process, so its decode steps run eagerly (one process
// per GPU would lift this). Its stream waits are bounded by CudaRank::sync_timeout.
//
// The hooks run on the host: before_layer(l) before layer l's work is queued (so a KV layer
// landed by then is read); after_layer(l) after the stream finished layer l's attention and
// o_proj (one synchronisation per layer, only when after_layer is set; with a clique, every
// rank's K/V of the layer are written by then: the o_proj sum waited for all of them).
// all_reduce is the CPU backend's tensor parallelism over host buffers: refused here.
//
// Threads: one engine thread calls Forward; it makes the device current for itself each call.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/engine/cuda/cuda_util.h"
#include "common/engine/cuda/kernels.h"
#include "common/engine/cuda/nccl_clique.h"
#include "common/engine/device_batch.h"
#include "common/engine/device_memory.h"
#include "common/engine/forward_backend.h"

namespace tandem::cuda {

// Where a CudaForward computes, and its place in a tensor-parallel instance.
struct CudaRank {
  int device = 0;                // CUDA ordinal, of what CUDA_VISIBLE_DEVICES shows
  NcclClique* clique = nullptr;  // set: rank `rank` of this clique (not owned; outlives the pass)
  int rank = 0;
  bool returns_logits = true;    // false: no final norm, LM head or argmax (Forward: empty span)
  std::chrono::milliseconds sync_timeout{0};  // > 0: bounds each wait for the stream
};

class CudaForward final : public ForwardBackend {
 public:
  // Unavailable when no CUDA device is visible; InvalidArgument when `where.device` is not one
  // or for options or a model shape out of range (head_dim > 256, odd head_dim);
  // ResourceExhausted when the weights and workspaces do not fit.
  static StatusOr<std::unique_ptr<CudaForward>> Create(const Model& model,
                                                       const ForwardOptions& options,
                                                       const CudaRank& where = {});
  ~CudaForward() override;

  KvLayout MakeKvLayout(int block_size = kDefaultBlockSize) const override;
  // Device memory, zeroed (kind kCudaDevice).
  StatusOr<KvPoolMemory> AllocateKvPool(size_t bytes) override;
  // `greedy`: the argmax of every last-token row is computed on the device (ArgmaxRows, in the
  // captured graphs too); only the wanted rows' ids come back when every row is wanted.
  StatusOr<std::span<const float>> Forward(std::span<const SequenceInput> batch, KvCache& cache,
                                           LogitsMode mode = LogitsMode::kLastToken,
                                           const ForwardHooks* hooks = nullptr,
                                           GreedyRows* greedy = nullptr) override;
  const Model& model() const override { return model_; }
  bool draws_rows() const override { return true; }  // cuda::DrawRows
  std::string description() const override { return description_; }

  // Whether the last Forward replayed a captured decode graph (for checks and benchmarks).
  bool last_pass_used_graph() const { return last_pass_used_graph_; }
  // Device bytes of the weights as uploaded.
  size_t weight_bytes() const { return weights_.size(); }

 private:
  struct DeviceLayer {
    const float* input_norm = nullptr;
    const void* qkv = nullptr;
    const float* qkv_bias = nullptr;
    const void* o = nullptr;
    const float* o_bias = nullptr;
    const float* post_norm = nullptr;
    const void* gate_up = nullptr;
    const void* down = nullptr;
  };
  struct Graph {
    const std::byte* pool = nullptr;  // the KV pool it was captured over
    int num_blocks = 0;
    CudaGraph exec;
    bool warmed = false;  // this size's pass has run once eagerly (RunGraph)
  };

  CudaForward(const Model& model, const ForwardOptions& options, const CudaRank& where);
  // Waits for the stream: bounded by where_.sync_timeout when set.
  Status SyncStream() const;
  Status UploadWeights();
  Status AllocateWorkspaces();
  // Copies batch_'s arrays into inputs_ (through the page-locked mirror) on stream_.
  Status UploadInputs();
  // Forward after its checks: the pass, the rows' edits, draws and copies, one synchronisation.
  // On an error it returns at once; Forward then waits for what was queued.
  StatusOr<std::span<const float>> RunOnDevice(std::span<const SequenceInput> batch,
                                               KvCache& cache, LogitsMode mode,
                                               const ForwardHooks* hooks, GreedyRows* greedy,
                                               int64_t max_len);
  // Queues the rows' score edits (GreedyRows::edits) on logits_ and the argmax of every row
  // after them (edits_ grows to hold them: a cudaMalloc, rare).
  Status EnqueueScoreEdits(const GreedyRows& greedy, int32_t rows);
  // Queues the pass over batch_ on stream_: embeddings, every layer, the final norm and the LM
  // head into logits_ (rows: `logits_rows` last tokens, or every token). No host
  // synchronisation unless hooks->after_layer is set; none at all when hooks is null.
  // Decode attention splits each context into `partitions` (DecodePartitions).
  Status EnqueuePass(KvCache& cache, LogitsMode mode, const ForwardHooks* hooks,
                     int32_t partitions);
  // Rounds n fp32 values to the weights' dtype in lowp_ (or returns src when they are fp32).
  StatusOr<const void*> ToWeightDType(const float* src, int64_t n);
  // Replays the decode graph of this batch size and partition count over batch_ (already
  // uploaded), capturing it first where there is none for this pool.
  Status RunGraph(int32_t graph_size, int32_t partitions, KvCache& cache);
  // x_ += in[tokens, k] w^T (o_proj, down_proj): one GEMM, or with a clique this rank's partial
  // sum, all-reduced, then added.
  Status AddProjection(const void* in, const void* w, int32_t k, int32_t tokens);

  template <typename T>
  T* Input(size_t offset) const {
    return reinterpret_cast<T*>(static_cast<std::byte*>(inputs_.data()) + offset);
  }

  const Model& model_;
  ForwardOptions options_;
  CudaRank where_;
  std::string description_;
  DType wdtype_ = DType::kBF16;
  int32_t graph_partitions_ = 1;  // the most decode partitions of graph passes: max_model_len
  int32_t block_size_ = 0;        // of the pool the graphs were captured for
  std::vector<int32_t> graph_sizes_;
  // By batch size and DecodeGraphShape::partitions (which fixes the block-table rows too).
  std::map<std::pair<int32_t, int32_t>, Graph> graphs_;
  bool last_pass_used_graph_ = false;

  CudaStream stream_;
  CublasHandle cublas_;
  DeviceBuffer cublas_workspace_;
  DeviceBuffer weights_;
  std::vector<DeviceLayer> layers_;
  const void* embed_ = nullptr;
  const void* lm_head_ = nullptr;
  const float* final_norm_ = nullptr;
  DeviceBuffer inv_freq_;

  DeviceBatch batch_;
  CudaInputSlots slots_;  // offsets of one batch's inputs (DeviceBatch's arrays) in inputs_
  DeviceBuffer inputs_;
  PinnedHostBuffer inputs_host_;
  // Workspaces, sized for max_batch_tokens / max_batch_sequences at Create.
  DeviceBuffer x_, xn_, qkv_, attn_, mlp_, act_, lowp_, last_, partials_, logits_;
  PinnedHostBuffer logits_host_;
  DeviceBuffer argmax_;          // [max_batch_sequences] ids: ArgmaxRows of the last-token rows
  PinnedHostBuffer argmax_host_;  // (DrawRows' ids over them for the drawn rows)
  DeviceBuffer draws_;            // [max_batch_sequences] RowDraw: GreedyRows::draws
  PinnedHostBuffer draws_host_;
  DeviceBuffer logprobs_;         // [max_batch_sequences] RowLogprobs of the drawn rows
  PinnedHostBuffer logprobs_host_;
  DeviceBuffer edit_begin_;       // [max_batch_sequences + 1]: GreedyRows::edit_begin
  PinnedHostBuffer edit_begin_host_;
  DeviceBuffer edits_;            // [edits_capacity_] ScoreEdit: GreedyRows::edits
  PinnedHostBuffer edits_host_;
  size_t edits_capacity_ = 0;
  size_t logits_rows_capacity_ = 0;
};

}  // namespace tandem::cuda
