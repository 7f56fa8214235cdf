// The host-side half of the NCCL KV transport (kvtransfer/nccl/nccl_transport.h): what goes on
// the wire, in which order and with which checks, decided without a GPU so that it is built in
// every build and tested on the CPU (tests/unit/kvtransfer_nccl_protocol_test.cc).
//
// NCCL matches sends and receives between two ranks by posting order, and a posted send cannot
// be withdrawn. So the transfer is pull-driven: the decode side decides when a request moves,
//
//   decode (puller, NCCL rank 1)                      prefill (publisher, NCCL rank 0)
//   Pull(desc): post the receives as order n
//               ── NcclPullOrder{token, id, n, desc} ──▶  (over the control plane, in order)
//                                                     post the sends as order n:
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
#include "kvtransfer/transfer.h"
#include "kvtransfer/wire.h"

namespace tandem {

inline constexpr std::string_view kNcclTransport = "nccl";  // PeerInfo::transport
inline constexpr size_t kNcclUniqueIdBytes = 128;             // NCCL_UNIQUE_ID_BYTES
inline constexpr size_t kNcclHeaderBytes = 32;

// One message of a request on the wire, in wire order.
struct NcclPiece {
  uint32_t layer = 0;
  uint64_t stream_offset = 0;  // position inside the layer's byte stream
  uint64_t remote_offset = 0;  // offset in the publisher's region
  uint64_t length = 0;
  bool operator==(const NcclPiece&) const = default;
};

// The messages of one request, from the publisher's ranges alone: layer-major, range order,
// each range cut at multiples of `granule_bytes` of the layer stream (0: no extra cuts);
// zero-length ranges skipped. With the same block size on both sides, granule_bytes = the bytes
// of one block of one layer makes any two block lists compatible.
std::vector<NcclPiece> NcclWireOrder(const LayerRanges& layers, uint64_t granule_bytes);

// Where each message of NcclWireOrder(remote, granule_bytes) lands in the puller's ranges.
struct NcclReceive {
  uint32_t layer = 0;
  uint64_t local_offset = 0;  // offset in the puller's region
  uint64_t length = 0;
  bool operator==(const NcclReceive&) const = default;
};
// InvalidArgument when the layer counts or a layer's totals differ, or when a message would
// cross a boundary between two local ranges (the sides' cuts are not compatible under
// `granule_bytes`).
StatusOr<std::vector<NcclReceive>> PlanNcclReceives(const LayerRanges& remote,
                                                    const LayerRanges& local,
                                                    uint64_t granule_bytes);

// The 32 bytes in front of every request on a link:
//   u32 magic "TKVT" | u16 wire version | u16 flags (bit 0: held) | u64 seq | u64 total_bytes |
//   u64 FNV-1a of the request id
struct NcclHeader {
  uint64_t seq = 0;  // the order's place on its link
  uint64_t total_bytes = 0;
  uint64_t request_hash = 0;
  bool held = true;  // false: the publisher no longer holds the request, the bytes are filler
  bool operator==(const NcclHeader&) const = default;
};
NcclHeader MakeNcclHeader(uint64_t seq, uint64_t total_bytes, std::string_view request_id,
                          bool held);
std::array<uint8_t, kNcclHeaderBytes> EncodeNcclHeader(const NcclHeader& header);
// The puller's verdict on a received header, against what its order `seq` expects: OK (the
// bytes are the request's KV), NotFound (the publisher answered with filler: it no longer
// holds the request; the link is still in step), DataLoss (a different order, size or request:
// the link is out of step and must be aborted).
Status CheckNcclHeader(std::span<const uint8_t, kNcclHeaderBytes> received, uint64_t seq,
                       uint64_t total_bytes, std::string_view request_id);

// The puller's request to the publisher, carried over the control plane (KvTransport).
struct NcclPullOrder {
  uint64_t link_token = 0;  // names the puller's link to this publisher; random, never 0
  std::string unique_id;    // that link's ncclUniqueId (the puller hosts its bootstrap)
  uint64_t seq = 0;         // the order's place on the link: 0, 1, 2, ...
  KvDescriptor descriptor;  // the request and the publisher's ranges, as the puller got them
  bool operator==(const NcclPullOrder&) const = default;
};
// kvtransfer/wire.h framing, type KvWireType::kNcclPullOrder. Encode aborts on a unique id that
// is not 128 bytes (a bug); Decode returns DataLoss/InvalidArgument as the other decoders do.
std::string Encode(const NcclPullOrder& order);
StatusOr<NcclPullOrder> DecodeNcclPullOrder(std::span<const uint8_t> bytes);

}  // namespace tandem
