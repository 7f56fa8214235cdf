// How a link moves one layer's messages (OrderedLink, kvtransfer/nccl_endpoints.h): which go
// straight from (into) the region, and which are packed into the link's staging buffer first.
//
// Re-sharding between tensor-parallel degrees moves each KV head's K or V slice of each block
// (kvtransfer/sharded_copies.h): a few KiB. A run of adjacent blocks makes that one strided
// message (rows at the block stride), but NCCL sends contiguous bytes only, and one send per
// row costs a few microseconds each (33,840 of them for a 3000-token SmolLM2 prompt 1 -> 3). So
// the sender gathers the strided messages of a layer into a staging buffer and sends it as one
// message; the receiver receives it into its staging buffer and scatters it. The gather and the
// scatter are lists of strided copies (common/engine/row_copy.h) that NcclLink runs as a few
// kernel launches (cuda::CopyRowsBatch, one thread block per message) and the tests' CPU link
// on the host. A layer whose strided rows exceed the buffer takes several rounds:
//
//   sender, per layer                          receiver, per layer
//   gather round 0 into staging                group { header?, direct..., recv staging }
//   group { header?, direct..., send staging } scatter round 0 from staging
//   gather round 1; group { send staging }     group { recv staging }; scatter round 1 ...
//
// Both ranks compute the rounds from messages of the same rows and lengths (the same plan), so
// the sends and receives pair. Host code, shared by NcclLink and the tests' CPU link, tested
// on the CPU (tests/unit/kvtransfer_nccl_protocol_test.cc). Pure functions: any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/engine/row_copy.h"
#include "kvtransfer/nccl_endpoints.h"

namespace tandem {

// A link's staging buffer, on each rank: a few rounds for the largest layers of long prompts
// (a 32k-token SmolLM2 layer re-sharded 1 -> 3 is 17 MB a pair).
inline constexpr uint64_t kLinkStagingBytes = uint64_t{16} << 20;

// Rows [first_row, first_row + rows) of message `message` (an index into the layer's span) at
// `staging_offset` of the staging buffer, row after row.
struct PackedRows {
  size_t message = 0;
  uint64_t first_row = 0;
  uint64_t rows = 0;
  uint64_t staging_offset = 0;
  bool operator==(const PackedRows&) const = default;
};
struct PackRound {
  std::vector<PackedRows> parts;
  uint64_t bytes = 0;  // the one send's (receive's) length
};
struct LayerSends {
  std::vector<size_t> direct;     // messages sent row by row, in this order, before the rounds
  std::vector<PackRound> rounds;  // then one send each; the first in the same group as `direct`
};

// A one-row message shorter than this is packed too: a send costs a few microseconds whatever
// its size, and a fragmented block table (runs of one block) makes a one-row message per head
// slice and block when re-sharding (2 KiB for SmolLM2 in bf16). Whole blocks of a layer (12 KiB
// and up for real models) still go straight.
inline constexpr uint64_t kSmallMessageBytes = 8192;

// Whether PlanLayerSends packs `msg`: several rows, or one short row, each row within
// `staging_bytes`. The others (and empty ones, which move nothing) go straight.
bool IsPacked(const OrderedLink::Message& msg, uint64_t staging_bytes);

// The plan for one layer's messages, in their order: the packed ones (IsPacked) fill rounds of
// up to `staging_bytes`, in order (a message may span rounds); the others are direct, sent row
// by row. staging_bytes > 0.
LayerSends PlanLayerSends(std::span<const OrderedLink::Message> layer, uint64_t staging_bytes);

// A round's rows between a layer's messages (the span PlanLayerSends planned) and `staging`,
// one strided copy per part: gathered into it (the sender, before the round's send) or
// scattered out of it (the receiver, after the round's receive). NcclLink runs them with
// cuda::CopyRowsBatch, the tests' CPU link with CopyRowsOnHost.
std::vector<RowCopy> GatherCopies(const PackRound& round,
                                  std::span<const OrderedLink::Message> layer, void* staging);
std::vector<RowCopy> ScatterCopies(const PackRound& round,
                                   std::span<const OrderedLink::Message> layer,
                                   const void* staging);

// The message layout of a transfer's messages (the NCCL header's, kvtransfer/nccl_protocol.h):
// 2 when PlanLayerSends packs any of them (IsPacked), else 1: then every message goes row by
// row, as a Tandem before packing cut them, and the two interoperate.
uint16_t MessageLayoutOf(std::span<const OrderedLink::Message> messages, uint64_t staging_bytes);

// The sends (receives) a layer costs on one rank: a row of each direct message, a round each.
size_t LayerSendCount(const std::vector<OrderedLink::Message>& messages, uint64_t staging_bytes);

}  // namespace tandem
