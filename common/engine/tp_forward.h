// A tensor-parallel CPU forward pass: one CpuForward per rank over that rank's shard of a model
// (common/engine/tensor_parallel.h), one thread per rank, the ranks' partial sums combined by a
// CpuAllReduce (common/engine/cpu_all_reduce.h) through ForwardHooks::all_reduce. It is the
// host-side reference of what a GPU backend does over NCCL: tests check that it equals the
// unsharded pass, and re-sharding maps (common/engine/kv_reshard.h) are checked against the
// pools it fills. The servers do not run it (a CPU instance is one CpuForward).
//
// KV: each rank has its own pool (MakeKvLayout: the rank's KV heads), with the same number of
// blocks; a sequence's block table names the same block ids in every rank's pool.
//
// Threads: Forward is called by one thread at a time (the engine thread), which runs rank 0;
// ranks 1..t-1 run on threads this object owns (RankThreads), joined by its destructor. The
// Model must outlive it only until Create returns (the shards own their weights).
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <vector>

#include "common/engine/cpu_all_reduce.h"
#include "common/engine/forward.h"
#include "common/engine/rank_threads.h"
#include "common/engine/tensor_parallel.h"

namespace tandem {

class TpCpuForward {
 public:
  // Shards `full` `degree` ways and makes a CpuForward per rank with `options` (num_threads is
  // per rank). `collective_timeout` bounds each wait of a rank for the others. Errors:
  // MakeTpPlan's, ShardModel's, CpuForward::Create's.
  static StatusOr<std::unique_ptr<TpCpuForward>> Create(
      const Model& full, int degree, const ForwardOptions& options,
      std::chrono::milliseconds collective_timeout);

  TpCpuForward(const TpCpuForward&) = delete;
  TpCpuForward& operator=(const TpCpuForward&) = delete;

  int degree() const { return plan_.degree; }
  const TpPlan& plan() const { return plan_; }
  const Model& shard(int rank) const { return *shards_[rank]; }
  // The layout of every rank's pool.
  KvLayout MakeKvLayout(int block_size = kDefaultBlockSize) const;

  // Runs one forward pass on every rank; `caches[r]` is rank r's pool. Returns the logits
  // (every rank computes the same; rank 0's are returned), valid until the next call. Errors:
  // InvalidArgument when caches is not one pool per rank of MakeKvLayout's layout and one size;
  // CpuForward::Forward's (nothing is written to any pool then); DeadlineExceeded when a rank
  // waited past the timeout for the others: the collective is broken and every later call
  // fails with FailedPrecondition.
  StatusOr<std::span<const float>> Forward(std::span<const SequenceInput> batch,
                                           std::span<KvCache* const> caches,
                                           LogitsMode mode = LogitsMode::kLastToken);

 private:
  TpCpuForward(TpPlan plan, std::chrono::milliseconds collective_timeout);
  void RunRank(int rank);

  TpPlan plan_;
  CpuAllReduce all_reduce_;
  std::vector<std::unique_ptr<Model>> shards_;
  std::vector<std::unique_ptr<CpuForward>> forwards_;
  std::vector<ForwardHooks> hooks_;  // per rank: all_reduce through all_reduce_

  // The call in progress: written by Forward before it starts the ranks, read by them.
  std::span<const SequenceInput> batch_;
  std::span<KvCache* const> caches_;
  LogitsMode mode_ = LogitsMode::kLastToken;
  std::vector<Status> forward_status_;     // per rank, of its CpuForward::Forward
  std::vector<Status> collective_status_;  // per rank, its first all-reduce failure
  std::span<const float> logits_;          // rank 0's

  RankThreads threads_;  // last: its destructor joins ranks that may still read the above
};

}  // namespace tandem
