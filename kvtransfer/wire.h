// Wire structs of the KV transfer protocol and their byte encoding.
//
// Every message is a 12-byte header followed by a body:
//   u32 magic "TKVT" | u16 version | u16 type | u32 body_bytes | body
// All integers are little-endian; strings are u32 length + bytes. The header says the body's
// size, so a stream reader needs only WireMessageBytes() to frame messages.
//
// Decode*() never trusts a length it has not checked: every count and size is bounded (the
// limits below) and checked against the bytes actually present before anything is allocated.
// On malformed input they return DataLoss (truncated, bad magic, trailing bytes, inconsistent
// totals) or InvalidArgument (unknown version or type, a limit exceeded), never crash.
//
// These functions are pure and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace tandem {

inline constexpr uint32_t kKvWireMagic = 0x54564B54;  // "TKVT" as little-endian bytes
inline constexpr uint16_t kKvWireVersion = 1;
inline constexpr size_t kKvWireHeaderBytes = 12;

// Limits that bound what a decoder will allocate.
inline constexpr size_t kKvMaxWireBodyBytes = 64u << 20;
inline constexpr size_t kKvMaxRequestIdBytes = 256;
inline constexpr size_t kKvMaxBlobBytes = 64u << 10;  // worker address, packed rkey
inline constexpr size_t kKvMaxMessageBytes = 4096;    // TransferResult message
inline constexpr uint32_t kKvMaxLayers = 1024;
inline constexpr uint32_t kKvMaxRangesPerLayer = 1u << 20;

enum class KvWireType : uint16_t {
  kPeerInfo = 1,
  kKvDescriptor = 2,
  kTransferResult = 3,
  kNcclPullOrder = 4,  // kvtransfer/nccl_protocol.h
};

// A contiguous range of bytes at `offset` from the start of a MemoryRegion.
struct ByteRange {
  uint64_t offset = 0;
  uint64_t length = 0;
  bool operator==(const ByteRange&) const = default;
};

// A memory region that one side registers once (the whole KV pool). Not owned: the caller keeps
// it alive and mapped for as long as the publisher or puller that registered it.
struct MemoryRegion {
  void* base = nullptr;
  size_t bytes = 0;
};

// A new PeerInfo::instance_id for a publisher incarnation: random (the OS's entropy, mixed
// with the clock and the pid), never 0. Every transport's publishers draw theirs here.
uint64_t NewInstanceId();

// What a puller needs to reach a publisher: sent once per peer over the control plane.
struct PeerInfo {
  uint64_t instance_id = 0;    // random per publisher incarnation; a restart gets a new one
  std::string transport;       // "ucx" or "inprocess"
  std::string worker_address;  // ucp_worker_get_address bytes
  std::string packed_rkey;     // ucp_rkey_pack bytes for the region
  uint64_t region_base = 0;    // remote virtual address of the region
  uint64_t region_bytes = 0;
  bool operator==(const PeerInfo&) const = default;
};

// One request's KV on the publishing side: per layer, ranges in the publisher's region.
struct KvDescriptor {
  uint64_t instance_id = 0;  // PeerInfo::instance_id of the publisher
  std::string request_id;
  std::vector<std::vector<ByteRange>> layers;
  uint64_t total_bytes = 0;  // sum of all range lengths (checked by the decoder)
  bool operator==(const KvDescriptor&) const = default;
};

// The outcome of a pull, sent back to the publisher so that it frees (or keeps) the blocks.
struct TransferResult {
  uint64_t instance_id = 0;  // the publisher this result is for
  std::string request_id;
  StatusCode code = StatusCode::kOk;
  std::string message;
  uint64_t bytes = 0;  // bytes moved
  bool operator==(const TransferResult&) const = default;

  Status ToStatus() const { return code == StatusCode::kOk ? Status() : Status(code, message); }
};

// Sum of range lengths; InvalidArgument on overflow.
StatusOr<uint64_t> TotalBytes(const std::vector<std::vector<ByteRange>>& layers);
// Builds a descriptor and fills total_bytes.
StatusOr<KvDescriptor> MakeDescriptor(uint64_t instance_id, std::string request_id,
                                      std::vector<std::vector<ByteRange>> layers);

// Encoders abort (TANDEM_CHECK) on values over the limits: sending them is a bug.
std::string Encode(const PeerInfo& info);
std::string Encode(const KvDescriptor& descriptor);
std::string Encode(const TransferResult& result);

StatusOr<PeerInfo> DecodePeerInfo(std::span<const uint8_t> bytes);
StatusOr<KvDescriptor> DecodeKvDescriptor(std::span<const uint8_t> bytes);
StatusOr<TransferResult> DecodeTransferResult(std::span<const uint8_t> bytes);

// Parses just the header: the type and the full message size (header + body). Bytes beyond the
// header are not looked at, so a stream reader can call it after reading kKvWireHeaderBytes.
struct KvWireHeader {
  KvWireType type;
  size_t message_bytes;
};
StatusOr<KvWireHeader> DecodeKvWireHeader(std::span<const uint8_t> bytes);

inline std::span<const uint8_t> AsBytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace tandem
