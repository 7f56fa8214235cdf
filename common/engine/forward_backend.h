// The engine's backend seam: one forward pass of a Llama-family decoder over a paged KV cache,
// on the CPU (CpuForward, common/engine/forward.h) or a CUDA device (CudaForward,
// common/engine/cuda/cuda_forward.h). The engines (prefill, decode, colocated) hold a
// ForwardBackend and never learn which one runs.
//
// Both backends share everything that is not arithmetic: the batch they are given
// (SequenceInput), its checks (ValidateForwardBatch), the RoPE frequencies, the KV block layout
// (common/engine/kv_cache.h; on a device the pool has the same bytes in device memory) and the
// flat arrays a device pass reads (common/engine/device_batch.h). Sampling is the engines'
// (common/engine/sampling.h) on host logits for both: see CudaForward for why.
//
// `device` (S.device in the config): "cpu" or "cuda" (device 0 of what CUDA_VISIBLE_DEVICES
// shows, or devices 0..t-1 with ForwardOptions::tensor_parallel t: common/engine/tp_forward.h;
// a process is one instance). A build without CUDA refuses "cuda" with a message.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"
#include "common/engine/kv_cache.h"
#include "common/engine/row_draw.h"
#include "common/engine/score_edits.h"
#include "common/model/model.h"

namespace tandem {

struct SequenceInput {
  std::span<const int32_t> tokens;       // the new tokens; at least one
  int32_t start_position = 0;            // position of tokens[0]; KV of [0, start) is cached
  std::span<const int32_t> block_table;  // covers positions [0, start + tokens.size())
};

struct ForwardOptions {
  int num_threads = 1;             // CPU worker threads (the CUDA backend uses one host thread)
  int max_batch_tokens = 2048;     // sum of new tokens over a batch
  int max_batch_sequences = 256;
  // CUDA: the longest sequence (model.max_model_len), which sizes the block tables the
  // captured decode graphs read. 0: the model's max_position_embeddings.
  int max_model_len = 0;
  // CUDA: capture decode steps (one token per sequence, no hooks) as CUDA graphs.
  bool cuda_graphs = true;
  // S.tensor_parallel: ranks of one instance (CUDA: GPUs 0..t-1 of the process, NCCL between
  // them; common/engine/tp_forward.h). The CPU backend serves 1 only.
  int tensor_parallel = 1;
  // Tensor parallelism: bounds a rank's wait for the others (the layer gate; on CUDA each wait
  // for a stream that runs collectives). A pass past it fails with DeadlineExceeded and breaks
  // the instance. Longer than any before_layer hook waits (decode: a pulled KV layer).
  std::chrono::milliseconds collective_timeout{60000};
  // kv_cache.dtype (ResolvedKvDType): the values of the KV pools MakeKvLayout describes. The
  // CPU backend keeps float32 only (CreateForwardBackend refuses bfloat16 on cpu).
  KvDType kv_dtype = KvDType::kFloat32;
};

enum class LogitsMode { kLastToken, kAllTokens };

// Optional per-layer hooks for one Forward call, run on the calling thread (layer-wise KV
// streaming: decode waits for a pulled layer, prefill announces a computed one).
//   before_layer(l): before layer l reads or writes any KV of the cache.
//   after_layer(l):  after layer l's K/V of every token of the batch are in the cache (on a
//                    device: the copy engine may read them now).
// Both run for l = 0, 1, ..., num_layers - 1 in order; either may be empty. They must not call
// back into the backend. They run only when validation passed.
//
// all_reduce (tensor parallelism, common/engine/tp_forward.h; CPU ranks): when set, the
// model is one rank's shard, and the outputs of the row-parallel projections (o_proj and
// down_proj) are partial sums. Each layer then calls all_reduce(data, count) twice, after o_proj
// and after down_proj, with the partial sums of the batch ([tokens, hidden] row major, count =
// tokens * hidden) before they are added to the residual; it must replace them by their sum
// over the ranks (every rank the same values, so that the ranks' residual streams stay equal).
// o_bias is added after it. Unset, each projection adds straight into the residual (one fused
// GEMM). It cannot report an error: a collective that fails records it where its owner finds
// it, and the pass's result is then meaningless.
struct ForwardHooks {
  std::function<void(int layer)> before_layer;
  std::function<void(int layer)> after_layer;
  std::function<void(float* data, size_t count)> all_reduce;
};

// The rows of a kLastToken pass whose next token the backend can pick itself (optional): the rows
// whose next token is the plain argmax of their logits (Sampler::IsPlainArgmax), whose logits
// nobody reads (a prompt chunk that is not the last), and, on a backend that draws_rows(), the rows
// Sampler::NextPickedByBackend hands it: draws (draws[i].draw set), and rows with score edits
// (logit_bias, penalties, a min_tokens mask: Sampler::AppendScoreEdits), which the backend
// applies to the row's logits first, in place (its returned logits are the edited scores). The
// backend writes each wanted row's token to argmax[i]: DrawRow's draw (common/engine/row_draw.h)
// where draws[i].draw, else the argmax (ArgmaxRow, common/engine/sampling.h: lowest id on ties;
// NaN and -inf never win); it leaves the other entries alone. A drawn row that asks for logprobs
// (draws[i].top_logprobs >= 0) gets them in logprobs[i] (DrawRow's). On a device this is computed
// there, and when every row is wanted the logits stay there too: Forward then returns an empty
// span, and a step copies batch * 4 bytes back instead of batch * vocab * 4, with no pass over the
// vocabulary on the host.
struct GreedyRows {
  std::span<const uint8_t> wanted;  // [batch.size()]; 1 = the backend's token is enough
  std::span<int32_t> argmax;        // [batch.size()]; written where wanted
  std::span<const RowDraw> draws;   // empty, or [batch.size()]: the rows to draw
  std::span<RowLogprobs> logprobs;  // empty, or [batch.size()] (with draws): written as above
  // Score edits (common/engine/score_edits.h), applied to a wanted row's logits before its
  // argmax or draw: row i's are edits[edit_begin[i], edit_begin[i + 1]). edit_begin empty
  // (no edits) or [batch.size() + 1]. A row with edits must be wanted and want no logprobs.
  std::span<const ScoreEdit> edits = {};
  std::span<const int32_t> edit_begin = {};
  bool all_wanted() const;
  // Whether row i is wanted as a draw (else as its argmax), and with logprobs.
  bool drawn(size_t i) const { return !draws.empty() && draws[i].draw != 0; }
  bool wants_logprobs(size_t i) const;
  // Row i's score edits (empty when it has none).
  std::span<const ScoreEdit> edits_of(size_t i) const;
};

class ForwardBackend {
 public:
  virtual ~ForwardBackend() = default;

  // The KV layout this model needs, with the given block size (the same on every backend).
  virtual KvLayout MakeKvLayout(int block_size = kDefaultBlockSize) const = 0;

  // Memory for a KV pool of `bytes` where this backend's pass reads it: the heap (CPU) or
  // device memory (CUDA, zeroed). ResourceExhausted when there is not enough.
  virtual StatusOr<KvPoolMemory> AllocateKvPool(size_t bytes) = 0;
  // Pools made elsewhere (a transport allocates them where it can export them), one per rank of
  // this backend (one for a single-rank backend, common/engine/tp_forward.h for more), each in
  // this backend's memory. Returns the engine's pool: rank 0's, whose owner keeps every pool
  // alive. InvalidArgument when the count is not the ranks'.
  virtual StatusOr<KvPoolMemory> AdoptKvPools(std::vector<KvPoolMemory> pools);

  // Runs one forward pass. Returns row-major logits in host memory: [batch.size(), vocab] for
  // kLastToken, or [total new tokens, vocab] (sequences in order) for kAllTokens. The span
  // points into a buffer owned by the backend, valid until the next call.
  // Errors (nothing is written to the cache then): ValidateForwardBatch's; InvalidArgument
  // when the cache's memory is not where this backend computes (a host pool given to CUDA);
  // Internal when the device failed.
  // `hooks` (optional, not kept) see ForwardHooks; they do not change the result.
  // `greedy` (optional, kLastToken only; InvalidArgument otherwise) see GreedyRows.
  virtual StatusOr<std::span<const float>> Forward(std::span<const SequenceInput> batch,
                                                   KvCache& cache,
                                                   LogitsMode mode = LogitsMode::kLastToken,
                                                   const ForwardHooks* hooks = nullptr,
                                                   GreedyRows* greedy = nullptr) = 0;

  virtual const Model& model() const = 0;
  // Whether the engines should hand this backend the rows it can draw (GreedyRows::draws) and
  // the rows' score edits (GreedyRows::edits): where the logits are on a device, a draw there
  // saves copying them back and sampling on the host. The CPU backend draws such rows and
  // applies their edits correctly too (DrawRow, ApplyScoreEdits) but slower than the Sampler,
  // so it says false.
  virtual bool draws_rows() const { return false; }
  // "cpu" or "cuda:<ordinal> (<device name>)", for logs and `tandem --version`.
  virtual std::string description() const = 0;
};

// An engine's KV cache of `num_blocks` blocks of `block_size` for `backend`: over `pools` (one
// per rank, a transport's: AdoptKvPools) or, when there are none, over a pool the backend
// allocates. Errors: AllocateKvPool's, AdoptKvPools', KvCache::Create's.
StatusOr<std::unique_ptr<KvCache>> CreateKvCacheFor(ForwardBackend& backend, int block_size,
                                                    int num_blocks,
                                                    std::vector<KvPoolMemory> pools);

// The backend for `device` ("cpu" or "cuda"). InvalidArgument for another name, or "cuda" on a
// build without CUDA; Unavailable when CUDA finds no device; the backend's own errors.
StatusOr<std::unique_ptr<ForwardBackend>> CreateForwardBackend(const Model& model,
                                                               const ForwardOptions& options,
                                                               std::string_view device);

// Makes the forward backend of an engine that was given one (PrefillEngineOptions,
// BatchEngineOptions::make_backend) instead of CreateForwardBackend's for its device: tests run
// the engines on a backend of their own this way.
using ForwardBackendFactory = std::function<StatusOr<std::unique_ptr<ForwardBackend>>(
    const Model& model, const ForwardOptions& options)>;

// The memory a KV pool on `device` takes its share (kv_cache.memory_fraction) of: the machine's
// (cpu, MachineMemoryBytes) or the device's total less `device_reserved_bytes` (cuda: what the
// instance holds there besides its pool, DeviceMemoryNeed::besides_kv in
// common/engine/device_memory.h). Errors as CreateForwardBackend's for the device.
StatusOr<uint64_t> KvMemoryBudgetBytes(std::string_view device, uint64_t device_reserved_bytes);

// Free and total bytes of GPU `index` (of those CUDA_VISIBLE_DEVICES shows) of `device` now:
// what start-up checks an instance's pool, weights and buffers against before allocating any.
// cuda only: InvalidArgument for another device; errors as CreateForwardBackend's.
struct DeviceMemoryNow {
  uint64_t free_bytes = 0;
  uint64_t total_bytes = 0;
};
StatusOr<DeviceMemoryNow> DeviceMemoryOf(std::string_view device, int index);

// Whether this build has the CUDA backend.
bool ForwardBackendHasCuda();

// The storage dtype to load a model as for `device`, from model.dtype (`configured`: "auto" or a
// dtype name): a named dtype as named; auto on cpu is the checkpoint's (nullopt: Model::Load
// decides); auto on cuda is bfloat16, whatever the checkpoint (float32 and dequantized GGUF
// weights too, as vLLM's auto does for 16-bit GPUs; float32 only when asked for, e.g. to check
// tokens against the CPU).
std::optional<WeightDType> LoadDTypeFor(std::string_view configured, std::string_view device);

// The checks both backends run before a pass (nothing is computed or written when one fails):
// InvalidArgument for a cache layout that does not match `config`, an empty batch or sequence,
// a negative position, a token id outside the vocabulary, a block table that does not cover the
// positions or names a block outside the pool of `num_blocks`; TooLarge when the batch exceeds
// options.max_batch_tokens or max_batch_sequences.
Status ValidateForwardBatch(const ModelConfig& config, const ForwardOptions& options,
                            std::span<const SequenceInput> batch, const KvLayout& layout,
                            int num_blocks);
// InvalidArgument when `greedy` does not fit a pass of `batch_size` rows in `mode`.
Status ValidateGreedyRows(const GreedyRows* greedy, size_t batch_size, LogitsMode mode,
                          int32_t vocab_size);

// RoPE inverse frequencies [head_dim / 2] computed in fp32 the way HF's rope init functions do,
// with the config's scaling (linear, llama3) applied.
std::vector<float> RopeInvFreq(const ModelConfig& config);

}  // namespace tandem
