#include "kvtransfer/nccl_protocol.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "common/base/log.h"
#include "common/net/wire_codec.h"

namespace tandem {
namespace {

constexpr uint16_t kHeldFlag = 1;
constexpr size_t kMaxNestedBytes = kKvMaxWireBodyBytes / 4;  // a descriptor inside an order

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

StatusOr<std::vector<NcclPairPlan>> PlanNcclPairs(const LayerRanges& remote,
                                                  const KvPoolShape& remote_shape,
                                                  const LayerRanges& local,
                                                  const KvPoolShape& local_shape) {
  TANDEM_ASSIGN_OR_RETURN(std::vector<StridedCopy> pieces,
                          PlanStridedCopies(remote, remote_shape, local, local_shape));
  std::map<std::pair<uint32_t, uint32_t>, NcclPairPlan> pairs;
  for (const StridedCopy& piece : pieces) {
    NcclPairPlan& pair = pairs[{piece.remote_pool, piece.local_pool}];
    pair.remote_pool = piece.remote_pool;
    pair.local_pool = piece.local_pool;
    pair.bytes += piece.bytes();
    pair.pieces.push_back(piece);
  }
  std::vector<NcclPairPlan> out;
  out.reserve(pairs.size());
  for (auto& [key, pair] : pairs) out.push_back(std::move(pair));
  return out;
}

std::vector<NcclPairPlan> NcclPairsOfLayers(const std::vector<NcclPairPlan>& plan, uint32_t first,
                                            uint32_t end) {
  std::vector<NcclPairPlan> out;
  auto by_layer = [](const StridedCopy& piece, uint32_t layer) { return piece.layer < layer; };
  for (const NcclPairPlan& pair : plan) {  // a pair's pieces are in layer order
    const auto from = std::lower_bound(pair.pieces.begin(), pair.pieces.end(), first, by_layer);
    const auto to = std::lower_bound(from, pair.pieces.end(), end, by_layer);
    if (from == to) continue;
    NcclPairPlan part{pair.remote_pool, pair.local_pool, 0, {from, to}};
    for (const StridedCopy& piece : part.pieces) part.bytes += piece.bytes();
    out.push_back(std::move(part));
  }
  return out;
}

NcclHeader MakeNcclHeader(uint64_t seq, uint64_t total_bytes, std::string_view request_id,
                          bool held, uint16_t layout) {
  return {seq, total_bytes, Fnv1a(request_id), held, layout};
}

std::array<uint8_t, kNcclHeaderBytes> EncodeNcclHeader(const NcclHeader& header) {
  std::array<uint8_t, kNcclHeaderBytes> out{};
  Put<uint32_t>(out.data(), kKvWireMagic);
  Put<uint16_t>(out.data() + 4, header.layout);
  Put<uint16_t>(out.data() + 6, header.held ? kHeldFlag : 0);
  Put<uint64_t>(out.data() + 8, header.seq);
  Put<uint64_t>(out.data() + 16, header.total_bytes);
  Put<uint64_t>(out.data() + 24, header.request_hash);
  return out;
}

Status CheckNcclHeader(std::span<const uint8_t, kNcclHeaderBytes> received, uint64_t seq,
                       uint64_t total_bytes, std::string_view request_id, uint16_t layout) {
  const uint8_t* at = received.data();
  if (Get<uint32_t>(at) != kKvWireMagic)
    return DataLoss("NCCL header of " + std::string(request_id) + ": not a Tandem KV header");
  if (const uint16_t theirs = Get<uint16_t>(at + 4); theirs != layout)
    return DataLoss("NCCL header of " + std::string(request_id) + ": message layout " +
                    std::to_string(theirs) + ", this side's is " + std::to_string(layout) +
                    " (prefill and decode of different Tandem versions)");
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
  TANDEM_CHECK(order.pairs.size() <= kMaxNcclPairs, "an NCCL pull order with too many pairs");
  WireWriter w(kKvWireMagic, kKvWireVersion, static_cast<uint16_t>(KvWireType::kNcclPullOrder));
  w.Str(Encode(order.descriptor), kMaxNestedBytes);
  w.Str(EncodeKvPoolShape(order.local_shape), kKvMaxBlobBytes);
  // The puller's ranges in a descriptor of their own (its layout and checks).
  TANDEM_CHECK(order.local.size() <= kKvMaxLayers, "an NCCL pull order with too many layers");
  KvDescriptor local;
  local.request_id = order.descriptor.request_id;
  local.layers = order.local;
  StatusOr<uint64_t> total = TotalBytes(order.local);
  TANDEM_CHECK(total.ok(), "an NCCL pull order's ranges overflow");
  local.total_bytes = *total;
  w.Str(Encode(local), kMaxNestedBytes);
  w.U32(order.first_layer);
  w.U32(order.end_layer);
  w.U32(static_cast<uint32_t>(order.pairs.size()));
  for (const NcclPairOrder& pair : order.pairs) {
    TANDEM_CHECK(pair.unique_id.size() == kNcclUniqueIdBytes, "NCCL unique id is not 128 bytes");
    w.U32(pair.remote_pool);
    w.U32(pair.local_pool);
    w.Str(pair.unique_id, kNcclUniqueIdBytes);
    w.U64(pair.seq);
  }
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
  std::string descriptor, shape, local;
  uint32_t pairs = 0;
  if (!r.Str(&descriptor, kMaxNestedBytes) || !r.Str(&shape, kKvMaxBlobBytes) ||
      !r.Str(&local, kMaxNestedBytes) || !r.U32(&order.first_layer) || !r.U32(&order.end_layer) ||
      !r.Count(&pairs, kMaxNcclPairs, 4 + 4 + 4 + kNcclUniqueIdBytes + 8))
    return r.Error("NcclPullOrder");
  order.pairs.resize(pairs);
  for (NcclPairOrder& pair : order.pairs) {
    if (!r.U32(&pair.remote_pool) || !r.U32(&pair.local_pool) ||
        !r.Str(&pair.unique_id, kNcclUniqueIdBytes) || !r.U64(&pair.seq))
      return r.Error("NcclPullOrder pair");
    if (pair.unique_id.size() != kNcclUniqueIdBytes)
      return InvalidArgument("wire: NCCL unique id of " + std::to_string(pair.unique_id.size()) +
                             " bytes (want " + std::to_string(kNcclUniqueIdBytes) + ")");
  }
  TANDEM_RETURN_IF_ERROR(r.ExpectEnd("NcclPullOrder"));
  TANDEM_ASSIGN_OR_RETURN(order.descriptor, DecodeKvDescriptor(AsBytes(descriptor)));
  size_t consumed = 0;
  TANDEM_ASSIGN_OR_RETURN(order.local_shape, DecodeKvPoolShape(shape, &consumed));
  if (consumed != shape.size())
    return DataLoss("wire: NCCL pull order: " + std::to_string(shape.size() - consumed) +
                    " bytes after the pool shape");
  TANDEM_ASSIGN_OR_RETURN(KvDescriptor mine, DecodeKvDescriptor(AsBytes(local)));
  if (mine.instance_id != 0 || mine.request_id != order.descriptor.request_id)
    return InvalidArgument("wire: NCCL pull order: the puller's ranges name another request");
  order.local = std::move(mine.layers);
  if (order.first_layer >= order.end_layer || order.end_layer > order.descriptor.layers.size())
    return InvalidArgument("wire: NCCL pull order for layers [" +
                           std::to_string(order.first_layer) + ", " +
                           std::to_string(order.end_layer) + ") of a request of " +
                           std::to_string(order.descriptor.layers.size()));
  return order;
}

}  // namespace tandem
