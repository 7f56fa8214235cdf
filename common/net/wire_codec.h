// Little-endian binary framing shared by Tandem's wire formats (control plane, KV transfer).
//
// A frame is a 12-byte header and a body:
//   u32 magic | u16 version | u16 type | u32 body_bytes | body
// WireWriter builds one frame; WireReader reads a body with sticky failure: every read checks
// the bytes left first, and a length over its limit sets limit_exceeded() instead of
// allocating. Decoders built on them never trust a length they have not checked.
//
// Pure functions and value types: thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace tandem {

inline constexpr size_t kFrameHeaderBytes = 12;

struct FrameHeader {
  uint16_t version = 0;
  uint16_t type = 0;
  size_t frame_bytes = 0;  // header + body
};

// Checks magic and body size (<= max_body_bytes); the version and type are the caller's to judge.
// DataLoss when fewer than kFrameHeaderBytes are given or the magic is wrong; InvalidArgument when
// the body is over the limit.
StatusOr<FrameHeader> DecodeFrameHeader(std::span<const uint8_t> bytes, uint32_t magic,
                                        size_t max_body_bytes, const char* what);

class WireWriter {
 public:
  WireWriter(uint32_t magic, uint16_t version, uint16_t type);
  void U8(uint8_t v) { Raw(v, 1); }
  void U16(uint16_t v) { Raw(v, 2); }
  void U32(uint32_t v) { Raw(v, 4); }
  void U64(uint64_t v) { Raw(v, 8); }
  void I32(int32_t v) { Raw(static_cast<uint32_t>(v), 4); }
  void I64(int64_t v) { Raw(static_cast<uint64_t>(v), 8); }
  void F32(float v);
  void F64(double v);
  // u32 length + bytes. Aborts when over `limit`: sending such a value is a bug.
  void Str(const std::string& s, size_t limit);
  void I32Array(std::span<const int32_t> values, size_t limit);
  // Patches the body size into the header (aborts over max_body_bytes) and returns the frame.
  std::string Finish(size_t max_body_bytes);

 private:
  void Raw(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  std::string out_;
};

class WireReader {
 public:
  explicit WireReader(std::span<const uint8_t> body) : data_(body) {}
  bool U8(uint8_t* v) { return Raw(v, 1); }
  bool U16(uint16_t* v) { return Raw(v, 2); }
  bool U32(uint32_t* v) { return Raw(v, 4); }
  bool U64(uint64_t* v) { return Raw(v, 8); }
  bool I32(int32_t* v);
  bool I64(int64_t* v);
  bool F32(float* v);
  bool F64(double* v);
  bool Bool(bool* v);
  bool Str(std::string* s, size_t limit);
  bool I32Array(std::vector<int32_t>* values, size_t limit);
  // Reads a count and checks it against `limit` and against the bytes left (each element
  // takes at least `min_element_bytes`), so that a forged count never drives an allocation.
  bool Count(uint32_t* n, size_t limit, size_t min_element_bytes);

  size_t left() const { return data_.size() - pos_; }
  bool limit_exceeded() const { return limit_exceeded_; }
  // The error for a failed read of `what`: InvalidArgument over a limit, DataLoss otherwise.
  Status Error(const char* what) const;
  // DataLoss when bytes remain after the last field.
  Status ExpectEnd(const char* what) const;

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

inline std::span<const uint8_t> ByteSpan(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace tandem
