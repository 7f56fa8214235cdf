// The UCX backend's authenticated reads (UcxReads::kMessages, kvtransfer/ucx_transport.h): the
// active messages a puller sends to ask a publisher for one range of a published request, and
// the publisher's answer. Not for use outside kvtransfer/ucx_*.cc.
//
//   read request (AM kAmReadRequest, all in the header):
//     "TKVR" | token u64 | publisher instance u64 | offset u64 | length u64 | mac (32 bytes) |
//     request id length u16 | request id
//   read reply (AM kAmReadReply): header = token u64 | status code u32; data = the bytes (none
//     when the status is not OK)
//
// mac = HMAC-SHA256(cluster secret, "tandem-kv-read-v1" | publisher instance (u64) | request id):
// one per publisher incarnation and request, computed once by each side. A publisher serves a
// read only when the mac matches the one it computed at Publish (compared in constant time) and
// the range lies within that request's published ranges: a peer without the secret reads
// nothing, and a member reads only what was published, while it is published. The token is the
// puller's: random, single-use, so a reply nobody asked for is dropped. Integers are in the
// machine's order (little-endian: static_assert in ucx_reads.cc).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "common/base/status.h"

namespace tandem::ucx_detail {

constexpr uint16_t kAmReadRequest = 2;
constexpr uint16_t kAmReadReply = 3;

using KvReadMac = std::array<uint8_t, 32>;

KvReadMac MakeKvReadMac(const std::string& secret, uint64_t instance_id,
                        const std::string& request_id);
// Constant time.
bool KvReadMacsEqual(const KvReadMac& a, std::span<const uint8_t> b);

struct ReadRequest {
  uint64_t token = 0;
  uint64_t instance_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  KvReadMac mac{};
  std::string request_id;
};

std::string EncodeReadRequest(const ReadRequest& request);
// InvalidArgument when `bytes` is not a read request (magic, sizes, a request id over
// kKvMaxRequestIdBytes).
StatusOr<ReadRequest> DecodeReadRequest(std::span<const uint8_t> bytes);

struct ReadReplyHeader {
  uint64_t token = 0;
  uint32_t status = 0;  // StatusCode; kOk: the data follows
  uint32_t reserved = 0;
};
static_assert(sizeof(ReadReplyHeader) == 16);

}  // namespace tandem::ucx_detail
