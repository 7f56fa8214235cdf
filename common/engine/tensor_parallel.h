// Tensor parallelism (Megatron-LM's split, as vLLM serves it): which part of a Llama-family
// decoder each of `t` ranks holds, and the shard of a loaded Model that a rank runs.
//
// Split of every layer over ranks 0..t-1, each part a contiguous range:
//   - attention: rank r holds query heads [r H/t, (r+1) H/t) and the KV heads they read. q/k/v
//     are column-parallel (the rows of those heads of qkv_proj, and of qkv_bias), o_proj is
//     row-parallel (its columns of those query heads).
//   - MLP: rank r holds intermediate rows [r I/t, (r+1) I/t): gate and up column-parallel,
//     down_proj row-parallel (its columns of that range).
//   - replicated: norms, embedding, LM head, o_bias (added once, after the all-reduce).
// A row-parallel projection yields a partial sum on each rank; the forward pass all-reduces it
// (ForwardHooks::all_reduce, common/engine/forward.h) before adding it to the residual.
//
// KV heads: when t <= K (num_kv_heads), K % t == 0 and rank r holds K/t heads. When t > K, the
// KV heads are replicated as vLLM does: t % K == 0, and rank r holds the single head
// r / (t / K), shared with the t/K - 1 ranks beside it (its query heads all read that head).
//
// Everything here is a pure function of its arguments (ShardModel copies weights): any thread.
#pragma once

#include <memory>
#include <vector>

#include "common/base/status.h"
#include "common/model/model.h"
#include "common/model/model_config.h"

namespace tandem {

// [begin, end) of heads or rows.
struct IndexRange {
  int begin = 0;
  int end = 0;
  int size() const { return end - begin; }
  bool operator==(const IndexRange&) const = default;
};

// What one rank holds.
struct TpRank {
  IndexRange q_heads;       // query heads
  IndexRange kv_heads;      // KV heads (size 1 when replicated)
  IndexRange intermediate;  // MLP intermediate rows
};

struct TpPlan {
  int degree = 1;  // t
  // The full model's shape.
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int intermediate_size = 0;
  bool kv_replicated = false;  // t > num_kv_heads
  std::vector<TpRank> ranks;   // [degree]
};

// The plan for `config` split `degree` ways. InvalidArgument naming tensor_parallel and the
// shape that does not divide: degree < 1, num_attention_heads % degree, intermediate_size %
// degree, and num_key_value_heads % degree (degree <= K) or degree % num_key_value_heads
// (degree > K).
StatusOr<TpPlan> MakeTpPlan(const ModelConfig& config, int degree);

// The KV heads rank `rank` of `degree` holds of `num_kv_heads` (the rule above). Requires
// num_kv_heads % degree == 0 or degree % num_kv_heads == 0 (TANDEM_CHECK: MakeTpPlan and
// KvReshardPlan validate it first).
IndexRange TpKvHeads(int num_kv_heads, int degree, int rank);
// The ranks that hold KV head `head`: one when KV is split, degree / num_kv_heads when it is
// replicated. Same requirement.
IndexRange TpRanksHoldingKvHead(int num_kv_heads, int degree, int head);

// The config of every rank's shard: num_heads / t query heads, its KV heads, intermediate / t;
// head_dim, hidden size, vocabulary and the rest unchanged.
ModelConfig ShardConfig(const ModelConfig& full, const TpPlan& plan);

// The weight bytes one rank of `degree` holds of `full` (ranks hold equal shares), at full's
// storage dtype: its query heads, KV heads (replicated ones too) and MLP rows of every layer,
// the norms and biases, the embedding and LM head; alignment padding aside. What a GPU
// instance's KV budget subtracts per device. Requires a degree that splits full (MakeTpPlan).
size_t TpRankWeightBytes(const Model& full, int degree);

// Rank `rank`'s weights of `full` as a Model of ShardConfig, at full's storage dtype (elements
// copied bit for bit). The shard owns its weights: `full` may go away after. InvalidArgument
// when plan was not made for full's config or rank is outside [0, degree); ResourceExhausted
// when memory runs out.
StatusOr<std::unique_ptr<Model>> ShardModel(const Model& full, const TpPlan& plan, int rank);

}  // namespace tandem
