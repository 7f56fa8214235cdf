#include "prefill/prefill_engine.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "common/serving/instance_setup.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t RandomSeed() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd();
}

}  // namespace

PrefillEngine::PrefillEngine(const Model& model, PrefillEngineOptions options)
    : model_(model), options_(std::move(options)) {}

ForwardOptions PrefillEngine::BackendOptions(const PrefillEngineOptions& o) {
  ForwardOptions fo;
  fo.num_threads = o.threads;
  fo.max_batch_tokens = o.token_budget;
  fo.max_batch_sequences = o.max_batch_size;
  fo.max_model_len = o.max_model_len;
  fo.tensor_parallel = o.tensor_parallel;
  fo.kv_dtype = o.kv_dtype;
  return fo;
}

StatusOr<std::unique_ptr<PrefillEngine>> PrefillEngine::Create(const Model& model,
                                                               PrefillEngineOptions options) {
  std::unique_ptr<PrefillEngine> engine(new PrefillEngine(model, std::move(options)));
  PrefillEngineOptions& o = engine->options_;
  for (int id : model.config().eos_token_ids) engine->eos_ids_.push_back(id);
  engine->workspace_ = std::make_unique<SamplerWorkspace>(model.config().vocab_size);
  const ForwardOptions fo = BackendOptions(o);
  TANDEM_ASSIGN_OR_RETURN(engine->forward_, o.make_backend
                                                ? o.make_backend(model, fo)
                                                : CreateForwardBackend(model, fo, o.device));
  engine->sampling_ =
      std::make_unique<BatchSampling>(std::max(o.threads, 1), model.config().vocab_size);
  TANDEM_ASSIGN_OR_RETURN(engine->cache_, CreateKvCacheFor(*engine->forward_, o.block_size,
                                                            o.kv_blocks, std::move(o.kv_pools)));
  o.kv_pools.clear();  // the cache holds them now
  engine->cache_->blocks().SetCaching(o.prefix_caching);
  if (o.metrics != nullptr) {
    engine->batch_seconds_ = &o.metrics
                                  ->AddHistogram("tandem_prefill_batch_seconds",
                                                 "Wall time of one prefill batch (forward + "
                                                 "sampling).",
                                                 {}, LatencyBuckets())
                                  .Get();
    engine->shared_tokens_ = &o.metrics
                                  ->AddCounter("tandem_prefix_shared_tokens_total",
                                               "Tokens whose KV a request took from another "
                                               "request's blocks (a shared prefix) instead of "
                                               "computing it.")
                                  .Get();
  }
  return engine;
}

Status PrefillEngine::Validate(const std::vector<int32_t>& prompt,
                               const SamplingParams& sampling) const {
  TANDEM_RETURN_IF_ERROR(
      CheckRequest(prompt, sampling, model_.config().vocab_size, options_.max_model_len));
  if (BlocksForTokens(prompt.size(), options_.block_size) > cache_->num_blocks())
    return TooLarge("prompt needs more KV blocks than the instance has");
  return Status();
}

void PrefillEngine::Add(std::string id, std::vector<int32_t> prompt, SamplingParams sampling) {
  auto r = std::make_unique<PrefillRequest>();
  r->id = std::move(id);
  r->prompt = std::move(prompt);
  r->sampling = std::move(sampling);
  if (!r->sampling.seed) r->sampling.seed = RandomSeed();
  r->first_block_key = cache_->blocks().FirstBlockKey(r->prompt);
  queue_.push_back(std::move(r));
}

bool PrefillEngine::Cancel(const std::string& id) {
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    if ((*it)->id != id) continue;
    FreeBlocks((*it)->blocks);
    queue_.erase(it);
    return true;
  }
  return false;
}

std::vector<std::string> PrefillEngine::QueuedIds() const {
  std::vector<std::string> ids;
  for (const auto& r : queue_) ids.push_back(r->id);
  return ids;
}

int64_t PrefillEngine::queued_tokens() const {
  int64_t n = 0;
  for (const auto& r : queue_) n += static_cast<int64_t>(r->prompt.size()) - r->num_computed;
  return n;
}

int64_t PrefillEngine::PrepareBatch(const std::vector<PrefillChunk>& batch) {
  inputs_.clear();
  int64_t tokens = 0;
  for (const PrefillChunk& c : batch) {
    PrefillRequest& r = *queue_[c.index];
    Status alloc = cache_->blocks().Allocate(c.new_blocks, &r.blocks);
    TANDEM_CHECK(alloc.ok(), "the scheduler only plans blocks that are free");
    inputs_.push_back({std::span<const int32_t>(r.prompt).subspan(r.num_computed, c.num_tokens),
                       r.num_computed, r.blocks});
    tokens += c.num_tokens;
  }
  return tokens;
}

void PrefillEngine::Complete(PrefillRequest& r, const SampleResult& sample,
                             PrefillObserver& observer) {
  Prefilled done;
  done.first.token_id = sample.token_id;
  done.first.logprob = sample.logprob;
  for (const TokenLogprob& t : sample.top())
    done.first.top_logprobs.push_back({t.token_id, t.logprob});
  StopChecker stop(r.sampling, eos_ids_);
  StopUpdate update = stop.Append(sample.token_id, "");
  if (update.finished()) done.finish = update.finish_reason;
  done.request = std::move(r);
  observer.OnPrefilled(std::move(done));
}

void PrefillEngine::TakeSharedPrefix(PrefillRequest& r) {
  const int matched = cache_->blocks().MatchPrefix(r.prompt, r.prefix_blocks, &r.blocks);
  TANDEM_CHECK(matched == r.prefix_blocks, "request " + r.id + ": its shared prefix changed "
                                           "between planning and scheduling");
  r.num_computed = matched * options_.block_size;
  r.published = matched;
  r.took_shared = true;
  r.prefix_blocks = 0;
  if (shared_tokens_ != nullptr) shared_tokens_->Inc(r.num_computed);
}

void PrefillEngine::PublishFilled(PrefillRequest& r) {
  const int32_t filled = r.num_computed / options_.block_size;
  cache_->blocks().PublishRun(r.blocks, r.prompt, r.published, filled);
  r.published = std::max(r.published, filled);
}

void PrefillEngine::CollectItems() {
  items_.clear();
  computing_keys_.clear();
  for (auto& r : queue_) {
    const uint64_t key = r->first_block_key;
    if (key != 0 && std::find(computing_keys_.begin(), computing_keys_.end(), key) !=
                        computing_keys_.end())
      break;
    PrefillItem item{static_cast<int32_t>(r->prompt.size()), r->num_computed,
                     static_cast<int32_t>(r->blocks.size())};
    // One not started yet is planned with the published prefix it would take (peeked, not
    // taken: a request that waits holds no blocks); Step takes it when it is scheduled.
    r->prefix_blocks = 0;
    if (r->num_computed == 0 && r->blocks.empty()) {
      // At least one prompt token is left to compute: its logits give the first token.
      const int max_blocks = static_cast<int>((r->prompt.size() - 1) / options_.block_size);
      r->prefix_blocks = cache_->blocks().PeekPrefix(r->prompt, max_blocks, &item.cached_blocks);
      item.num_computed = r->prefix_blocks * options_.block_size;
      item.num_blocks = r->prefix_blocks;
    }
    if (key != 0 && !r->took_shared && r->prefix_blocks == 0) computing_keys_.push_back(key);
    items_.push_back(item);
  }
}

bool PrefillEngine::Step(PrefillObserver& observer) {
  if (queue_.empty()) return false;
  const auto t0 = Clock::now();
  CollectItems();
  PrefillLimits limits{options_.token_budget, options_.max_batch_size, options_.block_size};
  std::vector<PrefillChunk> batch = SchedulePrefill(items_, limits, cache_->blocks().num_free());
  // Scheduled requests take their shared prefixes before anything is allocated: Allocate may
  // evict cached blocks, and the plan counted on these.
  for (const PrefillChunk& c : batch)
    if (queue_[c.index]->prefix_blocks > 0) TakeSharedPrefix(*queue_[c.index]);
  if (batch.empty()) return false;
  const int64_t tokens = PrepareBatch(batch);
  bool observe_layers = false;
  for (const PrefillChunk& c : batch) {
    PrefillRequest& r = *queue_[c.index];
    if (r.num_computed + c.num_tokens == static_cast<int32_t>(r.prompt.size()))
      observe_layers = observer.BeforeLastChunk(r) || observe_layers;
  }
  ForwardHooks hooks;
  if (observe_layers)
    hooks.after_layer = [&observer](int layer) { observer.OnLayerComputed(layer); };
  // Rows whose first token is the plain argmax (or that are not the last chunk), or that the
  // backend draws itself (draws_rows: a device), let the backend keep the logits where they are.
  std::vector<uint8_t> greedy_wanted(batch.size(), 1);
  std::vector<int32_t> greedy_argmax(batch.size(), -1);
  std::vector<RowDraw> draws(batch.size());
  std::vector<RowLogprobs> drawn_logprobs(batch.size());
  std::vector<ScoreEdit> edits;  // the rows' score edits (logit_bias, penalties)
  std::vector<int32_t> edit_begin{0};
  std::vector<std::unique_ptr<Sampler>> samplers(batch.size());  // of the last chunks
  for (size_t i = 0; i < batch.size(); ++i) {
    const PrefillRequest& r = *queue_[batch[i].index];
    if (r.num_computed + batch[i].num_tokens == static_cast<int32_t>(r.prompt.size())) {
      samplers[i] = std::make_unique<Sampler>(r.sampling, workspace_.get(), r.prompt.size(),
                                              eos_ids_);
      greedy_wanted[i] = samplers[i]->NextPickedByBackend(r.prompt, forward_->draws_rows(),
                                                          &draws[i], &edits);
    }
    edit_begin.push_back(static_cast<int32_t>(edits.size()));
  }
  GreedyRows greedy{greedy_wanted, greedy_argmax, draws, drawn_logprobs, edits, edit_begin};
  StatusOr<std::span<const float>> logits = forward_->Forward(
      inputs_, *cache_, LogitsMode::kLastToken, observe_layers ? &hooks : nullptr, &greedy);
  TANDEM_CHECK(logits.ok(), "forward of a scheduled batch failed: " + logits.status().ToString());
  const size_t vocab = static_cast<size_t>(model_.config().vocab_size);
  // The first tokens that sample on the host, on the sampling threads, then in order here.
  std::vector<BatchSampling::Job> jobs;
  std::vector<int32_t> job_of_row(batch.size(), -1);
  for (size_t i = 0; i < batch.size(); ++i) {
    if (greedy_wanted[i]) continue;  // not wanted: a last chunk that needs the Sampler
    const PrefillRequest& r = *queue_[batch[i].index];
    job_of_row[i] = static_cast<int32_t>(jobs.size());
    jobs.push_back({samplers[i].get(), logits->subspan(i * vocab, vocab), r.prompt});
  }
  std::vector<SampleResult> sampled(jobs.size());
  sampling_->Run(jobs, sampled);
  std::vector<size_t> done;
  for (size_t i = 0; i < batch.size(); ++i) {
    PrefillRequest& r = *queue_[batch[i].index];
    r.num_computed += batch[i].num_tokens;
    PublishFilled(r);
    if (r.num_computed < static_cast<int32_t>(r.prompt.size())) continue;
    done.push_back(batch[i].index);
    SampleResult sample;
    if (greedy_wanted[i]) {  // the argmax or the draw, taken where the logits are
      TANDEM_CHECK(greedy_argmax[i] >= 0, "no finite logit to sample from");
      sample = DrawnSample(greedy_argmax[i], draws[i], drawn_logprobs[i]);
    } else {
      sample = sampled[job_of_row[i]];
    }
    Complete(r, sample, observer);
  }
  std::sort(done.begin(), done.end());
  for (auto it = done.rbegin(); it != done.rend(); ++it)
    queue_.erase(queue_.begin() + static_cast<long>(*it));
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (batch_seconds_ != nullptr) batch_seconds_->Observe(seconds);
  avg_s_per_token_.Add(seconds / static_cast<double>(tokens));
  return true;
}

}  // namespace tandem
