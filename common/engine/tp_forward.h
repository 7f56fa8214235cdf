// A tensor-parallel forward pass (common/engine/tensor_parallel.h) behind the backend seam: one
// backend per rank over that rank's shard of the model, one thread per rank (RankThreads), the
// ranks' partial sums combined by a collective. Two kinds of ranks share everything here:
//   - CPU (CreateTpCpuForward): CpuForward ranks summed by a CpuAllReduce through
//     ForwardHooks::all_reduce. The host-side reference of the GPU pass: tests check that it
//     equals the unsharded pass, and the re-sharding maps (common/engine/kv_reshard.h) against
//     the pools it fills. The servers do not run it (a CPU instance is one CpuForward: use
//     S.threads).
//   - CUDA (common/engine/cuda/cuda_backend.h, CreateCudaBackend with tensor_parallel > 1):
//     CudaForward ranks on GPUs 0..t-1 of the process, summed by NCCL on their streams.
//
// KV: each rank has its own pool (MakeKvLayout: the rank's KV heads), with the same number of
// blocks; a sequence's block table names the same block ids in every rank's pool. The engine
// sees one KvCache, rank 0's: AllocateKvPool allocates every rank's pool and returns rank 0's,
// whose owner keeps the others alive; Forward finds the others from it (RankCaches). A pool
// that AllocateKvPool did not make is refused.
//
// Hooks: before_layer(l) runs on the calling thread (rank 0), and no rank queues layer l before
// it returned (the other ranks wait at a gate; the wait is bounded by the collective timeout,
// which does not run while rank 0 is inside the hook: the hook bounds its own wait).
// after_layer(l) is rank 0's: on CUDA ranks every rank's K/V of layer l are written by then
// (CudaForward: the o_proj sum waited for them); CPU ranks promise only rank 0's.
//
// Errors: a rank's failure other than a refused batch (the same on every rank) aborts the
// collective, so that no rank waits for it, and breaks this backend for good: every later
// call fails with FailedPrecondition (an instance whose GPU failed is restarted, not healed).
// The call that broke it returns the failure that did (not the aborts it caused).
//
// Threads: Forward and AllocateKvPool are called by one thread at a time (the engine thread).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "common/engine/forward_backend.h"
#include "common/engine/rank_threads.h"
#include "common/engine/tensor_parallel.h"

namespace tandem {

// How the ranks of one TpForward reduce, and how their collective is stopped.
struct TpCollective {
  // Host ranks: sums rank `rank`'s partial sums over the ranks, in place (ForwardHooks::
  // all_reduce). Empty when the ranks reduce on their devices themselves.
  std::function<Status(int rank, float* data, size_t count)> host_all_reduce;
  // Ends every wait in progress and breaks the collective for good. Any thread.
  std::function<void()> abort;
  // Kept alive until the ranks are gone (the NCCL communicators).
  std::shared_ptr<void> keep_alive;
};

class TpForward final : public ForwardBackend {
 public:
  struct Rank {
    std::unique_ptr<Model> shard;               // ShardModel's
    std::unique_ptr<ForwardBackend> forward;    // over *shard
  };

  // `ranks[r]` runs rank r of `plan` over a shard of `full`. `timeout` bounds a rank's wait at
  // the layer gate. InvalidArgument when the counts differ or a rank's KV layout is not rank 0's.
  static StatusOr<std::unique_ptr<TpForward>> Create(const Model& full, TpPlan plan,
                                                     std::vector<Rank> ranks,
                                                     TpCollective collective,
                                                     std::chrono::milliseconds timeout,
                                                     std::string description);
  ~TpForward() override;

  int degree() const { return plan_.degree; }
  const TpPlan& plan() const { return plan_; }
  const Model& shard(int rank) const { return *ranks_[rank].shard; }

  // Every rank's layout (the rank's KV heads).
  KvLayout MakeKvLayout(int block_size = kDefaultBlockSize) const override;
  // One pool of `bytes` per rank, on its backend; returns rank 0's.
  StatusOr<KvPoolMemory> AllocateKvPool(size_t bytes) override;
  // `pools[r]` is rank r's (a transport's, on rank r's device); returns rank 0's.
  StatusOr<KvPoolMemory> AdoptKvPools(std::vector<KvPoolMemory> pools) override;
  // Logits and greedy ids are rank 0's (every rank computes the same: the LM head is
  // replicated). Errors: ForwardBackend's; InvalidArgument when `cache` is not a pool of
  // AllocateKvPool; FailedPrecondition once broken; a rank's error.
  StatusOr<std::span<const float>> Forward(std::span<const SequenceInput> batch, KvCache& cache,
                                           LogitsMode mode = LogitsMode::kLastToken,
                                           const ForwardHooks* hooks = nullptr,
                                           GreedyRows* greedy = nullptr) override;
  // The same over explicit pools, one per rank (each of MakeKvLayout's layout and rank 0's size).
  StatusOr<std::span<const float>> ForwardRanks(std::span<const SequenceInput> batch,
                                                std::span<KvCache* const> caches,
                                                LogitsMode mode = LogitsMode::kLastToken,
                                                const ForwardHooks* hooks = nullptr,
                                                GreedyRows* greedy = nullptr);
  // Every rank's pool behind `cache` (rank 0: cache itself), for a transport that moves them.
  // InvalidArgument when AllocateKvPool did not make it.
  StatusOr<std::vector<KvCache*>> RankCaches(KvCache& cache);

  const Model& model() const override { return full_; }
  bool draws_rows() const override { return ranks_[0].forward->draws_rows(); }  // rank 0 does
  std::string description() const override { return description_; }
  bool broken() const;

 private:
  // The pools of one AllocateKvPool call, and views of ranks 1.. over them.
  struct RankPools {
    std::vector<KvPoolMemory> memory;              // [degree]
    std::vector<std::unique_ptr<KvCache>> views;   // [degree]; [0] unused
  };
  // No rank queues layer l before rank 0's before_layer(l) returned.
  class LayerGate {
   public:
    enum class Wait { kReleased, kTimedOut, kFailed };
    void Reset();
    void Enter();             // rank 0 calls the hook
    void Release(int layer);  // ... and it returned for `layer`
    void Fail();
    // Waits for `layer`'s release; `timeout` counts only while rank 0 is outside the hook.
    Wait WaitFor(int layer, std::chrono::milliseconds timeout);
   private:
    std::mutex mu_;
    std::condition_variable cv_;
    int released_ = -1;    // guarded by mu_
    bool in_hook_ = false;  // guarded by mu_
    bool failed_ = false;  // guarded by mu_
  };

  TpForward(const Model& full, TpPlan plan, std::vector<Rank> ranks, TpCollective collective,
            std::chrono::milliseconds timeout, std::string description);
  void RunRank(int rank);
  // Breaks this backend (the gate, the collective) for good, `cause` the first reason.
  void Break(const Status& cause);

  const Model& full_;
  TpPlan plan_;
  TpCollective collective_;  // before ranks_: its keep_alive outlives them
  std::vector<Rank> ranks_;
  std::chrono::milliseconds timeout_;
  std::string description_;
  std::vector<ForwardHooks> rank_hooks_;  // per rank, for the call in progress
  std::map<const std::byte*, std::weak_ptr<RankPools>> pools_;  // by rank 0's base

  // The call in progress: written by ForwardRanks before it starts the ranks, read by them.
  std::span<const SequenceInput> batch_;
  std::span<KvCache* const> caches_;
  LogitsMode mode_ = LogitsMode::kLastToken;
  GreedyRows* greedy_ = nullptr;
  std::vector<Status> forward_status_;     // per rank, of its backend's Forward
  std::vector<Status> collective_status_;  // per rank, its first host all-reduce failure
  std::span<const float> logits_;          // rank 0's
  LayerGate gate_;

  mutable std::mutex broken_mu_;
  bool broken_ = false;  // guarded by broken_mu_
  Status broke_with_;    // guarded by broken_mu_: the cause, for the call that broke it

  RankThreads threads_;  // last: its destructor joins ranks that may still read the above
};

// CPU ranks: shards `full` `degree` ways, a CpuForward per rank with `options` (num_threads is
// per rank), summed by a CpuAllReduce whose waits `collective_timeout` bounds. Errors:
// MakeTpPlan's, ShardModel's, CpuForward::Create's.
StatusOr<std::unique_ptr<TpForward>> CreateTpCpuForward(
    const Model& full, int degree, const ForwardOptions& options,
    std::chrono::milliseconds collective_timeout);

}  // namespace tandem
