// The KV transfer between tensor-parallel instances (DistServe: prefill and decode may run at
// different degrees). An instance of degree t keeps one pool per rank (common/engine/
// tp_forward.h): t pools of one layout, each holding its rank's KV heads, with the same block
// ids in every pool. Its ranges (KvHandoff's, KvIntake's) are offsets in rank 0's pool and mean
// the same offsets in each. PlanShardedCopies turns a pull's two range lists into copies between
// the pools: pool r to pool r when the degrees are equal (PlanCopies, once per rank); otherwise
// each destination head from the source rank that holds it (KvReshardPlan,
// common/engine/kv_reshard.h), which needs whole-block ranges on both sides.
//
// The shape travels with the publisher's PeerInfo (EncodeKvPoolShape, in the transport's key
// blob), so the puller knows the publisher's degree and pool size.
//
// Host code, shared by the transports and tested on the CPU. Pure functions: any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"
#include "common/engine/kv_cache.h"
#include "kvtransfer/transfer.h"

namespace tandem {

struct KvPoolShape {
  KvLayout full;       // the whole model's KV layout: every KV head
  int degree = 1;      // pools, one per rank
  int num_blocks = 0;  // blocks per layer of each pool
  // Each pool's layout (its rank's KV heads, TpKvHeads). Requires a valid degree (Validate).
  KvLayout rank_layout() const;
  uint64_t pool_bytes() const;  // of each pool
  // InvalidArgument naming tensor_parallel when the degree does not split full's KV heads.
  Status Validate() const;
  bool operator==(const KvPoolShape&) const = default;
};

// The copies of a pull from `remote`'s pools to `local`'s. Every piece's pools are below the
// degrees; pieces are ordered by layer (LayerCopyQueue), neighbours that continue each other on
// both sides merged (CoalesceCopies). InvalidArgument when the two shapes
// are not of one model (full layouts differ), a degree is invalid, a range lies outside a pool,
// the layer counts or a layer's byte counts differ (equal degrees), or, between different
// degrees, a range is not whole blocks or the two sides hold different numbers of blocks.
StatusOr<std::vector<CopyPiece>> PlanShardedCopies(const LayerRanges& remote,
                                                   const KvPoolShape& remote_shape,
                                                   const LayerRanges& local,
                                                   const KvPoolShape& local_shape);

// `rows` copies of `length` bytes, row i from remote_offset + i * remote_stride (in pool
// remote_pool) to local_offset + i * local_stride (in local_pool), all within `layer`: one
// thread block of a cuda::CopyRowsBatch launch, or one packed NCCL message. Re-sharding cuts a block into one piece per KV
// head and K/V (a head's slice of a block is contiguous, the block's next head is not); the
// same slice of the next block of a run sits one block further on both sides, so a run of
// adjacent blocks makes one strided copy per (head, K/V) instead of one piece per block.
struct StridedCopy {
  uint32_t layer = 0;
  uint64_t remote_offset = 0;  // of row 0
  uint64_t local_offset = 0;
  uint64_t length = 0;  // of each row
  uint64_t rows = 1;
  uint64_t remote_stride = 0;  // from one row to the next; rows > 1: at least `length`
  uint64_t local_stride = 0;
  uint32_t remote_pool = 0;
  uint32_t local_pool = 0;
  uint64_t bytes() const { return length * rows; }
  CopyPiece row(uint64_t i) const {
    return {layer, remote_offset + i * remote_stride, local_offset + i * local_stride, length,
            remote_pool, local_pool};
  }
  bool operator==(const StridedCopy&) const = default;
};

// The copies of PlanShardedCopies as strided copies, the unit cuda_ipc copies and NCCL sends:
// between different degrees, each run of blocks adjacent on both sides is its first block's
// pieces (one per KV head slice and K/V, those that continue each other merged), each with
// one row per block of the run at each side's block stride (a whole block on both sides: one
// contiguous range); at equal degrees, PlanShardedCopies' pieces (whole runs already), one row
// each. Ordered by layer. Row by row the same bytes from and to the same places as
// PlanShardedCopies, and its errors.
StatusOr<std::vector<StridedCopy>> PlanStridedCopies(const LayerRanges& remote,
                                                     const KvPoolShape& remote_shape,
                                                     const LayerRanges& local,
                                                     const KvPoolShape& local_shape);

// A fixed little-endian encoding: for float32 KV 28 bytes ("KVP1", then degree, num_layers,
// num_kv_heads, head_dim, block_size, num_blocks as uint32), for bfloat16 32 ("KVP2", the same,
// then the bytes of a value: 2). Decode reads either from the front of `bytes` and says how
// many bytes it took; InvalidArgument when it is short, of another format or invalid.
std::string EncodeKvPoolShape(const KvPoolShape& shape);
StatusOr<KvPoolShape> DecodeKvPoolShape(std::string_view bytes, size_t* consumed);

// A publisher's key for pools a peer maps by handle (cuda_ipc's PeerInfo::packed_rkey): the
// shape record, then one handle of `handle_bytes` per pool. Unpack: InvalidArgument when the
// blob is not exactly that (naming the sizes).
struct PoolKey {
  KvPoolShape shape;
  std::vector<std::string> handles;  // [shape.degree]
};
std::string PackPoolKey(const PoolKey& key);
StatusOr<PoolKey> UnpackPoolKey(std::string_view blob, size_t handle_bytes);

}  // namespace tandem
