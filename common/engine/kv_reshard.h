// Re-sharding KV between tensor-parallel degrees (DistServe: prefill and decode instances may
// use different degrees, so a request's KV leaves a prefill pool split `from_tp` ways and lands
// in a decode pool split `to_tp` ways).
//
// Rank r of degree t holds the KV heads TpKvHeads(K, t, r) (common/engine/tensor_parallel.h):
// K/t of them, or one replicated head when t > K. Its pool has the full model's layout with
// num_kv_heads = that count (kv_cache.h's block layout [layer][block][kv][kv_head][slot]
// [head_dim]), so one head's K (or V) of one block is one contiguous range of block_size *
// head_dim values in every pool. A plan says, for each destination rank and each of its KV
// heads, which source rank and which head of that rank's pool it comes from; Copies turns it
// and a request's block tables into byte ranges (merged where contiguous on both sides), the
// unit a transport moves, layer by layer. A replicated head is read from one of the ranks that
// hold it: the replica (dst_rank mod replicas), which spreads the reads over the replicas.
//
// Pure values and functions: any thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/base/status.h"
#include "common/engine/kv_cache.h"

namespace tandem {

// Destination head `dst_head` of a destination rank's pool comes from head `src_head` of
// source rank `src_rank`'s pool.
struct KvHeadSource {
  int src_rank = 0;
  int src_head = 0;
  int dst_head = 0;
  bool operator==(const KvHeadSource&) const = default;
};

// `length` bytes from offset `src_offset` of source rank `src_rank`'s pool to `dst_offset` of
// the destination pool, both counted from the pool's start (KvCache::data()), within `layer`.
struct KvRangeCopy {
  int src_rank = 0;
  int layer = 0;
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t length = 0;
};

// A request's blocks in one rank's pool: `pool_blocks` blocks per layer, the request in
// `blocks` (its block table, in position order).
struct KvRankBlocks {
  int pool_blocks = 0;
  std::span<const int32_t> blocks;
};

class KvReshardPlan {
 public:
  // `full`: the layout of the whole model's KV (all its KV heads). InvalidArgument naming
  // tensor_parallel when a degree is below 1 or neither divides nor is a multiple of
  // full.num_kv_heads.
  static StatusOr<KvReshardPlan> Make(const KvLayout& full, int from_tp, int to_tp);

  int from_tp() const { return from_tp_; }
  int to_tp() const { return to_tp_; }
  // The layout of each source (destination) rank's pool.
  KvLayout source_layout() const;
  KvLayout destination_layout() const;
  // Where each head of destination rank `dst_rank`'s pool comes from, by destination head.
  const std::vector<KvHeadSource>& heads(int dst_rank) const { return heads_[dst_rank]; }

  // The copies that fill destination rank `dst_rank`'s blocks of a request: `src` has one
  // entry per source rank, and every table (source and destination) the same length. Ordered by
  // layer, so a transport can move a layer as soon as its source has it. InvalidArgument when
  // the counts differ or a block id lies outside its pool.
  StatusOr<std::vector<KvRangeCopy>> Copies(int dst_rank, std::span<const KvRankBlocks> src,
                                            const KvRankBlocks& dst) const;

 private:
  KvLayout full_;
  int from_tp_ = 1;
  int to_tp_ = 1;
  std::vector<std::vector<KvHeadSource>> heads_;  // [to_tp][destination head]
};

// Runs `copies` on CPU pools: from sources[c.src_rank] to `destination`. InvalidArgument
// (nothing copied) when a source rank is missing or a range falls outside its pool.
Status ApplyKvCopies(std::span<const KvCache* const> sources, KvCache& destination,
                     std::span<const KvRangeCopy> copies);

}  // namespace tandem
