#include "common/net/control_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstring>

#include "common/base/log.h"

namespace tandem {
namespace {

constexpr uint8_t kMagic[4] = {'T', 'D', 'M', 'C'};
constexpr uint16_t kAuthVersion = 1;

}  // namespace

AuthNonce NewAuthNonce() {
  AuthNonce nonce;
  // RAND_bytes fails only when the system has no entropy source at all: nothing can be secured.
  TANDEM_CHECK(RAND_bytes(nonce.data(), static_cast<int>(nonce.size())) == 1);
  return nonce;
}

std::array<uint8_t, kAuthChallengeBytes> EncodeAuthChallenge(const AuthNonce& nonce) {
  std::array<uint8_t, kAuthChallengeBytes> frame{};
  std::memcpy(frame.data(), kMagic, 4);
  frame[4] = kAuthVersion & 0xff;
  frame[5] = kAuthVersion >> 8;
  std::memcpy(frame.data() + 8, nonce.data(), nonce.size());
  return frame;
}

StatusOr<AuthNonce> DecodeAuthChallenge(std::span<const uint8_t> frame) {
  if (frame.size() != kAuthChallengeBytes || std::memcmp(frame.data(), kMagic, 4) != 0)
    return InvalidArgument("not a Tandem control peer (no handshake challenge)");
  const uint16_t version = static_cast<uint16_t>(frame[4] | (frame[5] << 8));
  if (version != kAuthVersion)
    return InvalidArgument("control handshake version " + std::to_string(version) + ", this build "
                           "speaks " + std::to_string(kAuthVersion));
  AuthNonce nonce;
  std::memcpy(nonce.data(), frame.data() + 8, nonce.size());
  return nonce;
}

std::array<uint8_t, 32> HmacSha256(const std::string& key, std::string_view message) {
  std::array<uint8_t, 32> mac{};
  unsigned int length = 0;
  TANDEM_CHECK(HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
                    reinterpret_cast<const unsigned char*>(message.data()), message.size(),
                    mac.data(), &length) != nullptr &&
               length == mac.size());
  return mac;
}

AuthProof MakeAuthProof(const std::string& secret, bool dialer, const AuthNonce& dialer_nonce,
                        const AuthNonce& listener_nonce) {
  const std::string label = dialer ? "tandem-control-v1 dialer" : "tandem-control-v1 listener";
  std::string message = label;
  message.append(reinterpret_cast<const char*>(dialer_nonce.data()), dialer_nonce.size());
  message.append(reinterpret_cast<const char*>(listener_nonce.data()), listener_nonce.size());
  return HmacSha256(secret, message);
}

bool AuthProofMatches(const std::string& secret, bool dialer, const AuthNonce& dialer_nonce,
                      const AuthNonce& listener_nonce, std::span<const uint8_t> proof) {
  if (proof.size() != kAuthProofBytes) return false;
  const AuthProof want = MakeAuthProof(secret, dialer, dialer_nonce, listener_nonce);
  return CRYPTO_memcmp(want.data(), proof.data(), want.size()) == 0;
}

std::string NewClusterSecret() {
  const AuthNonce bytes = NewAuthNonce();
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  for (uint8_t b : bytes) {
    hex.push_back(kHex[b >> 4]);
    hex.push_back(kHex[b & 15]);
  }
  return hex;
}

}  // namespace tandem
