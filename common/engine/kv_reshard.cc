#include "common/engine/kv_reshard.h"

#include <cstring>
#include <string>

#include "common/engine/tensor_parallel.h"

namespace tandem {
namespace {

std::string Str(int64_t v) {
  return std::to_string(v);
}

Status CheckDegree(const KvLayout& full, int degree, const char* side) {
  const int k = full.num_kv_heads;
  if (degree < 1)
    return InvalidArgument(std::string("KV re-shard: ") + side + " tensor_parallel " + Str(degree) +
                           " is below 1");
  if (k % degree != 0 && degree % k != 0)
    return InvalidArgument(std::string("KV re-shard: ") + side + " tensor_parallel " + Str(degree) +
                           " neither divides nor is a multiple of " + Str(k) + " key-value heads");
  return Status::Ok();
}

Status CheckTable(const KvRankBlocks& side, size_t length, const std::string& what) {
  if (side.pool_blocks <= 0) return InvalidArgument("KV re-shard: " + what + " has no pool");
  if (side.blocks.size() != length)
    return InvalidArgument("KV re-shard: " + what + " has " + Str(side.blocks.size()) +
                           " blocks, the destination " + Str(length));
  for (int32_t b : side.blocks) {
    if (b < 0 || b >= side.pool_blocks)
      return InvalidArgument("KV re-shard: " + what + " names block " + Str(b) +
                             " outside its pool of " + Str(side.pool_blocks));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<KvReshardPlan> KvReshardPlan::Make(const KvLayout& full, int from_tp, int to_tp) {
  if (full.num_layers <= 0 || full.num_kv_heads <= 0 || full.head_dim <= 0 || full.block_size <= 0)
    return InvalidArgument("KV re-shard: invalid layout (" + full.ToString() + ")");
  TANDEM_RETURN_IF_ERROR(CheckDegree(full, from_tp, "source"));
  TANDEM_RETURN_IF_ERROR(CheckDegree(full, to_tp, "destination"));
  KvReshardPlan plan;
  plan.full_ = full;
  plan.from_tp_ = from_tp;
  plan.to_tp_ = to_tp;
  const int k = full.num_kv_heads;
  for (int dst = 0; dst < to_tp; ++dst) {
    std::vector<KvHeadSource> heads;
    const IndexRange held = TpKvHeads(k, to_tp, dst);
    for (int head = held.begin; head < held.end; ++head) {
      const IndexRange holders = TpRanksHoldingKvHead(k, from_tp, head);
      const int src = holders.begin + dst % holders.size();
      heads.push_back(
          KvHeadSource{src, head - TpKvHeads(k, from_tp, src).begin, head - held.begin});
    }
    plan.heads_.push_back(std::move(heads));
  }
  return plan;
}

KvLayout KvReshardPlan::source_layout() const {
  KvLayout l = full_;
  l.num_kv_heads = TpKvHeads(full_.num_kv_heads, from_tp_, 0).size();
  return l;
}

KvLayout KvReshardPlan::destination_layout() const {
  KvLayout l = full_;
  l.num_kv_heads = TpKvHeads(full_.num_kv_heads, to_tp_, 0).size();
  return l;
}

StatusOr<std::vector<KvRangeCopy>> KvReshardPlan::Copies(int dst_rank,
                                                         std::span<const KvRankBlocks> src,
                                                         const KvRankBlocks& dst) const {
  if (dst_rank < 0 || dst_rank >= to_tp_)
    return InvalidArgument("KV re-shard: destination rank " + Str(dst_rank) + " outside [0, " +
                           Str(to_tp_) + ")");
  if (static_cast<int>(src.size()) != from_tp_)
    return InvalidArgument("KV re-shard: " + Str(src.size()) + " source tables for " +
                           Str(from_tp_) + " source ranks");
  const size_t n = dst.blocks.size();
  TANDEM_RETURN_IF_ERROR(CheckTable(dst, n, "the destination table"));
  for (int r = 0; r < from_tp_; ++r)
    TANDEM_RETURN_IF_ERROR(CheckTable(src[r], n, "source rank " + Str(r) + "'s table"));

  const KvLayout src_layout = source_layout(), dst_layout = destination_layout();
  const uint64_t head_bytes = KvValueBytes(full_.dtype) * full_.block_size * full_.head_dim;
  const uint64_t src_block = src_layout.block_bytes(), dst_block = dst_layout.block_bytes();
  std::vector<KvRangeCopy> copies;
  for (int layer = 0; layer < full_.num_layers; ++layer) {
    for (size_t i = 0; i < n; ++i) {
      for (int kv = 0; kv < 2; ++kv) {
        for (const KvHeadSource& h : heads_[dst_rank]) {
          const KvRankBlocks& s = src[h.src_rank];
          const uint64_t src_offset =
              (uint64_t(layer) * s.pool_blocks + s.blocks[i]) * src_block +
              (uint64_t(kv) * src_layout.num_kv_heads + h.src_head) * head_bytes;
          const uint64_t dst_offset =
              (uint64_t(layer) * dst.pool_blocks + dst.blocks[i]) * dst_block +
              (uint64_t(kv) * dst_layout.num_kv_heads + h.dst_head) * head_bytes;
          // Extends the last copy when this range follows it on both sides.
          if (!copies.empty()) {
            KvRangeCopy& last = copies.back();
            if (last.src_rank == h.src_rank && last.layer == layer &&
                last.src_offset + last.length == src_offset &&
                last.dst_offset + last.length == dst_offset) {
              last.length += head_bytes;
              continue;
            }
          }
          copies.push_back(KvRangeCopy{h.src_rank, layer, src_offset, dst_offset, head_bytes});
        }
      }
    }
  }
  return copies;
}

Status ApplyKvCopies(std::span<const KvCache* const> sources, KvCache& destination,
                     std::span<const KvRangeCopy> copies) {
  for (const KvRangeCopy& c : copies) {
    if (c.src_rank < 0 || c.src_rank >= static_cast<int>(sources.size()) ||
        sources[c.src_rank] == nullptr)
      return InvalidArgument("KV re-shard: no pool for source rank " + Str(c.src_rank));
    if (c.src_offset + c.length > sources[c.src_rank]->total_bytes() ||
        c.dst_offset + c.length > destination.total_bytes())
      return InvalidArgument("KV re-shard: a copy of " + Str(c.length) + " bytes at " +
                             Str(c.src_offset) + " -> " + Str(c.dst_offset) +
                             " falls outside its pools");
  }
  for (const KvRangeCopy& c : copies) {
    std::memcpy(destination.data() + c.dst_offset, sources[c.src_rank]->data() + c.src_offset,
                c.length);
  }
  return Status::Ok();
}

}  // namespace tandem
