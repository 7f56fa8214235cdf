#include "decode/batch_engine.h"

#include <algorithm>

#include "common/engine/kv_cache.h"
#include "common/base/log.h"
#include "common/serving/instance_setup.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

void KvArrival::LayerLanded(uint32_t layer) {
  {
    MutexLock lock(&mutex_);
    landed_ = std::max(landed_, static_cast<int>(layer) + 1);
  }
  cv_.notify_all();
}

void KvArrival::Done(const Status& status) {
  {
    MutexLock lock(&mutex_);
    done_ = true;
    ok_ = status.ok();
    if (ok_) landed_ = num_layers_;
  }
  cv_.notify_all();
}

bool KvArrival::WaitLayer(int layer, Clock::time_point deadline) {
  MutexLock lock(&mutex_);
  while (landed_ <= layer && !done_)
    if (cv_.wait_until(mutex_, deadline) == std::cv_status::timeout) break;
  return landed_ > layer;
}

bool KvArrival::WaitDone(Clock::time_point deadline) {
  MutexLock lock(&mutex_);
  while (!done_)
    if (cv_.wait_until(mutex_, deadline) == std::cv_status::timeout) return done_;
  return true;
}

bool KvArrival::ended() const {
  MutexLock lock(&mutex_);
  return done_;
}

bool KvArrival::complete() const {
  MutexLock lock(&mutex_);
  return done_ && ok_;
}

BatchEngine::BatchEngine(const Model& model, const BatchEngineOptions& options)
    : model_(model), options_(options), workspace_(model.config().vocab_size) {
  for (int id : model.config().eos_token_ids) eos_ids_.push_back(id);
  if (options.metrics != nullptr) {
    step_seconds_ = &options.metrics
                         ->AddHistogram("tandem_decode_step_seconds",
                                        "Wall time of one engine step (forward + sampling).", {},
                                        LatencyBuckets())
                         .Get();
    shared_tokens_ = &options.metrics
                          ->AddCounter("tandem_prefix_shared_tokens_total",
                                       "Tokens whose KV a request took from another request's "
                                       "blocks (a shared prefix) instead of computing it.")
                          .Get();
    preemptions_ = &options.metrics
                        ->AddCounter("tandem_preemptions_total",
                                     "Requests preempted (recompute) because the KV pool ran out.")
                        .Get();
  }
}

ForwardOptions BatchEngine::BackendOptions(const BatchEngineOptions& options) {
  ForwardOptions fo;
  fo.num_threads = options.threads;
  // prefill_first runs a prompt (or a preempted sequence's recompute) whole, even past the
  // budget: up to max_model_len tokens in one pass.
  fo.max_batch_tokens = options.policy == StepPolicy::kPrefillFirst
                            ? std::max(options.token_budget, options.max_model_len)
                            : options.token_budget;
  fo.max_batch_sequences = options.max_batch_size;
  fo.max_model_len = options.max_model_len;
  fo.tensor_parallel = options.tensor_parallel;
  fo.kv_dtype = options.kv_dtype;
  return fo;
}

StatusOr<std::unique_ptr<BatchEngine>> BatchEngine::Create(const Model& model,
                                                           const BatchEngineOptions& options) {
  if (options.kv_blocks <= 0 || options.block_size <= 0 || options.max_batch_size <= 0 ||
      options.token_budget <= 0)
    return InvalidArgument("engine options must be positive");
  std::unique_ptr<BatchEngine> engine(new BatchEngine(model, options));
  const ForwardOptions fo = BackendOptions(options);
  TANDEM_ASSIGN_OR_RETURN(engine->forward_,
                          options.make_backend
                              ? options.make_backend(model, fo)
                              : CreateForwardBackend(model, fo, options.device));
  engine->sampling_ =
      std::make_unique<BatchSampling>(std::max(options.threads, 1), model.config().vocab_size);
  TANDEM_ASSIGN_OR_RETURN(engine->cache_,
                          CreateKvCacheFor(*engine->forward_, options.block_size,
                                           options.kv_blocks, options.kv_pools));
  engine->options_.kv_pools.clear();  // the cache holds the memory now
  engine->cache_->blocks().SetCaching(options.prefix_caching);
  engine->running_state_.reserve(options.max_batch_size * 2);
  engine->inputs_.reserve(options.max_batch_size);
  engine->batch_.reserve(options.max_batch_size);
  return engine;
}

Status BatchEngine::Validate(const std::vector<int32_t>& prompt,
                             const SamplingParams& sampling) const {
  TANDEM_RETURN_IF_ERROR(
      CheckRequest(prompt, sampling, model_.config().vocab_size, options_.max_model_len));
  const int64_t total = static_cast<int64_t>(prompt.size()) + sampling.max_tokens;
  if (BlocksForTokens(total, options_.block_size) > options_.kv_blocks)
    return TooLarge("request needs more KV blocks than the instance has (" +
                    std::to_string(options_.kv_blocks) + ")");
  return Status();
}

void BatchEngine::AddNew(const std::string& id, std::vector<int32_t> prompt,
                         const SamplingParams& sampling) {
  auto r = std::make_unique<Request>();
  r->id = id;
  r->prompt_len = static_cast<int32_t>(prompt.size());
  r->tokens = std::move(prompt);
  r->tokens.reserve(r->tokens.size() + sampling.max_tokens);
  r->sampler = std::make_unique<Sampler>(sampling, &workspace_, r->prompt_len, eos_ids_);
  r->stop = std::make_unique<StopChecker>(sampling, eos_ids_);
  r->first_block_key = cache_->blocks().FirstBlockKey(r->tokens);
  waiting_.push_back(std::move(r));
}

void BatchEngine::AddPulled(const std::string& id, std::vector<int32_t> prompt,
                            int32_t first_token, const SamplingParams& sampling,
                            std::vector<int32_t> blocks, std::shared_ptr<KvArrival> arrival) {
  TANDEM_CHECK(sampling.seed.has_value(), "a pulled request continues a seeded stream");
  auto r = std::make_unique<Request>();
  r->id = id;
  r->prompt_len = static_cast<int32_t>(prompt.size());
  r->num_computed = r->prompt_len;
  r->tokens = std::move(prompt);
  r->tokens.reserve(r->tokens.size() + sampling.max_tokens);
  r->tokens.push_back(first_token);
  r->blocks = std::move(blocks);
  r->arrival = std::move(arrival);
  r->first_block_key = cache_->blocks().FirstBlockKey(r->tokens);
  r->sampler = std::make_unique<Sampler>(sampling, &workspace_, r->prompt_len, eos_ids_);
  r->stop = std::make_unique<StopChecker>(sampling, eos_ids_);
  StopUpdate first = r->stop->Append(first_token, "");
  TANDEM_CHECK(!first.finished(), "prefill hands off only requests that continue");
  running_.push_back(std::move(r));
}

void BatchEngine::WaitArrivalEnded(Request& r) {
  if (r.arrival == nullptr) return;
  const auto bound = options_.kv_wait_timeout + std::chrono::seconds(5);
  // The transport promises on_done within its timeout; a pull still running past that would
  // write into blocks that are reused once freed.
  TANDEM_CHECK(r.arrival->WaitDone(KvArrival::Clock::now() + bound),
               "request " + r.id + ": its KV pull did not end in time");
  r.arrival.reset();
}

bool BatchEngine::Remove(const std::string& id, std::vector<int32_t>* blocks) {
  for (auto* queue : {&running_, &waiting_}) {
    for (auto it = queue->begin(); it != queue->end(); ++it) {
      if ((*it)->id != id) continue;
      *blocks = std::move((*it)->blocks);
      queue->erase(it);
      return true;
    }
  }
  return false;
}

bool BatchEngine::Cancel(const std::string& id) {
  for (auto* queue : {&running_, &waiting_}) {
    for (auto it = queue->begin(); it != queue->end(); ++it) {
      if ((*it)->id != id) continue;
      TANDEM_CHECK((*it)->arrival == nullptr || (*it)->arrival->ended(),
                   "Cancel of a request whose KV is still arriving");
      cache_->blocks().Free((*it)->blocks);
      queue->erase(it);
      return true;
    }
  }
  return false;
}

void BatchEngine::FailAll(const Status& status, EngineSink& sink) {
  for (auto* queue : {&running_, &waiting_}) {
    for (auto& r : *queue) {
      WaitArrivalEnded(*r);
      cache_->blocks().Free(r->blocks);
      r->blocks.clear();
      Finish f;
      f.request_id = r->id;
      f.code = status.code();
      f.message = status.message();
      f.completion_tokens = r->stop->num_tokens();
      sink.OnFinish(std::move(f));
    }
    queue->clear();
  }
}

void BatchEngine::FinishRequest(Request& r, Finish finish, EngineSink& sink) {
  cache_->blocks().Free(r.blocks);
  r.blocks.clear();
  sink.OnFinish(std::move(finish));
}

StepPlan BatchEngine::PlanStep() {
  for (auto& r : running_)
    if (r->arrival != nullptr && r->arrival->complete()) r->arrival.reset();
  running_state_.clear();
  waiting_state_.clear();
  const BlockManager& blocks = cache_->blocks();
  for (auto& r : running_) {
    const auto shared = std::count_if(r->blocks.begin(), r->blocks.end(),
                                      [&](int32_t b) { return blocks.ref_count(b) > 1; });
    running_state_.push_back({static_cast<int32_t>(r->tokens.size()), r->num_computed,
                              static_cast<int32_t>(r->blocks.size()),
                              static_cast<int32_t>(shared)});
  }
  // The first blocks still being computed: a waiting request that begins with one of them
  // waits (and, FCFS, so does everything behind it) until it can share it.
  computing_keys_.clear();
  for (auto& r : running_)
    if (r->first_block_key != 0 && !r->took_shared &&
        r->num_computed + 1 < static_cast<int32_t>(r->tokens.size()))
      computing_keys_.push_back(r->first_block_key);
  // A waiting request is planned with the published prefix it would take (peeked, not taken:
  // a request that waits holds no blocks); BuildBatch takes it on admission.
  const int32_t bs = options_.block_size;
  for (auto& r : waiting_) {
    const uint64_t key = r->first_block_key;
    if (key != 0 && std::find(computing_keys_.begin(), computing_keys_.end(), key) !=
                        computing_keys_.end())
      break;
    SeqState state{static_cast<int32_t>(r->tokens.size()), r->num_computed,
                   static_cast<int32_t>(r->blocks.size())};
    r->prefix_blocks = 0;
    if (r->num_computed == 0 && r->blocks.empty()) {
      int cached = 0;
      // At least one token is left to compute: its logits give the next token.
      const int max_blocks = static_cast<int>((r->tokens.size() - 1) / bs);
      r->prefix_blocks = blocks.PeekPrefix(r->tokens, max_blocks, &cached);
      state.num_computed = r->prefix_blocks * bs;
      state.num_blocks = r->prefix_blocks;
      state.cached_blocks = cached;
    }
    if (key != 0 && r->prefix_blocks == 0 && state.num_computed + 1 < state.num_tokens)
      computing_keys_.push_back(key);
    waiting_state_.push_back(state);
  }
  StepLimits limits{options_.token_budget, options_.max_batch_size, options_.block_size,
                    options_.policy};
  return ScheduleEngineStep(running_state_, waiting_state_, limits, blocks.num_free());
}

void BatchEngine::TakeSharedPrefix(Request& r) {
  const int32_t bs = options_.block_size;
  const int matched = cache_->blocks().MatchPrefix(r.tokens, r.prefix_blocks, &r.blocks);
  TANDEM_CHECK(matched == r.prefix_blocks, "request " + r.id + ": its shared prefix changed "
                                           "between planning and admission");
  r.num_computed = matched * bs;
  r.published = matched;
  r.took_shared = true;
  r.prefix_blocks = 0;
  TANDEM_LOG_REQ(kDebug, r.id) << "shares " << r.num_computed << " tokens of KV";
  if (shared_tokens_ != nullptr) shared_tokens_->Inc(r.num_computed);
}

void BatchEngine::PublishFilled(Request& r) {
  if (r.arrival != nullptr) return;  // pulled KV still arriving: published once it is in
  const int32_t bs = options_.block_size;
  const int32_t filled =
      std::min<int32_t>(r.num_computed / bs, static_cast<int32_t>(r.blocks.size()));
  if (r.published == 0 && filled > 0) {
    // The same prefix may be here already (the n choices of one prompt each pulled it from
    // prefill): keep one copy. r's own blocks are unshared until it publishes them.
    twins_.clear();
    const int matched = cache_->blocks().MatchPrefix(r.tokens, filled, &twins_);
    if (matched > 0) {
      cache_->blocks().Free(std::span<const int32_t>(r.blocks).first(matched));
      std::copy(twins_.begin(), twins_.end(), r.blocks.begin());
      r.published = matched;
      TANDEM_LOG_REQ(kDebug, r.id) << "shares " << matched * bs << " tokens of KV (deduplicated)";
      if (shared_tokens_ != nullptr) shared_tokens_->Inc(matched * bs);
    }
  }
  cache_->blocks().PublishRun(r.blocks, r.tokens, r.published, filled);
  r.published = std::max(r.published, filled);
}

void BatchEngine::Preempt(std::vector<size_t> victims) {
  // Recompute: free the victims' blocks and put them back at the front of the waiting queue,
  // oldest first, so that they are the next to be admitted.
  std::sort(victims.begin(), victims.end());
  for (auto it = victims.rbegin(); it != victims.rend(); ++it) {
    auto& r = running_[*it];
    TANDEM_LOG_REQ(kInfo, r->id) << "preempted (recompute " << r->tokens.size() << " tokens)";
    WaitArrivalEnded(*r);  // nothing may write into freed blocks
    cache_->blocks().Free(r->blocks);
    r->blocks.clear();
    r->num_computed = 0;
    r->published = 0;
    r->took_shared = false;
    waiting_.push_front(std::move(r));
    running_.erase(running_.begin() + static_cast<long>(*it));
    if (preemptions_ != nullptr) preemptions_->Inc();
  }
}

BatchEngine::StepShape BatchEngine::BuildBatch(const StepPlan& plan) {
  // Admitted waiting requests join the running set (in order) after the running ones; the plan
  // lists running first, so indices of admitted ones refer to the waiting queue before removal.
  batch_.clear();
  inputs_.clear();
  size_t admitted = 0;
  for (const ScheduledSeq& s : plan.scheduled) {
    if (s.from_waiting) {
      TANDEM_CHECK(s.index == admitted, "waiting requests are admitted FCFS");
      ++admitted;
    }
  }
  for (size_t k = 0; k < admitted; ++k) {
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  const size_t first_admitted = running_.size() - admitted;
  // Admitted requests take their shared prefixes before anything is allocated: Allocate may
  // evict cached blocks, and the plan counted on these.
  for (size_t k = first_admitted; k < running_.size(); ++k)
    if (running_[k]->prefix_blocks > 0) TakeSharedPrefix(*running_[k]);
  StepShape shape;
  for (const ScheduledSeq& s : plan.scheduled) {
    Request* r = s.from_waiting ? running_[first_admitted + s.index].get()
                                : running_[s.index].get();
    Status alloc = cache_->blocks().Allocate(s.new_blocks, &r->blocks);
    TANDEM_CHECK(alloc.ok(), "the scheduler only plans blocks that are free: " + alloc.message());
    const int32_t remaining = static_cast<int32_t>(r->tokens.size()) - r->num_computed;
    if (remaining > 1 || s.from_waiting) shape.prefill_tokens += s.num_tokens;
    shape.batch += 1;
    shape.context += static_cast<int64_t>(r->tokens.size());
    inputs_.push_back({std::span<const int32_t>(r->tokens).subspan(r->num_computed, s.num_tokens),
                       r->num_computed, r->blocks});
    batch_.push_back(r);
  }
  return shape;
}

std::span<const float> BatchEngine::RunForward(StepShape* shape) {
  // Layer-wise: before layer l, wait until layer l of every request whose KV is still arriving
  // has landed; a request whose layer does not come has its output discarded.
  landed_.assign(batch_.size(), 1);
  bool arriving = false;
  for (Request* r : batch_) arriving = arriving || r->arrival != nullptr;
  ForwardHooks hooks;
  double kv_wait_s = 0;  // of the forward pass, spent waiting for arriving layers
  if (arriving) {
    hooks.before_layer = [this, &kv_wait_s](int layer) {
      const auto wait_start = Clock::now();
      for (size_t i = 0; i < batch_.size(); ++i) {
        const std::shared_ptr<KvArrival>& arrival = batch_[i]->arrival;
        if (arrival == nullptr || !landed_[i]) continue;
        if (!arrival->WaitLayer(layer, KvArrival::Clock::now() + options_.kv_wait_timeout))
          landed_[i] = 0;
      }
      kv_wait_s += std::chrono::duration<double>(Clock::now() - wait_start).count();
    };
  }
  // Rows whose next token is the plain argmax (or whose logits nobody reads: a prompt chunk
  // that is not the last), or that the backend draws itself (draws_rows: a device), let the
  // backend keep the logits where they are.
  greedy_wanted_.assign(batch_.size(), 1);
  greedy_argmax_.assign(batch_.size(), -1);
  greedy_draws_.assign(batch_.size(), RowDraw{});
  greedy_logprobs_.resize(batch_.size());
  greedy_edits_.clear();
  greedy_edit_begin_.assign(1, 0);
  for (size_t i = 0; i < batch_.size(); ++i) {
    const Request& r = *batch_[i];
    // With its score edits (logit_bias, penalties): a few microseconds a row (perf/README.md).
    if (r.num_computed + inputs_[i].tokens.size() == r.tokens.size())
      greedy_wanted_[i] = r.sampler->NextPickedByBackend(r.tokens, forward_->draws_rows(),
                                                         &greedy_draws_[i], &greedy_edits_);
    greedy_edit_begin_.push_back(static_cast<int32_t>(greedy_edits_.size()));
  }
  GreedyRows greedy{greedy_wanted_,  greedy_argmax_, greedy_draws_,
                    greedy_logprobs_, greedy_edits_,  greedy_edit_begin_};
  const auto forward_start = Clock::now();
  StatusOr<std::span<const float>> logits = forward_->Forward(
      inputs_, *cache_, LogitsMode::kLastToken, arriving ? &hooks : nullptr, &greedy);
  // The forward pass's compute: what a latency model (tandem profile) times.
  shape->forward_s =
      std::chrono::duration<double>(Clock::now() - forward_start).count() - kv_wait_s;
  shape->kv_wait_s = kv_wait_s;
  TANDEM_CHECK(logits.ok(), "forward of a scheduled batch failed: " + logits.status().ToString());
  return *logits;
}

void BatchEngine::SampleBatch(std::span<const float> logits, EngineSink& sink) {
  const size_t vocab = static_cast<size_t>(model_.config().vocab_size);
  // First every row that samples on the host, on the sampling threads; then, in row order on
  // this thread, what each row's token does.
  sample_jobs_.clear();
  sample_of_row_.assign(batch_.size(), -1);
  for (size_t i = 0; i < batch_.size(); ++i) {
    // Not wanted as greedy: a last chunk that needs the Sampler (RunForward).
    if (!landed_[i] || greedy_wanted_[i]) continue;
    const Request& r = *batch_[i];
    sample_of_row_[i] = static_cast<int32_t>(sample_jobs_.size());
    sample_jobs_.push_back({r.sampler.get(), logits.subspan(i * vocab, vocab), r.tokens});
  }
  sample_results_.resize(sample_jobs_.size());
  sampling_->Run(sample_jobs_, sample_results_);
  std::vector<std::string> finished;
  for (size_t i = 0; i < batch_.size(); ++i) {
    Request& r = *batch_[i];
    if (!landed_[i]) {
      TANDEM_LOG_REQ(kInfo, r.id) << "KV did not arrive in time for this step; output discarded";
      continue;
    }
    r.num_computed += static_cast<int32_t>(inputs_[i].tokens.size());
    PublishFilled(r);
    if (r.num_computed < static_cast<int32_t>(r.tokens.size())) continue;  // mid-prompt chunk
    SampleResult sample;
    if (greedy_wanted_[i]) {  // the argmax or the draw, taken where the logits are
      TANDEM_CHECK(greedy_argmax_[i] >= 0, "no finite logit to sample from");
      sample = DrawnSample(greedy_argmax_[i], greedy_draws_[i], greedy_logprobs_[i]);
    } else {
      TANDEM_CHECK(sample_of_row_[i] >= 0, "a sampled row without its sample");
      sample = sample_results_[sample_of_row_[i]];
    }
    r.tokens.push_back(sample.token_id);
    StopUpdate update = r.stop->Append(sample.token_id, "");
    Tokens out;
    out.request_id = r.id;
    GeneratedToken record;
    record.token_id = sample.token_id;
    record.logprob = sample.logprob;
    for (const TokenLogprob& t : sample.top())
      record.top_logprobs.push_back({t.token_id, t.logprob});
    out.tokens.push_back(std::move(record));
    sink.OnTokens(std::move(out));
    if (update.finished()) {
      Finish f;
      f.request_id = r.id;
      f.finish_reason = std::string(FinishReasonName(update.finish_reason));
      f.completion_tokens = r.stop->num_tokens();
      FinishRequest(r, std::move(f), sink);
      finished.push_back(r.id);
    }
  }
  for (const std::string& id : finished) {
    auto it = std::find_if(running_.begin(), running_.end(),
                           [&](const auto& r) { return r->id == id; });
    running_.erase(it);
  }
}

void BatchEngine::RecordStep(const StepShape& shape, double seconds) {
  if (step_seconds_ != nullptr) step_seconds_->Observe(seconds);
  // A trace of every step at debug level: what the simulator's replay of a run can be compared
  // with step by step.
  TANDEM_LOG(kDebug) << "step: " << shape.batch << " sequences, " << shape.prefill_tokens
                     << " prompt tokens, context " << shape.context << ", forward "
                     << shape.forward_s * 1e3 << " ms, kv wait " << shape.kv_wait_s * 1e3
                     << " ms, step " << seconds * 1e3 << " ms";
  if (shape.prefill_tokens > 0) {
    avg_prefill_s_per_token_.Add(seconds / static_cast<double>(shape.prefill_tokens));
  } else {
    avg_decode_step_s_.Add(seconds);
    avg_decode_forward_s_.Add(shape.forward_s);
    avg_decode_batch_.Add(static_cast<double>(shape.batch));
    avg_decode_context_.Add(static_cast<double>(shape.context));
  }
}

bool BatchEngine::Step(EngineSink& sink) {
  if (idle()) return false;
  const auto t0 = Clock::now();
  StepPlan plan = PlanStep();
  if (!plan.preempted.empty()) Preempt(plan.preempted);
  if (plan.scheduled.empty()) return !plan.preempted.empty();
  StepShape shape = BuildBatch(plan);
  std::span<const float> logits = RunForward(&shape);
  SampleBatch(logits, sink);
  RecordStep(shape, std::chrono::duration<double>(Clock::now() - t0).count());
  return true;
}

EngineStats BatchEngine::Stats() const {
  EngineStats s;
  s.running = static_cast<int32_t>(running_.size());
  s.waiting = static_cast<int32_t>(waiting_.size());
  for (const auto& r : waiting_) s.waiting_prompt_tokens += r->tokens.size() - r->num_computed;
  for (const auto& r : running_) s.context_tokens += r->tokens.size();
  s.free_blocks = cache_->blocks().num_free();
  s.total_blocks = cache_->num_blocks();
  s.decode_step_seconds = avg_decode_step_s_.value();
  s.decode_forward_seconds = avg_decode_forward_s_.value();
  s.decode_step_batch = avg_decode_batch_.value();
  s.decode_step_context_tokens = avg_decode_context_.value();
  s.prefill_seconds_per_token = avg_prefill_s_per_token_.value();
  return s;
}

}  // namespace tandem
