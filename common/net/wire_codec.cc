#include "common/net/wire_codec.h"

#include <bit>

namespace tandem {

StatusOr<FrameHeader> DecodeFrameHeader(std::span<const uint8_t> bytes, uint32_t magic,
                                        size_t max_body_bytes, const char* what) {
  if (bytes.size() < kFrameHeaderBytes)
    return DataLoss(std::string(what) + ": truncated header (" + std::to_string(bytes.size()) +
                    " bytes)");
  WireReader r(bytes.first(kFrameHeaderBytes));
  uint32_t got_magic = 0, body = 0;
  FrameHeader header;
  (void)r.U32(&got_magic);
  (void)r.U16(&header.version);
  (void)r.U16(&header.type);
  (void)r.U32(&body);
  if (got_magic != magic) return DataLoss(std::string(what) + ": bad magic");
  if (body > max_body_bytes)
    return InvalidArgument(std::string(what) + ": body of " + std::to_string(body) +
                           " bytes is over the limit of " + std::to_string(max_body_bytes));
  header.frame_bytes = kFrameHeaderBytes + body;
  return header;
}

WireWriter::WireWriter(uint32_t magic, uint16_t version, uint16_t type) {
  U32(magic);
  U16(version);
  U16(type);
  U32(0);  // body size, patched by Finish()
}

void WireWriter::F32(float v) { U32(std::bit_cast<uint32_t>(v)); }
void WireWriter::F64(double v) { U64(std::bit_cast<uint64_t>(v)); }

void WireWriter::Str(const std::string& s, size_t limit) {
  TANDEM_CHECK(s.size() <= limit, "wire string of " + std::to_string(s.size()) + " bytes over its limit");
  U32(static_cast<uint32_t>(s.size()));
  out_.append(s);
}

void WireWriter::I32Array(std::span<const int32_t> values, size_t limit) {
  TANDEM_CHECK(values.size() <= limit, "wire array over its limit");
  U32(static_cast<uint32_t>(values.size()));
  for (int32_t v : values) I32(v);
}

std::string WireWriter::Finish(size_t max_body_bytes) {
  size_t body = out_.size() - kFrameHeaderBytes;
  TANDEM_CHECK(body <= max_body_bytes, "wire message body over its limit");
  for (int i = 0; i < 4; ++i) out_[8 + i] = static_cast<char>((body >> (8 * i)) & 0xff);
  return std::move(out_);
}

bool WireReader::I32(int32_t* v) {
  uint32_t x;
  if (!U32(&x)) return false;
  *v = static_cast<int32_t>(x);
  return true;
}

bool WireReader::I64(int64_t* v) {
  uint64_t x;
  if (!U64(&x)) return false;
  *v = static_cast<int64_t>(x);
  return true;
}

bool WireReader::F32(float* v) {
  uint32_t x;
  if (!U32(&x)) return false;
  *v = std::bit_cast<float>(x);
  return true;
}

bool WireReader::F64(double* v) {
  uint64_t x;
  if (!U64(&x)) return false;
  *v = std::bit_cast<double>(x);
  return true;
}

bool WireReader::Bool(bool* v) {
  uint8_t x;
  if (!U8(&x)) return false;
  if (x > 1) return false;
  *v = x != 0;
  return true;
}

bool WireReader::Count(uint32_t* n, size_t limit, size_t min_element_bytes) {
  if (!U32(n)) return false;
  if (*n > limit) {
    limit_exceeded_ = true;
    return false;
  }
  return static_cast<size_t>(*n) * min_element_bytes <= left();
}

bool WireReader::Str(std::string* s, size_t limit) {
  uint32_t n = 0;
  if (!Count(&n, limit, 1)) return false;
  s->assign(reinterpret_cast<const char*>(data_.data() + pos_), n);
  pos_ += n;
  return true;
}

bool WireReader::I32Array(std::vector<int32_t>* values, size_t limit) {
  uint32_t n = 0;
  if (!Count(&n, limit, 4)) return false;
  values->resize(n);
  for (uint32_t i = 0; i < n; ++i) (void)I32(&(*values)[i]);
  return true;
}

Status WireReader::Error(const char* what) const {
  if (limit_exceeded_) return InvalidArgument(std::string(what) + " over its limit");
  return DataLoss(std::string("truncated or malformed ") + what);
}

Status WireReader::ExpectEnd(const char* what) const {
  if (left() != 0)
    return DataLoss(std::to_string(left()) + " trailing bytes after " + std::string(what));
  return Status::Ok();
}

}  // namespace tandem
