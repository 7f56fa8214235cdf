#include "kvtransfer/wire.h"

#include "common/net/wire_codec.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <limits>
#include <random>
#include <utility>

namespace tandem {

uint64_t NewInstanceId() {
  std::random_device rd;
  const uint64_t id = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                      static_cast<uint64_t>(
                          std::chrono::steady_clock::now().time_since_epoch().count()) ^
                      (static_cast<uint64_t>(getpid()) << 16);
  return id == 0 ? 1 : id;
}
namespace {

// Framing and bounded reads come from common/net/wire_codec.h; this file adds the KV messages.
WireWriter Start(KvWireType type) {
  return WireWriter(kKvWireMagic, kKvWireVersion, static_cast<uint16_t>(type));
}

// Checks the header and that the body is exactly the rest; returns the body.
StatusOr<std::span<const uint8_t>> OpenBody(std::span<const uint8_t> bytes, KvWireType want) {
  TANDEM_ASSIGN_OR_RETURN(KvWireHeader header, DecodeKvWireHeader(bytes));
  if (header.type != want) {
    return InvalidArgument("wire: expected message type " +
                           std::to_string(static_cast<int>(want)) + ", got " +
                           std::to_string(static_cast<int>(header.type)));
  }
  if (bytes.size() < header.message_bytes) {
    return DataLoss("wire: truncated message (" + std::to_string(bytes.size()) + " of " +
                    std::to_string(header.message_bytes) + " bytes)");
  }
  if (bytes.size() > header.message_bytes) {
    return DataLoss("wire: " + std::to_string(bytes.size() - header.message_bytes) +
                    " trailing bytes after the message");
  }
  return bytes.subspan(kKvWireHeaderBytes);
}

Status BodyError(const WireReader& r, const char* what) {
  if (r.limit_exceeded()) return InvalidArgument(std::string("wire: ") + what + " over its limit");
  return DataLoss(std::string("wire: truncated ") + what);
}

Status ExpectEnd(const WireReader& r, const char* what) {
  if (r.left() != 0) return DataLoss(std::string("wire: trailing bytes in ") + what);
  return Status();
}

}  // namespace

StatusOr<uint64_t> TotalBytes(const std::vector<std::vector<ByteRange>>& layers) {
  uint64_t total = 0;
  for (const auto& layer : layers) {
    for (const ByteRange& r : layer) {
      if (r.length > std::numeric_limits<uint64_t>::max() - total) {
        return InvalidArgument("range lengths overflow 64 bits");
      }
      total += r.length;
    }
  }
  return total;
}

StatusOr<KvDescriptor> MakeDescriptor(uint64_t instance_id, std::string request_id,
                                      std::vector<std::vector<ByteRange>> layers) {
  if (request_id.empty() || request_id.size() > kKvMaxRequestIdBytes) {
    return InvalidArgument("request id must have 1.." + std::to_string(kKvMaxRequestIdBytes) +
                           " bytes");
  }
  if (layers.size() > kKvMaxLayers) return InvalidArgument("too many layers");
  for (const auto& layer : layers) {
    if (layer.size() > kKvMaxRangesPerLayer) return InvalidArgument("too many ranges in a layer");
  }
  TANDEM_ASSIGN_OR_RETURN(uint64_t total, TotalBytes(layers));
  KvDescriptor d;
  d.instance_id = instance_id;
  d.request_id = std::move(request_id);
  d.layers = std::move(layers);
  d.total_bytes = total;
  return d;
}

std::string Encode(const PeerInfo& info) {
  WireWriter w = Start(KvWireType::kPeerInfo);
  w.U64(info.instance_id);
  w.Str(info.transport, kKvMaxRequestIdBytes);
  w.Str(info.worker_address, kKvMaxBlobBytes);
  w.Str(info.packed_rkey, kKvMaxBlobBytes);
  w.U64(info.region_base);
  w.U64(info.region_bytes);
  return w.Finish(kKvMaxWireBodyBytes);
}

std::string Encode(const KvDescriptor& d) {
  TANDEM_CHECK(d.layers.size() <= kKvMaxLayers, "descriptor has too many layers");
  WireWriter w = Start(KvWireType::kKvDescriptor);
  w.U64(d.instance_id);
  w.Str(d.request_id, kKvMaxRequestIdBytes);
  w.U32(static_cast<uint32_t>(d.layers.size()));
  for (const auto& layer : d.layers) {
    TANDEM_CHECK(layer.size() <= kKvMaxRangesPerLayer, "descriptor layer has too many ranges");
    w.U32(static_cast<uint32_t>(layer.size()));
    for (const ByteRange& r : layer) {
      w.U64(r.offset);
      w.U64(r.length);
    }
  }
  w.U64(d.total_bytes);
  return w.Finish(kKvMaxWireBodyBytes);
}

std::string Encode(const TransferResult& result) {
  WireWriter w = Start(KvWireType::kTransferResult);
  w.U64(result.instance_id);
  w.Str(result.request_id, kKvMaxRequestIdBytes);
  w.U32(static_cast<uint32_t>(result.code));
  w.Str(result.message.size() <= kKvMaxMessageBytes ? result.message
                                                  : result.message.substr(0, kKvMaxMessageBytes),
        kKvMaxMessageBytes);
  w.U64(result.bytes);
  return w.Finish(kKvMaxWireBodyBytes);
}

StatusOr<KvWireHeader> DecodeKvWireHeader(std::span<const uint8_t> bytes) {
  TANDEM_ASSIGN_OR_RETURN(FrameHeader header,
                          DecodeFrameHeader(bytes, kKvWireMagic, kKvMaxWireBodyBytes, "wire"));
  if (header.version != kKvWireVersion) {
    return InvalidArgument("wire: unsupported version " + std::to_string(header.version) +
                           " (this build speaks " + std::to_string(kKvWireVersion) + ")");
  }
  if (header.type < 1 || header.type > 4)
    return InvalidArgument("wire: unknown type " + std::to_string(header.type));
  return KvWireHeader{static_cast<KvWireType>(header.type), header.frame_bytes};
}

StatusOr<PeerInfo> DecodePeerInfo(std::span<const uint8_t> bytes) {
  TANDEM_ASSIGN_OR_RETURN(auto body, OpenBody(bytes, KvWireType::kPeerInfo));
  WireReader r(body);
  PeerInfo info;
  if (!r.U64(&info.instance_id) || !r.Str(&info.transport, kKvMaxRequestIdBytes) ||
      !r.Str(&info.worker_address, kKvMaxBlobBytes) || !r.Str(&info.packed_rkey, kKvMaxBlobBytes) ||
      !r.U64(&info.region_base) || !r.U64(&info.region_bytes)) {
    return BodyError(r, "PeerInfo");
  }
  TANDEM_RETURN_IF_ERROR(ExpectEnd(r, "PeerInfo"));
  if (info.region_bytes > std::numeric_limits<uint64_t>::max() - info.region_base) {
    return InvalidArgument("wire: PeerInfo region wraps around the address space");
  }
  return info;
}

StatusOr<KvDescriptor> DecodeKvDescriptor(std::span<const uint8_t> bytes) {
  TANDEM_ASSIGN_OR_RETURN(auto body, OpenBody(bytes, KvWireType::kKvDescriptor));
  WireReader r(body);
  KvDescriptor d;
  uint32_t layer_count = 0;
  if (!r.U64(&d.instance_id) || !r.Str(&d.request_id, kKvMaxRequestIdBytes) ||
      !r.U32(&layer_count)) {
    return BodyError(r, "KvDescriptor");
  }
  if (layer_count > kKvMaxLayers) {
    return InvalidArgument("wire: " + std::to_string(layer_count) + " layers over the limit");
  }
  // Each layer needs at least its 4-byte count: check before reserving.
  if (static_cast<uint64_t>(layer_count) * 4 > r.left()) return DataLoss("wire: truncated layers");
  d.layers.resize(layer_count);
  uint64_t total = 0;
  for (auto& layer : d.layers) {
    uint32_t n = 0;
    if (!r.U32(&n)) return DataLoss("wire: truncated layer");
    if (n > kKvMaxRangesPerLayer) {
      return InvalidArgument("wire: " + std::to_string(n) + " ranges in a layer over the limit");
    }
    if (static_cast<uint64_t>(n) * 16 > r.left()) return DataLoss("wire: truncated ranges");
    layer.resize(n);
    for (ByteRange& range : layer) {
      if (!r.U64(&range.offset) || !r.U64(&range.length)) return DataLoss("wire: truncated range");
      if (range.length > std::numeric_limits<uint64_t>::max() - range.offset) {
        return InvalidArgument("wire: range wraps around 64 bits");
      }
      if (range.length > std::numeric_limits<uint64_t>::max() - total) {
        return InvalidArgument("wire: range lengths overflow 64 bits");
      }
      total += range.length;
    }
  }
  if (!r.U64(&d.total_bytes)) return DataLoss("wire: truncated KvDescriptor total");
  TANDEM_RETURN_IF_ERROR(ExpectEnd(r, "KvDescriptor"));
  if (d.total_bytes != total) {
    return DataLoss("wire: KvDescriptor total_bytes " + std::to_string(d.total_bytes) +
                    " does not match its ranges (" + std::to_string(total) + ")");
  }
  return d;
}

StatusOr<TransferResult> DecodeTransferResult(std::span<const uint8_t> bytes) {
  TANDEM_ASSIGN_OR_RETURN(auto body, OpenBody(bytes, KvWireType::kTransferResult));
  WireReader r(body);
  TransferResult result;
  uint32_t code = 0;
  if (!r.U64(&result.instance_id) || !r.Str(&result.request_id, kKvMaxRequestIdBytes) ||
      !r.U32(&code) || !r.Str(&result.message, kKvMaxMessageBytes) || !r.U64(&result.bytes)) {
    return BodyError(r, "TransferResult");
  }
  TANDEM_RETURN_IF_ERROR(ExpectEnd(r, "TransferResult"));
  if (code > static_cast<uint32_t>(kLastStatusCode)) {
    return InvalidArgument("wire: unknown status code " + std::to_string(code));
  }
  result.code = static_cast<StatusCode>(code);
  return result;
}

}  // namespace tandem
