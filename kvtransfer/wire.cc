#include "kvtransfer/wire.h"

#include <cstring>
#include <limits>
#include <utility>

namespace tandem {
namespace {

class Writer {
 public:
  explicit Writer(KvWireType type) {
    U32(kKvWireMagic);
    U16(kKvWireVersion);
    U16(static_cast<uint16_t>(type));
    U32(0);  // body size, patched by Finish()
  }
  void U16(uint16_t v) { Raw(v, 2); }
  void U32(uint32_t v) { Raw(v, 4); }
  void U64(uint64_t v) { Raw(v, 8); }
  void Str(const std::string& s, size_t limit) {
    TANDEM_CHECK(s.size() <= limit, "wire string over its limit");
    U32(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  std::string Finish() {
    size_t body = out_.size() - kKvWireHeaderBytes;
    TANDEM_CHECK(body <= kKvMaxWireBodyBytes, "wire message body over kKvMaxWireBodyBytes");
    for (int i = 0; i < 4; ++i) out_[8 + i] = static_cast<char>((body >> (8 * i)) & 0xff);
    return std::move(out_);
  }

 private:
  void Raw(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  std::string out_;
};

// Reads a body; every read checks the bytes left first and fails sticky.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> body) : data_(body) {}
  bool U16(uint16_t* v) { return Raw(v, 2); }
  bool U32(uint32_t* v) { return Raw(v, 4); }
  bool U64(uint64_t* v) { return Raw(v, 8); }
  // Fails with `limit_exceeded` set when the length is over `limit`.
  bool Str(std::string* s, size_t limit) {
    uint32_t n = 0;
    if (!U32(&n)) return false;
    if (n > limit) {
      limit_exceeded_ = true;
      return false;
    }
    if (n > left()) return false;
    s->assign(reinterpret_cast<const char*>(data_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  size_t left() const { return data_.size() - pos_; }
  bool limit_exceeded() const { return limit_exceeded_; }
  void set_limit_exceeded() { limit_exceeded_ = true; }

 private:
  template <typename T>
  bool Raw(T* v, int n) {
    if (left() < static_cast<size_t>(n)) return false;
    uint64_t x = 0;
    for (int i = 0; i < n; ++i) x |= static_cast<uint64_t>(data_[pos_ + i]) << (8 * i);
    pos_ += n;
    *v = static_cast<T>(x);
    return true;
  }
  std::span<const uint8_t> data_;
  size_t pos_ = 0;
  bool limit_exceeded_ = false;
};

uint32_t ReadLe32(const uint8_t* p) {
  return p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24);
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

Status BodyError(const Reader& r, const char* what) {
  if (r.limit_exceeded()) return InvalidArgument(std::string("wire: ") + what + " over its limit");
  return DataLoss(std::string("wire: truncated ") + what);
}

Status ExpectEnd(const Reader& r, const char* what) {
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
  Writer w(KvWireType::kPeerInfo);
  w.U64(info.instance_id);
  w.Str(info.transport, kKvMaxRequestIdBytes);
  w.Str(info.worker_address, kKvMaxBlobBytes);
  w.Str(info.packed_rkey, kKvMaxBlobBytes);
  w.U64(info.region_base);
  w.U64(info.region_bytes);
  return w.Finish();
}

std::string Encode(const KvDescriptor& d) {
  TANDEM_CHECK(d.layers.size() <= kKvMaxLayers, "descriptor has too many layers");
  Writer w(KvWireType::kKvDescriptor);
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
  return w.Finish();
}

std::string Encode(const TransferResult& result) {
  Writer w(KvWireType::kTransferResult);
  w.U64(result.instance_id);
  w.Str(result.request_id, kKvMaxRequestIdBytes);
  w.U32(static_cast<uint32_t>(result.code));
  w.Str(result.message.size() <= kKvMaxMessageBytes ? result.message
                                                  : result.message.substr(0, kKvMaxMessageBytes),
        kKvMaxMessageBytes);
  w.U64(result.bytes);
  return w.Finish();
}

StatusOr<KvWireHeader> DecodeKvWireHeader(std::span<const uint8_t> bytes) {
  if (bytes.size() < kKvWireHeaderBytes) {
    return DataLoss("wire: truncated header (" + std::to_string(bytes.size()) + " bytes)");
  }
  if (ReadLe32(bytes.data()) != kKvWireMagic) return DataLoss("wire: bad magic");
  uint16_t version = bytes[4] | (bytes[5] << 8);
  if (version != kKvWireVersion) {
    return InvalidArgument("wire: unsupported version " + std::to_string(version) +
                           " (this build speaks " + std::to_string(kKvWireVersion) + ")");
  }
  uint16_t type = bytes[6] | (bytes[7] << 8);
  if (type < 1 || type > 3) return InvalidArgument("wire: unknown type " + std::to_string(type));
  uint32_t body = ReadLe32(bytes.data() + 8);
  if (body > kKvMaxWireBodyBytes) {
    return InvalidArgument("wire: body of " + std::to_string(body) + " bytes over the limit");
  }
  return KvWireHeader{static_cast<KvWireType>(type), kKvWireHeaderBytes + body};
}

StatusOr<PeerInfo> DecodePeerInfo(std::span<const uint8_t> bytes) {
  TANDEM_ASSIGN_OR_RETURN(auto body, OpenBody(bytes, KvWireType::kPeerInfo));
  Reader r(body);
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
  Reader r(body);
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
  Reader r(body);
  TransferResult result;
  uint32_t code = 0;
  if (!r.U64(&result.instance_id) || !r.Str(&result.request_id, kKvMaxRequestIdBytes) ||
      !r.U32(&code) || !r.Str(&result.message, kKvMaxMessageBytes) || !r.U64(&result.bytes)) {
    return BodyError(r, "TransferResult");
  }
  TANDEM_RETURN_IF_ERROR(ExpectEnd(r, "TransferResult"));
  if (code > static_cast<uint32_t>(StatusCode::kInternal)) {
    return InvalidArgument("wire: unknown status code " + std::to_string(code));
  }
  result.code = static_cast<StatusCode>(code);
  return result;
}

}  // namespace tandem
