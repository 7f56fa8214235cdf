// The continuous-batching engine of the decode and colocated instances: the model, the paged KV
// pool, the requests and their samplers. No networking: the server feeds it requests and gets
// tokens and finishes back through an EngineSink.
//
// Threads: everything here belongs to the instance's engine thread.
// Requests that begin with the same tokens share the KV blocks of that prefix: a request whose
// first block another request is still computing waits in the queue (FCFS: so do the ones
// behind it) until it can take that request's blocks instead of computing them again; this is
// how the n choices of one prompt compute it once. A request whose KV was pulled gives up its
// copy of a prefix that another request here already holds (each choice of one prompt is
// pulled from prefill on its own), once the pull is over.
// Requests enter either from scratch (AddNew: prompt to prefill here, colocated) or with their
// prompt's KV already in blocks of this pool (AddPulled: KV pulled from a prefill instance; the
// first token was sampled and streamed by prefill). Every request added leaves through exactly
// one EngineSink::OnFinish (or Cancel/FailAll, which also report it), and its blocks are freed
// before that call.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "common/net/control_wire.h"
#include "common/engine/batch_sampling.h"
#include "common/engine/forward_backend.h"
#include "common/engine/kv_cache.h"
#include "common/base/metrics.h"
#include "common/base/moving_average.h"
#include "common/base/thread_annotations.h"
#include "common/model/model.h"
#include "common/engine/sampling.h"
#include "decode/colocated_scheduler.h"

namespace tandem {

// The arrival of one request's pulled KV, layer by layer (layer-wise streaming): the
// transport's thread reports it, the engine thread waits for it in the forward pass's
// before_layer hook. Thread-safe.
class KvArrival {
 public:
  using Clock = std::chrono::steady_clock;
  explicit KvArrival(int num_layers) : num_layers_(num_layers) {}
  void LayerLanded(uint32_t layer);  // the pull's on_layer (layers land in order)
  void Done(const Status& status);   // the pull's on_done: nothing writes the blocks any more
  // Until layer `layer` has landed (true) or the pull ended without it or `deadline` passed
  // (false).
  bool WaitLayer(int layer, Clock::time_point deadline);
  // Until the pull ended (true) or `deadline` passed (false).
  bool WaitDone(Clock::time_point deadline);
  bool ended() const;
  bool complete() const;  // ended OK: every layer is in

 private:
  const int num_layers_;
  mutable Mutex mutex_;
  std::condition_variable_any cv_;
  int landed_ TANDEM_GUARDED_BY(mutex_) = 0;
  bool done_ TANDEM_GUARDED_BY(mutex_) = false;
  bool ok_ TANDEM_GUARDED_BY(mutex_) = false;
};

class EngineSink {
 public:
  virtual ~EngineSink() = default;
  virtual void OnTokens(Tokens tokens) = 0;
  virtual void OnFinish(Finish finish) = 0;
};

struct BatchEngineOptions {
  std::string device = "cpu";  // S.device: the forward backend (common/engine/forward_backend.h)
  ForwardBackendFactory make_backend;  // unset: CreateForwardBackend's for `device` (tests set it)
  int threads = 1;  // S.threads: of the forward pass (cpu) and of host sampling (BatchSampling)
  int tensor_parallel = 1;  // S.tensor_parallel: GPUs of the instance (cuda; ForwardOptions)
  int kv_blocks = 0;  // resolved (> 0), per rank with tensor_parallel
  int block_size = 16;
  int max_batch_size = 64;
  int token_budget = 2048;
  int max_model_len = 4096;
  // Colocated: chunked prompts in decode steps, or whole prompts first (decode/colocated_scheduler.h).
  StepPolicy policy = StepPolicy::kChunked;
  MetricsRegistry* metrics = nullptr;  // not owned; may be null
  // Layer-wise: how long a step waits for one layer of a request whose KV is still arriving
  // (the transfer timeout plus a margin: the pull itself fails first).
  std::chrono::milliseconds kv_wait_timeout{6000};
  bool prefix_caching = true;  // kv_cache.prefix_caching (BlockManager::SetCaching)
  KvDType kv_dtype = KvDType::kFloat32;  // kv_cache.dtype (ResolvedKvDType; ForwardOptions)
  // Where the KV pool lives, one per rank (a transport allocated them; on the backend's devices
  // when that is not the CPU; ForwardBackend::AdoptKvPools); empty: the backend allocates it.
  std::vector<KvPoolMemory> kv_pools;
};

struct EngineStats {
  int32_t running = 0;
  int32_t waiting = 0;
  int64_t waiting_prompt_tokens = 0;  // tokens still to compute in waiting requests
  int64_t context_tokens = 0;
  int32_t free_blocks = 0;
  int32_t total_blocks = 0;
  double decode_step_seconds = 0;        // moving average over steps without prompt work
  // The same average of their forward passes alone (no sampling, no bookkeeping, no waiting
  // for arriving KV layers): what `tandem profile` times.
  double decode_forward_seconds = 0;
  double decode_step_batch = 0;          // the same average's sequences per step
  double decode_step_context_tokens = 0;  // the same average's summed context per step
  double prefill_seconds_per_token = 0;  // moving average over steps with prefill work
};

class BatchEngine {
 public:
  // `model` must outlive the engine. Allocates the KV pool and every workspace now.
  static StatusOr<std::unique_ptr<BatchEngine>> Create(const Model& model,
                                                       const BatchEngineOptions& options);
  // What Create gives its forward backend for `options` (the KV pool is sized beside the
  // backend's buffers: InstanceKvPools).
  static ForwardOptions BackendOptions(const BatchEngineOptions& options);

  // Checks a request against the model and the pool (InvalidArgument, TooLarge).
  Status Validate(const std::vector<int32_t>& prompt, const SamplingParams& sampling) const;

  // Queues a request to prefill here. Validate() first.
  void AddNew(const std::string& id, std::vector<int32_t> prompt, const SamplingParams& sampling);
  // Adds a request whose prompt KV is in `blocks` (which it now owns) and whose first token was
  // already sampled and streamed elsewhere. sampling.seed must be set.
  // `arrival` (layer-wise streaming): the KV is still being pulled into `blocks`; the request
  // joins the batch now and each step waits, layer by layer, until the layer it is about to
  // use has landed. A step in which a layer did not land (the pull failed or is too slow)
  // discards that request's output (it is recomputed next step). Its blocks are never freed
  // before the pull ended (preemption and FailAll wait for it, bounded).
  void AddPulled(const std::string& id, std::vector<int32_t> prompt, int32_t first_token,
                 const SamplingParams& sampling, std::vector<int32_t> blocks,
                 std::shared_ptr<KvArrival> arrival = nullptr);
  // Frees the request now. False when unknown. No OnFinish is sent. Not for a request whose
  // KV is still arriving (use Remove).
  bool Cancel(const std::string& id);
  // Removes the request without freeing its blocks, which go to *blocks (the caller frees them
  // once nothing writes them any more). False when unknown. No OnFinish is sent.
  bool Remove(const std::string& id, std::vector<int32_t>* blocks);
  // Ends every request with `status` through the sink.
  void FailAll(const Status& status, EngineSink& sink);

  // Runs one scheduled forward pass and reports its tokens. False when there was nothing to do.
  bool Step(EngineSink& sink);

  bool idle() const { return running_.empty() && waiting_.empty(); }
  EngineStats Stats() const;
  KvCache& cache() { return *cache_; }
  const KvLayout& layout() const { return cache_->layout(); }

 private:
  struct Request {
    std::string id;
    std::vector<int32_t> tokens;  // prompt + generated
    int32_t prompt_len = 0;
    int32_t num_computed = 0;
    std::vector<int32_t> blocks;
    std::unique_ptr<Sampler> sampler;
    std::unique_ptr<StopChecker> stop;
    std::shared_ptr<KvArrival> arrival;  // set while its pulled KV is still arriving
    int32_t published = 0;  // leading blocks published for prefix sharing (or taken shared)
    uint64_t first_block_key = 0;  // BlockManager::FirstBlockKey of its tokens
    bool took_shared = false;  // began with another request's blocks (computes only its tail)
    int32_t prefix_blocks = 0;  // waiting: the published blocks PlanStep planned it to take
  };
  // Prefix sharing (common/engine/kv_cache.h): a request admitted takes the published blocks
  // that hold its leading tokens; after a step, every block a request filled is published.
  void TakeSharedPrefix(Request& r);  // r.prefix_blocks of them, on admission
  void PublishFilled(Request& r);
  // Blocks until r's KV stopped arriving (bounded by kv_wait_timeout); then r.arrival is reset.
  void WaitArrivalEnded(Request& r);
  // One step, in the order Step runs them.
  struct StepShape {
    int64_t prefill_tokens = 0;  // prompt tokens computed (0: a decode-only step)
    int64_t batch = 0;           // sequences
    int64_t context = 0;         // summed tokens of those sequences
    double forward_s = 0;        // the forward pass, less the wait for arriving KV
    double kv_wait_s = 0;
  };
  StepPlan PlanStep();
  void Preempt(std::vector<size_t> victims);
  // Admits the planned waiting requests, allocates blocks, fills batch_ and inputs_.
  StepShape BuildBatch(const StepPlan& plan);
  std::span<const float> RunForward(StepShape* shape);
  // Samples every request whose prompt is done, reports tokens, finishes the stopped ones.
  void SampleBatch(std::span<const float> logits, EngineSink& sink);
  void RecordStep(const StepShape& shape, double seconds);
  BatchEngine(const Model& model, const BatchEngineOptions& options);
  void FinishRequest(Request& r, Finish finish, EngineSink& sink);

  const Model& model_;
  BatchEngineOptions options_;
  std::unique_ptr<ForwardBackend> forward_;
  std::unique_ptr<KvCache> cache_;
  SamplerWorkspace workspace_;
  std::vector<int32_t> eos_ids_;
  std::deque<std::unique_ptr<Request>> running_;  // admission order, oldest first
  std::deque<std::unique_ptr<Request>> waiting_;  // FCFS; preempted ones go to the front
  // Scratch reused every step.
  std::vector<SeqState> running_state_, waiting_state_;
  std::vector<SequenceInput> inputs_;
  std::vector<Request*> batch_;
  std::vector<char> landed_;  // per batch entry: every layer it used had arrived
  // Per batch entry (GreedyRows): whether its argmax is enough, and the argmax.
  std::vector<uint8_t> greedy_wanted_;
  std::vector<int32_t> greedy_argmax_;
  std::vector<RowDraw> greedy_draws_;
  std::vector<RowLogprobs> greedy_logprobs_;
  std::vector<ScoreEdit> greedy_edits_;     // rows' score edits (GreedyRows::edits)
  std::vector<int32_t> greedy_edit_begin_;  // [batch + 1]
  // The step's host sampling (options.threads threads), its jobs and, per batch entry, the
  // result (of the rows that sample on the host).
  std::unique_ptr<BatchSampling> sampling_;
  std::vector<BatchSampling::Job> sample_jobs_;
  std::vector<SampleResult> sample_results_;
  std::vector<int32_t> sample_of_row_;  // per batch entry: its job, or -1
  std::vector<uint64_t> computing_keys_;  // PlanStep: first blocks being computed
  std::vector<int32_t> twins_;            // PublishFilled: published blocks equal to its own
  // What LoadReport carries: decode-only steps, and seconds per prompt token of mixed steps.
  MovingAverage avg_decode_step_s_, avg_decode_forward_s_, avg_decode_batch_, avg_decode_context_;
  MovingAverage avg_prefill_s_per_token_;
  Histogram* step_seconds_ = nullptr;
  Counter* preemptions_ = nullptr;
  Counter* shared_tokens_ = nullptr;
};

}  // namespace tandem
