#include "kvtransfer/ucx_reads.h"

#include <openssl/crypto.h>

#include <bit>
#include <cstring>

#include "common/net/control_auth.h"
#include "kvtransfer/wire.h"

namespace tandem::ucx_detail {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the UCX read messages carry integers in the machine's order");
constexpr char kMagic[4] = {'T', 'K', 'V', 'R'};
constexpr size_t kFixedBytes = 4 + 4 * 8 + 32 + 2;

}  // namespace

KvReadMac MakeKvReadMac(const std::string& secret, uint64_t instance_id,
                        const std::string& request_id) {
  std::string message = "tandem-kv-read-v1";
  message.append(reinterpret_cast<const char*>(&instance_id), sizeof instance_id);
  message += request_id;
  return HmacSha256(secret, message);
}

bool KvReadMacsEqual(const KvReadMac& a, std::span<const uint8_t> b) {
  return b.size() == a.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string EncodeReadRequest(const ReadRequest& r) {
  std::string out(kFixedBytes + r.request_id.size(), '\0');
  char* p = out.data();
  std::memcpy(p, kMagic, 4);
  p += 4;
  for (uint64_t v : {r.token, r.instance_id, r.offset, r.length}) {
    std::memcpy(p, &v, 8);
    p += 8;
  }
  std::memcpy(p, r.mac.data(), r.mac.size());
  p += r.mac.size();
  const uint16_t id_bytes = static_cast<uint16_t>(r.request_id.size());
  std::memcpy(p, &id_bytes, 2);
  p += 2;
  std::memcpy(p, r.request_id.data(), r.request_id.size());
  return out;
}

StatusOr<ReadRequest> DecodeReadRequest(std::span<const uint8_t> bytes) {
  if (bytes.size() < kFixedBytes || std::memcmp(bytes.data(), kMagic, 4) != 0)
    return InvalidArgument("not a KV read request");
  const uint8_t* p = bytes.data() + 4;
  ReadRequest r;
  for (uint64_t* v : {&r.token, &r.instance_id, &r.offset, &r.length}) {
    std::memcpy(v, p, 8);
    p += 8;
  }
  std::memcpy(r.mac.data(), p, r.mac.size());
  p += r.mac.size();
  uint16_t id_bytes = 0;
  std::memcpy(&id_bytes, p, 2);
  p += 2;
  if (id_bytes > kKvMaxRequestIdBytes || bytes.size() != kFixedBytes + id_bytes)
    return InvalidArgument("KV read request: bad request id length");
  r.request_id.assign(reinterpret_cast<const char*>(p), id_bytes);
  return r;
}

}  // namespace tandem::ucx_detail
