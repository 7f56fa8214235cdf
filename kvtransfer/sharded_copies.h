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

// A fixed 28-byte little-endian encoding ("KVP1", then degree, num_layers, num_kv_heads,
// head_dim, block_size, num_blocks as uint32). Decode reads it from the front of `bytes` and
// says how many bytes it took; InvalidArgument when it is short, of another format or invalid.
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
