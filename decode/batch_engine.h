// The continuous-batching engine of the decode and colocated instances: the model, the paged KV
// pool, the requests and their samplers. No networking: the server feeds it requests and gets
// tokens and finishes back through an EngineSink.
//
// Threads: everything here belongs to the instance's engine thread.
// Requests enter either from scratch (AddNew: prompt to prefill here, colocated) or with their
// prompt's KV already in blocks of this pool (AddPulled: KV pulled from a prefill instance; the
// first token was sampled and streamed by prefill). Every request added leaves through exactly
// one EngineSink::OnFinish (or Cancel/FailAll, which also report it), and its blocks are freed
// before that call.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "common/control_wire.h"
#include "common/forward.h"
#include "common/kv_cache.h"
#include "common/metrics.h"
#include "common/model.h"
#include "common/sampling.h"
#include "decode/colocated_scheduler.h"

namespace tandem {

class EngineSink {
 public:
  virtual ~EngineSink() = default;
  virtual void OnTokens(Tokens tokens) = 0;
  virtual void OnFinish(Finish finish) = 0;
};

struct BatchEngineOptions {
  int threads = 1;
  int kv_blocks = 0;  // resolved (> 0)
  int block_size = 16;
  int max_batch_size = 64;
  int token_budget = 2048;
  int max_model_len = 4096;
  // Colocated: chunked prompts in decode steps, or whole prompts first (decode/colocated_scheduler.h).
  StepPolicy policy = StepPolicy::kChunked;
  MetricsRegistry* metrics = nullptr;  // not owned; may be null
  // Where the KV pool lives (a transport allocated it); empty: the engine allocates it.
  KvPoolMemory kv_memory;
};

struct EngineStats {
  int32_t running = 0;
  int32_t waiting = 0;
  int64_t waiting_prompt_tokens = 0;  // tokens still to compute in waiting requests
  int64_t context_tokens = 0;
  int32_t free_blocks = 0;
  int32_t total_blocks = 0;
  double decode_step_seconds = 0;        // moving average
  double prefill_seconds_per_token = 0;  // moving average over steps with prefill work
};

class BatchEngine {
 public:
  // `model` must outlive the engine. Allocates the KV pool and every workspace now.
  static StatusOr<std::unique_ptr<BatchEngine>> Create(const Model& model,
                                                       const BatchEngineOptions& options);

  // Checks a request against the model and the pool (InvalidArgument, TooLarge).
  Status Validate(const std::vector<int32_t>& prompt, const SamplingParams& sampling) const;

  // Queues a request to prefill here. Validate() first.
  void AddNew(const std::string& id, std::vector<int32_t> prompt, const SamplingParams& sampling);
  // Adds a request whose prompt KV is in `blocks` (which it now owns) and whose first token was
  // already sampled and streamed elsewhere. sampling.seed must be set.
  void AddPulled(const std::string& id, std::vector<int32_t> prompt, int32_t first_token,
                 const SamplingParams& sampling, std::vector<int32_t> blocks);
  // Frees the request now. False when unknown. No OnFinish is sent.
  bool Cancel(const std::string& id);
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
  };
  BatchEngine(const Model& model, const BatchEngineOptions& options);
  void FinishRequest(Request& r, Finish finish, EngineSink& sink);

  const Model& model_;
  BatchEngineOptions options_;
  std::unique_ptr<CpuForward> forward_;
  std::unique_ptr<KvCache> cache_;
  SamplerWorkspace workspace_;
  std::vector<int32_t> eos_ids_;
  std::deque<std::unique_ptr<Request>> running_;  // admission order, oldest first
  std::deque<std::unique_ptr<Request>> waiting_;  // FCFS; preempted ones go to the front
  // Scratch reused every step.
  std::vector<SeqState> running_state_, waiting_state_;
  std::vector<SequenceInput> inputs_;
  std::vector<Request*> batch_;
  double avg_decode_step_s_ = 0;
  double avg_prefill_s_per_token_ = 0;
  Histogram* step_seconds_ = nullptr;
  Counter* preemptions_ = nullptr;
};

}  // namespace tandem
