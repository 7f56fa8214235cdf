// The host-side half of the NCCL KV transport (kvtransfer/nccl/nccl_transport.h): what goes on
// the wire, in which order and with which checks, decided without a GPU so that it is built in
// every build and tested on the CPU (tests/unit/kvtransfer_nccl_protocol_test.cc).
//
// NCCL matches sends and receives between two ranks by posting order, and a posted send cannot
// be withdrawn. So the transfer is pull-driven: the decode side decides when a request moves,
//
//   decode (puller, NCCL rank 1)                      prefill (publisher, NCCL rank 0)
//   Pull(desc): per link, post the receives as
//   its order n     ── NcclPullOrder{desc, mine, (link, n)...} ──▶  (control plane, in order)
//                                                     per link, post the sends as order n:
//   check the header ◀── header + pieces (NCCL) ───   header says "held" or "gone"
//
// and every order is answered by exactly the messages its receives expect: a request the
// publisher no longer holds (released, timed out) is answered with a "gone" header and filler
// bytes of the same sizes (read from the ranges the order names), so the link stays in step and
// only that pull fails (NotFound).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"
#include "kvtransfer/sharded_copies.h"
#include "kvtransfer/transfer.h"
#include "kvtransfer/wire.h"

namespace tandem {

inline constexpr std::string_view kNcclTransport = "nccl";  // PeerInfo::transport
inline constexpr size_t kNcclUniqueIdBytes = 128;             // NCCL_UNIQUE_ID_BYTES
inline constexpr size_t kNcclHeaderBytes = 32;

// The messages of a pull, link by link. An instance of degree t has t KV pools, one per GPU
// (kvtransfer/sharded_copies.h), and a link joins one publisher pool r and one puller pool s:
// it carries the copies of PlanStridedCopies(remote, remote_shape, local, local_shape) that go
// from pool r to pool s, in plan order (layer-major). Both sides compute the plan from the same
// four inputs (the pull order carries the puller's two), so their messages pair one for one,
// and the KV is re-sharded on the way when the degrees differ (a strided copy per KV head, K/V
// and run of blocks, which the link packs: kvtransfer/nccl_packing.h).
struct NcclPairPlan {
  uint32_t remote_pool = 0;
  uint32_t local_pool = 0;
  uint64_t bytes = 0;                // the copies' total
  std::vector<StridedCopy> pieces;  // this pair's, in plan order
};
// Pairs with at least one piece, ordered by (remote_pool, local_pool). PlanShardedCopies' errors.
StatusOr<std::vector<NcclPairPlan>> PlanNcclPairs(const LayerRanges& remote,
                                                  const KvPoolShape& remote_shape,
                                                  const LayerRanges& local,
                                                  const KvPoolShape& local_shape);

// The part of `plan` that moves layers [first, end): each pair's pieces of those layers, pairs
// without any left out (a binary search in each pair's layer-ordered pieces). Layer-wise
// streaming moves a request in such batches, one order each.
std::vector<NcclPairPlan> NcclPairsOfLayers(const std::vector<NcclPairPlan>& plan, uint32_t first,
                                            uint32_t end);

// The 32 bytes in front of every request on a link:
//   u32 magic "TKVT" | u16 message layout | u16 flags (bit 0: held) | u64 seq | u64 total_bytes |
//   u64 FNV-1a of the request id
// The message layout says how the messages after it are cut (MessageLayoutOf,
// kvtransfer/nccl_packing.h): two sides that cut them differently could pair messages of other
// sizes, which NCCL does not always refuse (a shorter receive takes a longer send's first
// bytes), so a receiver refuses a layout other than its own for the transfer (DataLoss: the
// link is aborted and its pulls fail; no KV of it is used).
//   1: every message row by row: a Tandem before packing (a message per piece), and this one
//      wherever nothing packs (equal degrees, runs of one block): the two interoperate there;
//   2: strided messages packed in staging rounds. A peer of layout 1 then posts other sends
//      than this side's receives: the header's group either completes (and the check refuses
//      it) or stalls until the transfer's deadline; either way no KV of it is used.
inline constexpr uint16_t kNcclLayoutPerRow = 1;
inline constexpr uint16_t kNcclLayoutPacked = 2;
struct NcclHeader {
  uint64_t seq = 0;  // the order's place on its link
  uint64_t total_bytes = 0;
  uint64_t request_hash = 0;
  bool held = true;  // false: the publisher no longer holds the request, the bytes are filler
  uint16_t layout = kNcclLayoutPacked;
  bool operator==(const NcclHeader&) const = default;
};
NcclHeader MakeNcclHeader(uint64_t seq, uint64_t total_bytes, std::string_view request_id,
                          bool held, uint16_t layout);
std::array<uint8_t, kNcclHeaderBytes> EncodeNcclHeader(const NcclHeader& header);
// The puller's verdict on a received header, against what its order `seq` expects: OK (the
// bytes are the request's KV), NotFound (the publisher answered with filler: it no longer
// holds the request; the link is still in step), DataLoss (a different order, size or request:
// the link is out of step and must be aborted).
// `layout`: this side's MessageLayoutOf the transfer.
Status CheckNcclHeader(std::span<const uint8_t, kNcclHeaderBytes> received, uint64_t seq,
                       uint64_t total_bytes, std::string_view request_id, uint16_t layout);

// The puller's request to the publisher, carried over the control plane (KvTransport): what
// the publisher needs to post the sends that pair with the receives the puller posted.
inline constexpr size_t kMaxNcclPairs = 4096;  // 64 x 64 GPUs
struct NcclPairOrder {
  uint32_t remote_pool = 0;
  uint32_t local_pool = 0;
  std::string unique_id;  // the link's ncclUniqueId (the puller made it and hosts its bootstrap)
  uint64_t seq = 0;       // the order's place on that link: 0, 1, 2, ...
  bool operator==(const NcclPairOrder&) const = default;
};
struct NcclPullOrder {
  KvDescriptor descriptor;   // the request and the publisher's ranges
  KvPoolShape local_shape;   // the puller's pools
  LayerRanges local;         // the puller's ranges (offsets in each of its pools)
  uint32_t first_layer = 0;  // the layers this order moves: [first_layer, end_layer)
  uint32_t end_layer = 0;
  // One per pair of NcclPairsOfLayers(PlanNcclPairs(...), first_layer, end_layer), in its order.
  std::vector<NcclPairOrder> pairs;
  bool operator==(const NcclPullOrder&) const = default;
};
// kvtransfer/wire.h framing, type KvWireType::kNcclPullOrder. Encode aborts on a unique id that
// is not 128 bytes or more than kMaxNcclPairs pairs (bugs); Decode returns DataLoss or
// InvalidArgument as the other decoders do (an invalid shape, a unique id of another size,
// layers that are not a non-empty part of the descriptor's).
std::string Encode(const NcclPullOrder& order);
StatusOr<NcclPullOrder> DecodeNcclPullOrder(std::span<const uint8_t> bytes);

}  // namespace tandem
