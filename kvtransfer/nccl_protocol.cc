#include "kvtransfer/nccl_protocol.h"

#include <algorithm>
#include <cstring>

#include "common/base/log.h"
#include "common/net/wire_codec.h"

namespace tandem {
namespace {

constexpr uint16_t kHeldFlag = 1;

uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

template <typename T>
void Put(uint8_t* at, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) at[i] = static_cast<uint8_t>(value >> (8 * i));
}
template <typename T>
T Get(const uint8_t* at) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<T>(at[i]) << (8 * i);
  return value;
}

}  // namespace

std::vector<NcclPiece> NcclWireOrder(const LayerRanges& layers, uint64_t granule_bytes) {
  std::vector<NcclPiece> pieces;
  for (size_t layer = 0; layer < layers.size(); ++layer) {
    uint64_t stream = 0;
    for (const ByteRange& range : layers[layer]) {
      uint64_t done = 0;
      while (done < range.length) {
        uint64_t length = range.length - done;
        if (granule_bytes != 0) {
          const uint64_t to_boundary = granule_bytes - (stream + done) % granule_bytes;
          length = std::min(length, to_boundary);
        }
        pieces.push_back({static_cast<uint32_t>(layer), stream + done, range.offset + done, length});
        done += length;
      }
      stream += range.length;
    }
  }
  return pieces;
}

StatusOr<std::vector<NcclReceive>> PlanNcclReceives(const LayerRanges& remote,
                                                    const LayerRanges& local,
                                                    uint64_t granule_bytes) {
  if (remote.size() != local.size())
    return InvalidArgument("NCCL pull: the publisher has " + std::to_string(remote.size()) +
                           " layers, the puller " + std::to_string(local.size()));
  for (size_t l = 0; l < remote.size(); ++l) {
    TANDEM_ASSIGN_OR_RETURN(uint64_t theirs, TotalBytes({remote[l]}));
    TANDEM_ASSIGN_OR_RETURN(uint64_t ours, TotalBytes({local[l]}));
    if (theirs != ours)
      return InvalidArgument("NCCL pull: layer " + std::to_string(l) + " is " +
                             std::to_string(theirs) + " bytes on the publisher, " +
                             std::to_string(ours) + " here");
  }
  std::vector<NcclReceive> receives;
  size_t range = 0;
  uint64_t range_start = 0;  // stream offset of local[layer][range]
  uint32_t layer = 0;
  for (const NcclPiece& p : NcclWireOrder(remote, granule_bytes)) {
    if (p.layer != layer) {
      layer = p.layer;
      range = 0;
      range_start = 0;
    }
    const std::vector<ByteRange>& mine = local[layer];
    while (range < mine.size() && range_start + mine[range].length <= p.stream_offset) {
      range_start += mine[range].length;
      ++range;
    }
    if (range >= mine.size() || p.stream_offset + p.length > range_start + mine[range].length) {
      return InvalidArgument("NCCL pull: layer " + std::to_string(layer) +
                             " message at stream offset " + std::to_string(p.stream_offset) +
                             " crosses a local range boundary (granule_bytes " +
                             std::to_string(granule_bytes) + ")");
    }
    receives.push_back({p.layer, mine[range].offset + (p.stream_offset - range_start), p.length});
  }
  return receives;
}

NcclHeader MakeNcclHeader(uint64_t seq, uint64_t total_bytes, std::string_view request_id,
                          bool held) {
  return {seq, total_bytes, Fnv1a(request_id), held};
}

std::array<uint8_t, kNcclHeaderBytes> EncodeNcclHeader(const NcclHeader& header) {
  std::array<uint8_t, kNcclHeaderBytes> out{};
  Put<uint32_t>(out.data(), kKvWireMagic);
  Put<uint16_t>(out.data() + 4, kKvWireVersion);
  Put<uint16_t>(out.data() + 6, header.held ? kHeldFlag : 0);
  Put<uint64_t>(out.data() + 8, header.seq);
  Put<uint64_t>(out.data() + 16, header.total_bytes);
  Put<uint64_t>(out.data() + 24, header.request_hash);
  return out;
}

Status CheckNcclHeader(std::span<const uint8_t, kNcclHeaderBytes> received, uint64_t seq,
                       uint64_t total_bytes, std::string_view request_id) {
  const uint8_t* at = received.data();
  if (Get<uint32_t>(at) != kKvWireMagic || Get<uint16_t>(at + 4) != kKvWireVersion)
    return DataLoss("NCCL header of " + std::string(request_id) + ": not a Tandem KV header");
  const uint16_t flags = Get<uint16_t>(at + 6);
  if (Get<uint64_t>(at + 8) != seq || Get<uint64_t>(at + 16) != total_bytes ||
      Get<uint64_t>(at + 24) != Fnv1a(request_id) || (flags & ~kHeldFlag) != 0)
    return DataLoss("NCCL header of " + std::string(request_id) + " (order " +
                    std::to_string(seq) + "): the publisher sent another order");
  if ((flags & kHeldFlag) == 0)
    return NotFound("the prefill instance no longer holds the KV of " + std::string(request_id));
  return Status();
}

std::string Encode(const NcclPullOrder& order) {
  TANDEM_CHECK(order.unique_id.size() == kNcclUniqueIdBytes, "NCCL unique id is not 128 bytes");
  WireWriter w(kKvWireMagic, kKvWireVersion, static_cast<uint16_t>(KvWireType::kNcclPullOrder));
  w.U64(order.link_token);
  w.Str(order.unique_id, kNcclUniqueIdBytes);
  w.U64(order.seq);
  w.Str(Encode(order.descriptor), kKvMaxWireBodyBytes / 2);
  return w.Finish(kKvMaxWireBodyBytes);
}

StatusOr<NcclPullOrder> DecodeNcclPullOrder(std::span<const uint8_t> bytes) {
  TANDEM_ASSIGN_OR_RETURN(KvWireHeader header, DecodeKvWireHeader(bytes));
  if (header.type != KvWireType::kNcclPullOrder)
    return InvalidArgument("wire: expected an NCCL pull order, got type " +
                           std::to_string(static_cast<int>(header.type)));
  if (header.message_bytes != bytes.size())
    return DataLoss("wire: NCCL pull order of " + std::to_string(bytes.size()) +
                    " bytes, its header says " + std::to_string(header.message_bytes));
  WireReader r(bytes.subspan(kKvWireHeaderBytes));
  NcclPullOrder order;
  std::string descriptor;
  if (!r.U64(&order.link_token) || !r.Str(&order.unique_id, kNcclUniqueIdBytes) ||
      !r.U64(&order.seq) || !r.Str(&descriptor, kKvMaxWireBodyBytes / 2))
    return r.Error("NcclPullOrder");
  TANDEM_RETURN_IF_ERROR(r.ExpectEnd("NcclPullOrder"));
  if (order.link_token == 0) return InvalidArgument("wire: NCCL pull order with link token 0");
  if (order.unique_id.size() != kNcclUniqueIdBytes)
    return InvalidArgument("wire: NCCL unique id of " + std::to_string(order.unique_id.size()) +
                           " bytes (want " + std::to_string(kNcclUniqueIdBytes) + ")");
  TANDEM_ASSIGN_OR_RETURN(order.descriptor, DecodeKvDescriptor(AsBytes(descriptor)));
  return order;
}

}  // namespace tandem
