// The prefill engine: the model, the KV pool and the prefill queue, with no networking (as
// decode/batch_engine.h is for decode). Requests are queued (Add), batched by token budget
// (prefill/prefill_scheduler.h), run through one forward pass per Step, and leave with their
// first token sampled: PrefillObserver::OnPrefilled hands the request, its blocks and its first
// token to the caller, which frees the blocks or hands them off (prefill/kv_handoff.h).
//
// Layer-wise handoff: before the pass that computes a request's last prompt chunk,
// PrefillObserver::BeforeLastChunk sees it (its blocks are final by then); the observer may ask to
// hear of every layer of that pass (OnLayerComputed) to announce the KV while it is computed.
//
// Prompts that begin with the same tokens share the KV blocks of that prefix
// (common/engine/kv_cache.h): a request whose first block an earlier one is computing waits
// (FCFS: so do the ones behind it) until it can take that request's blocks instead of computing
// them; the n choices of one prompt compute it once. Blocks handed off stay shareable until freed.
//
// Every queued request has a sampling seed from Add on (decode continues the same sampler stream).
// Threads: everything here belongs to the instance's engine thread.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/base/metrics.h"
#include "common/base/moving_average.h"
#include "common/base/status.h"
#include "common/engine/batch_sampling.h"
#include "common/engine/forward_backend.h"
#include "common/engine/kv_cache.h"
#include "common/engine/sampling.h"
#include "common/model/model.h"
#include "prefill/prefill_scheduler.h"

namespace tandem {

struct PrefillEngineOptions {
  std::string device = "cpu";  // S.device: the forward backend (common/engine/forward_backend.h)
  ForwardBackendFactory make_backend;  // unset: CreateForwardBackend's for `device` (tests set it)
  int threads = 1;  // S.threads: of the forward pass (cpu) and of host sampling (BatchSampling)
  int tensor_parallel = 1;  // S.tensor_parallel: GPUs of the instance (cuda; ForwardOptions)
  int token_budget = 2048;
  int max_batch_size = 64;
  int block_size = 16;
  int kv_blocks = 0;  // resolved (> 0), per rank with tensor_parallel
  int max_model_len = 4096;
  bool prefix_caching = true;  // kv_cache.prefix_caching (BlockManager::SetCaching)
  KvDType kv_dtype = KvDType::kFloat32;  // kv_cache.dtype (ResolvedKvDType; ForwardOptions)
  // Where the pool lives, one per rank (a transport allocated them; on the backend's devices
  // when that is not the CPU; ForwardBackend::AdoptKvPools); empty: the backend allocates it.
  std::vector<KvPoolMemory> kv_pools;
  MetricsRegistry* metrics = nullptr;  // not owned; may be null
};

struct PrefillRequest {
  std::string id;
  std::vector<int32_t> prompt;
  SamplingParams sampling;  // seed always set
  int32_t num_computed = 0;
  std::vector<int32_t> blocks;
  int32_t published = 0;  // leading blocks published for prefix sharing (or taken shared)
  uint64_t first_block_key = 0;  // BlockManager::FirstBlockKey of the prompt
  bool took_shared = false;  // began with another request's blocks (computes only its tail)
  int32_t prefix_blocks = 0;  // not started: the published blocks Step planned it to take
};

// A request whose prompt is computed and whose first token is sampled.
struct Prefilled {
  PrefillRequest request;  // request.blocks are the caller's now: free or hand off
  GeneratedToken first;
  FinishReason finish = FinishReason::kNone;  // kNone: the request continues in decode
};

class PrefillObserver {
 public:
  virtual ~PrefillObserver() = default;
  // `r`'s last prompt chunk is in the coming pass. True: call OnLayerComputed for this pass.
  virtual bool BeforeLastChunk(PrefillRequest& r) = 0;
  // Layer `layer` of the pass is computed (only when a BeforeLastChunk said true).
  virtual void OnLayerComputed(int layer) = 0;
  virtual void OnPrefilled(Prefilled done) = 0;
};

class PrefillEngine {
 public:
  // `model` must outlive the engine.
  static StatusOr<std::unique_ptr<PrefillEngine>> Create(const Model& model,
                                                         PrefillEngineOptions options);
  // What Create gives its forward backend for `options` (the KV pool is sized beside the
  // backend's buffers: InstanceKvPools).
  static ForwardOptions BackendOptions(const PrefillEngineOptions& options);

  // InvalidArgument (empty prompt, tokens outside the vocabulary, bad sampling), TooLarge
  // (prompt + max_tokens over max_model_len, prompt over the pool).
  Status Validate(const std::vector<int32_t>& prompt, const SamplingParams& sampling) const;
  // Queues a validated request.
  void Add(std::string id, std::vector<int32_t> prompt, SamplingParams sampling);
  // Removes a queued request and frees its blocks. False when it is not queued.
  bool Cancel(const std::string& id);
  // Runs one batch. False when nothing could be scheduled.
  bool Step(PrefillObserver& observer);

  void FreeBlocks(std::span<const int32_t> blocks) { cache_->blocks().Free(blocks); }
  // Ids of the queued requests (for failing them all).
  std::vector<std::string> QueuedIds() const;

  bool idle() const { return queue_.empty(); }
  int32_t queued() const { return static_cast<int32_t>(queue_.size()); }
  int64_t queued_tokens() const;
  int32_t free_blocks() const { return cache_->blocks().num_free(); }
  int32_t total_blocks() const { return cache_->num_blocks(); }
  double seconds_per_token() const { return avg_s_per_token_.value(); }
  KvCache& cache() { return *cache_; }

 private:
  PrefillEngine(const Model& model, PrefillEngineOptions options);
  // Allocates the batch's new blocks and builds the forward inputs; the number of tokens.
  int64_t PrepareBatch(const std::vector<PrefillChunk>& batch);
  // Reports the first token of a request whose prompt is done.
  void Complete(PrefillRequest& r, const SampleResult& sample, PrefillObserver& observer);
  // The queue's scheduling items, up to the first request that waits to share a prefix being
  // computed; one not started yet is planned with the published prefix it would take.
  void CollectItems();
  void TakeSharedPrefix(PrefillRequest& r);  // r.prefix_blocks of them, when scheduled
  void PublishFilled(PrefillRequest& r);

  const Model& model_;
  PrefillEngineOptions options_;
  std::unique_ptr<ForwardBackend> forward_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<SamplerWorkspace> workspace_;
  std::unique_ptr<BatchSampling> sampling_;  // the first tokens of a step (options_.threads)
  std::vector<int32_t> eos_ids_;
  std::deque<std::unique_ptr<PrefillRequest>> queue_;
  std::vector<PrefillItem> items_;
  std::vector<SequenceInput> inputs_;
  MovingAverage avg_s_per_token_;  // reported in LoadReport
  Histogram* batch_seconds_ = nullptr;
  Counter* shared_tokens_ = nullptr;
  std::vector<uint64_t> computing_keys_;  // CollectItems: first blocks being computed
};

}  // namespace tandem
