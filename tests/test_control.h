// The control options of every test: control connections in tests prove membership with a
// fixed cluster secret, exactly as a real cluster's do with its own.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <string>

#include "common/net/control_auth.h"
#include "common/net/control_channel.h"

namespace tandem::test {

inline constexpr const char* kTestClusterSecret = "tandem-test-cluster-secret-0123456789abcdef";

inline ControlOptions TestControlOptions() {
  ControlOptions options;
  options.secret = kTestClusterSecret;
  options.handshake_timeout_s = 5;
  return options;
}

// The dialer's side of the handshake by hand on a raw socket (blocking), holding `secret`:
// how a test speaks raw frames to a listener as a member, or plays a stranger. Returns whether
// the listener's proof matched `secret` (it answers before it checks ours).
inline bool HandshakeAsDialer(boost::asio::ip::tcp::socket& socket, const std::string& secret) {
  const AuthNonce own = NewAuthNonce();
  boost::asio::write(socket, boost::asio::buffer(EncodeAuthChallenge(own)));
  std::array<uint8_t, kAuthChallengeBytes> challenge{};
  boost::asio::read(socket, boost::asio::buffer(challenge));
  StatusOr<AuthNonce> theirs = DecodeAuthChallenge(challenge);
  if (!theirs.ok()) return false;
  boost::asio::write(socket, boost::asio::buffer(MakeAuthProof(secret, true, own, *theirs)));
  AuthProof proof{};
  boost::asio::read(socket, boost::asio::buffer(proof));
  return AuthProofMatches(secret, false, own, *theirs, proof);
}

}  // namespace tandem::test
