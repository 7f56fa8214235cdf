// The control plane's handshake: before a control connection carries any message, each side
// proves that it holds the cluster secret, without sending it.
//
//   both sides:  Challenge = "TDMC" | version (u16 LE) | 0 (u16) | nonce (32 random bytes)
//   both sides:  Proof     = HMAC-SHA256(secret, label | dialer nonce | listener nonce)
//
// where label is "tandem-control-v1 dialer" for the side that connected and "... listener" for
// the side that accepted: a proof cannot be reflected back to the side that made it, and fresh
// nonces on both sides make every proof single-use. Proofs are compared in constant time. Both
// messages have fixed sizes, so a peer that has not proved anything costs 72 bytes of buffer.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "common/base/status.h"

namespace tandem {

inline constexpr size_t kAuthNonceBytes = 32;
inline constexpr size_t kAuthChallengeBytes = 8 + kAuthNonceBytes;
inline constexpr size_t kAuthProofBytes = 32;  // SHA-256
// A shorter secret is refused where it is loaded: 16 bytes = 128 bits.
inline constexpr size_t kMinClusterSecretBytes = 16;

using AuthNonce = std::array<uint8_t, kAuthNonceBytes>;
using AuthProof = std::array<uint8_t, kAuthProofBytes>;

// 32 bytes from the system's CSPRNG (OpenSSL RAND_bytes).
AuthNonce NewAuthNonce();

// HMAC-SHA256 of `message` under `key` (OpenSSL): the one MAC of the internal plane (this
// handshake, and the KV data plane's read messages: kvtransfer/ucx_reads.h).
std::array<uint8_t, 32> HmacSha256(const std::string& key, std::string_view message);

// The challenge frame carrying `nonce`.
std::array<uint8_t, kAuthChallengeBytes> EncodeAuthChallenge(const AuthNonce& nonce);
// The nonce of a challenge frame; InvalidArgument when it is not one (wrong magic or version:
// not a Tandem control peer, or one of another version).
StatusOr<AuthNonce> DecodeAuthChallenge(std::span<const uint8_t> frame);

// What the side `dialer` (true: it connected) sends to prove it holds `secret`.
AuthProof MakeAuthProof(const std::string& secret, bool dialer, const AuthNonce& dialer_nonce,
                        const AuthNonce& listener_nonce);
// Whether `proof` is what the side `dialer` holding `secret` would send; constant time.
bool AuthProofMatches(const std::string& secret, bool dialer, const AuthNonce& dialer_nonce,
                      const AuthNonce& listener_nonce, std::span<const uint8_t> proof);

// A new secret for a cluster that has none configured: 32 random bytes, hex (64 characters).
std::string NewClusterSecret();

}  // namespace tandem
