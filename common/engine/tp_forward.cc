#include "common/engine/tp_forward.h"

#include <string>
#include <utility>

#include "common/engine/cpu_all_reduce.h"
#include "common/engine/forward.h"

namespace tandem {

// ---- LayerGate ---------------------------------------------------------------------------------

void TpForward::LayerGate::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  released_ = -1;
  in_hook_ = false;
  failed_ = false;
}

void TpForward::LayerGate::Enter() {
  std::lock_guard<std::mutex> lock(mu_);
  in_hook_ = true;
}

void TpForward::LayerGate::Release(int layer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = layer;
    in_hook_ = false;
  }
  cv_.notify_all();
}

void TpForward::LayerGate::Fail() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed_ = true;
  }
  cv_.notify_all();
}

TpForward::LayerGate::Wait TpForward::LayerGate::WaitFor(int layer,
                                                          std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!failed_ && released_ < layer) {
    if (cv_.wait_until(lock, deadline) != std::cv_status::timeout) continue;
    if (in_hook_)  // rank 0 waits in its hook, which bounds its own wait
      deadline = std::chrono::steady_clock::now() + timeout;
    else if (!failed_ && released_ < layer)
      return Wait::kTimedOut;
  }
  return failed_ ? Wait::kFailed : Wait::kReleased;
}

// ---- TpForward ---------------------------------------------------------------------------------

TpForward::TpForward(const Model& full, TpPlan plan, std::vector<Rank> ranks,
                     TpCollective collective, std::chrono::milliseconds timeout,
                     std::string description)
    : full_(full),
      plan_(std::move(plan)),
      collective_(std::move(collective)),
      ranks_(std::move(ranks)),
      timeout_(timeout),
      description_(std::move(description)),
      rank_hooks_(plan_.degree),
      forward_status_(plan_.degree),
      collective_status_(plan_.degree),
      threads_(plan_.degree) {}

TpForward::~TpForward() = default;

StatusOr<std::unique_ptr<TpForward>> TpForward::Create(const Model& full, TpPlan plan,
                                                       std::vector<Rank> ranks,
                                                       TpCollective collective,
                                                       std::chrono::milliseconds timeout,
                                                       std::string description) {
  if (static_cast<int>(ranks.size()) != plan.degree || plan.degree < 1)
    return InvalidArgument("tensor-parallel forward: " + std::to_string(ranks.size()) +
                           " ranks for tensor_parallel " + std::to_string(plan.degree));
  if (timeout.count() <= 0)
    return InvalidArgument("tensor-parallel forward: the collective timeout must be positive");
  for (const Rank& r : ranks)
    if (r.forward == nullptr || r.forward->MakeKvLayout() != ranks[0].forward->MakeKvLayout())
      return InvalidArgument("tensor-parallel forward: the ranks' KV layouts differ");
  return std::unique_ptr<TpForward>(new TpForward(full, std::move(plan), std::move(ranks),
                                                  std::move(collective), timeout,
                                                  std::move(description)));
}

KvLayout TpForward::MakeKvLayout(int block_size) const {
  return ranks_[0].forward->MakeKvLayout(block_size);
}

StatusOr<KvPoolMemory> TpForward::AllocateKvPool(size_t bytes) {
  std::vector<KvPoolMemory> memory;
  for (Rank& rank : ranks_) {
    TANDEM_ASSIGN_OR_RETURN(KvPoolMemory one, rank.forward->AllocateKvPool(bytes));
    memory.push_back(std::move(one));
  }
  return AdoptKvPools(std::move(memory));
}

StatusOr<KvPoolMemory> TpForward::AdoptKvPools(std::vector<KvPoolMemory> memory) {
  if (static_cast<int>(memory.size()) != plan_.degree)
    return InvalidArgument(std::to_string(memory.size()) + " KV pools for tensor_parallel " +
                           std::to_string(plan_.degree));
  for (const KvPoolMemory& m : memory)
    if (m.base == nullptr || m.kind != memory[0].kind || m.bytes != memory[0].bytes)
      return InvalidArgument("tensor-parallel forward: the ranks' KV pools differ in size or kind");
  auto pools = std::make_shared<RankPools>();
  pools->views.resize(plan_.degree);
  pools->memory = std::move(memory);
  // Drop what is gone, then register this one under rank 0's base.
  for (auto it = pools_.begin(); it != pools_.end();)
    it = it->second.expired() ? pools_.erase(it) : std::next(it);
  pools_[pools->memory[0].base] = pools;
  KvPoolMemory rank0 = pools->memory[0];
  // The engine's pool owns every rank's: they go together.
  rank0.owner = std::shared_ptr<void>(pools, pools->memory[0].base);
  return rank0;
}

StatusOr<std::vector<KvCache*>> TpForward::RankCaches(KvCache& cache) {
  auto found = pools_.find(cache.data());
  std::shared_ptr<RankPools> pools = found == pools_.end() ? nullptr : found->second.lock();
  if (pools == nullptr)
    return InvalidArgument("tensor-parallel forward: the KV pool was not made by this backend's "
                           "AllocateKvPool (each rank keeps its own pool)");
  std::vector<KvCache*> caches{&cache};
  for (int r = 1; r < plan_.degree; ++r) {
    std::unique_ptr<KvCache>& view = pools->views[r];
    if (view == nullptr || view->layout() != cache.layout() ||
        view->num_blocks() != cache.num_blocks()) {
      TANDEM_ASSIGN_OR_RETURN(view,
                              KvCache::Create(cache.layout(), cache.num_blocks(), pools->memory[r]));
    }
    caches.push_back(view.get());
  }
  return caches;
}

bool TpForward::broken() const {
  std::lock_guard<std::mutex> lock(broken_mu_);
  return broken_;
}

void TpForward::Break(const Status& cause) {
  {
    std::lock_guard<std::mutex> lock(broken_mu_);
    if (broken_) return;
    broken_ = true;
    broke_with_ = cause;
  }
  gate_.Fail();
  if (collective_.abort) collective_.abort();
}

StatusOr<std::span<const float>> TpForward::Forward(std::span<const SequenceInput> batch,
                                                    KvCache& cache, LogitsMode mode,
                                                    const ForwardHooks* hooks,
                                                    GreedyRows* greedy) {
  TANDEM_ASSIGN_OR_RETURN(std::vector<KvCache*> caches, RankCaches(cache));
  return ForwardRanks(batch, caches, mode, hooks, greedy);
}

void TpForward::RunRank(int rank) {
  StatusOr<std::span<const float>> out = ranks_[rank].forward->Forward(
      batch_, *caches_[rank], mode_, &rank_hooks_[rank], rank == 0 ? greedy_ : nullptr);
  forward_status_[rank] = out.status();
  if (rank == 0 && out.ok()) logits_ = *out;
  // A refused batch is refused by every rank before it computes (they check the same batch
  // against the same layout): nobody waits. Anything else may leave the others waiting.
  const StatusCode code = out.status().code();
  if (!out.ok() && code != StatusCode::kInvalidArgument && code != StatusCode::kTooLarge)
    Break(out.status().WithContext("tensor-parallel rank " + std::to_string(rank)));
  if (rank == 0 && !out.ok()) gate_.Fail();
}

StatusOr<std::span<const float>> TpForward::ForwardRanks(std::span<const SequenceInput> batch,
                                                         std::span<KvCache* const> caches,
                                                         LogitsMode mode,
                                                         const ForwardHooks* hooks,
                                                         GreedyRows* greedy) {
  const int t = plan_.degree;
  if (static_cast<int>(caches.size()) != t)
    return InvalidArgument("tensor-parallel forward: " + std::to_string(caches.size()) +
                           " KV pools for " + std::to_string(t) + " ranks");
  // Checked here so that every rank's own checks give the same answer: a rank that refused the
  // batch alone would leave the others waiting in the collective.
  for (int r = 0; r < t; ++r) {
    if (caches[r] == nullptr ||
        caches[r]->layout() != MakeKvLayout(caches[r]->layout().block_size) ||
        caches[r]->layout() != caches[0]->layout() ||
        caches[r]->num_blocks() != caches[0]->num_blocks())
      return InvalidArgument("tensor-parallel forward: rank " + std::to_string(r) +
                             "'s KV pool is not one of MakeKvLayout's layout (" +
                             MakeKvLayout().ToString() + ") and rank 0's size");
  }
  if (hooks != nullptr && hooks->all_reduce)
    return InvalidArgument("tensor-parallel forward: the all_reduce hook is the ranks' own");
  // Only rank 0 is given `greedy`: checked here, so that it cannot refuse alone.
  TANDEM_RETURN_IF_ERROR(ValidateGreedyRows(greedy, batch.size(), mode,
                                            ranks_[0].shard->config().vocab_size));
  if (broken())
    return FailedPrecondition("tensor-parallel forward: a rank failed in an earlier call (the "
                              "collective was aborted)");
  batch_ = batch;
  caches_ = caches;
  mode_ = mode;
  greedy_ = greedy;
  gate_.Reset();
  const bool gated = hooks != nullptr && static_cast<bool>(hooks->before_layer);
  for (int r = 0; r < t; ++r) {
    ForwardHooks& h = rank_hooks_[r];
    h = ForwardHooks{};
    if (r == 0 && hooks != nullptr) {
      h.after_layer = hooks->after_layer;
      if (gated)
        h.before_layer = [this, hooks](int layer) {
          gate_.Enter();
          hooks->before_layer(layer);
          gate_.Release(layer);
        };
    } else if (gated) {
      // A failed wait cannot be returned from a hook: the rank goes on into a collective that
      // is aborted. A timeout is this rank's failure; a failed gate is another's.
      h.before_layer = [this, r](int layer) {
        if (gate_.WaitFor(layer, timeout_) == LayerGate::Wait::kTimedOut)
          Break(DeadlineExceeded("tensor-parallel forward: rank " + std::to_string(r) +
                                 " waited " + std::to_string(timeout_.count()) +
                                 " ms for rank 0 to release layer " + std::to_string(layer)));
      };
    }
    if (collective_.host_all_reduce)
      h.all_reduce = [this, r](float* data, size_t count) {
        Status s = collective_.host_all_reduce(r, data, count);
        if (s.ok()) return;
        if (collective_status_[r].ok()) collective_status_[r] = s;
        // FailedPrecondition: broken by another rank's failure, which is the cause.
        if (s.code() != StatusCode::kFailedPrecondition) Break(s);
      };
    collective_status_[r] = Status::Ok();
  }
  // Bounded: a rank waits for another only in the collective or at the gate, both bounded.
  threads_.Run([this](int rank) { RunRank(rank); });
  {
    // This call broke the backend: what did, not the aborts and failed waits it caused.
    std::lock_guard<std::mutex> lock(broken_mu_);
    if (broken_ && !broke_with_.ok()) return std::exchange(broke_with_, Status::Ok());
  }
  // A timeout first: the FailedPrecondition of the other ranks follows from it.
  for (int r = 0; r < t; ++r)
    if (collective_status_[r].code() == StatusCode::kDeadlineExceeded) return collective_status_[r];
  for (int r = 0; r < t; ++r) TANDEM_RETURN_IF_ERROR(collective_status_[r]);
  for (int r = 0; r < t; ++r) TANDEM_RETURN_IF_ERROR(forward_status_[r]);
  return logits_;
}

StatusOr<std::unique_ptr<TpForward>> CreateTpCpuForward(
    const Model& full, int degree, const ForwardOptions& options,
    std::chrono::milliseconds collective_timeout) {
  TANDEM_ASSIGN_OR_RETURN(TpPlan plan, MakeTpPlan(full.config(), degree));
  if (collective_timeout.count() <= 0)
    return InvalidArgument("tensor-parallel forward: the collective timeout must be positive");
  std::vector<TpForward::Rank> ranks;
  for (int r = 0; r < degree; ++r) {
    TpForward::Rank rank;
    TANDEM_ASSIGN_OR_RETURN(rank.shard, ShardModel(full, plan, r));
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<CpuForward> forward,
                            CpuForward::Create(*rank.shard, options));
    rank.forward = std::move(forward);
    ranks.push_back(std::move(rank));
  }
  auto all_reduce = std::make_shared<CpuAllReduce>(degree, collective_timeout);
  TpCollective collective;
  if (degree > 1)
    collective.host_all_reduce = [sum = all_reduce.get()](int rank, float* data, size_t count) {
      return sum->AllReduce(rank, data, count);
    };
  collective.abort = [sum = all_reduce.get()] { sum->Break(); };
  collective.keep_alive = all_reduce;
  return TpForward::Create(full, std::move(plan), std::move(ranks), std::move(collective),
                           collective_timeout,
                           "cpu tensor_parallel " + std::to_string(degree));
}

}  // namespace tandem
