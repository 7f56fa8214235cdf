// Control-plane membership (common/net/control_auth.h, control_channel.h): only a peer that
// holds the cluster secret gets a message through, and a stranger costs bounded memory and time.
#include <catch2/catch.hpp>

#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <condition_variable>
#include <thread>

#include "common/net/control_channel.h"
#include "common/net/wire_codec.h"
#include "io_thread.h"
#include "tests/test_control.h"

using namespace tandem;
using namespace std::chrono_literals;
using test::IoThread;
using test::TestControlOptions;
using tcp = boost::asio::ip::tcp;

namespace {

// What one side of a connection saw.
struct Side {
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<ControlMessage> messages;
  std::optional<Status> closed;

  ControlConnection::MessageHandler OnMessage() {
    return [this](ControlMessage m) {
      std::lock_guard<std::mutex> lock(mutex);
      messages.push_back(std::move(m));
      cv.notify_all();
    };
  }
  ControlConnection::CloseHandler OnClose() {
    return [this](const Status& s) {
      std::lock_guard<std::mutex> lock(mutex);
      closed = s;
      cv.notify_all();
    };
  }
  bool WaitClosed(std::chrono::milliseconds limit = 10s) {
    std::unique_lock<std::mutex> lock(mutex);
    return cv.wait_for(lock, limit, [&] { return closed.has_value(); });
  }
  bool WaitMessages(size_t n) {
    std::unique_lock<std::mutex> lock(mutex);
    return cv.wait_for(lock, 10s, [&] { return messages.size() >= n; });
  }
};

// A listener whose accepted connections report to `server`.
std::unique_ptr<ControlListener> Listen(IoThread& io, Side* server,
                                        ControlOptions options = TestControlOptions()) {
  auto listener = ControlListener::Listen(io.io, "127.0.0.1", 0, options, [server](auto c) {
    c->Start(server->OnMessage(), server->OnClose());
  });
  REQUIRE(listener.ok());
  return std::move(*listener);
}

tcp::socket RawConnect(IoThread& io, int port) {
  tcp::socket raw(io.io);
  raw.connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)});
  return raw;
}

// Reads until the peer closes or `limit` passes; true when it closed.
bool PeerCloses(tcp::socket& raw, std::chrono::milliseconds limit) {
  timeval tv{static_cast<time_t>(limit.count() / 1000),
             static_cast<suseconds_t>(limit.count() % 1000 * 1000)};
  setsockopt(raw.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buf[256];
  for (;;) {
    const ssize_t n = ::read(raw.native_handle(), buf, sizeof buf);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;
  }
}

}  // namespace

TEST_CASE("control auth: proofs bind the secret, the side and both nonces", "[control_auth]") {
  const AuthNonce a = NewAuthNonce(), b = NewAuthNonce();
  CHECK(a != b);
  const AuthProof p = MakeAuthProof("secret-0123456789", true, a, b);
  CHECK(AuthProofMatches("secret-0123456789", true, a, b, p));
  CHECK_FALSE(AuthProofMatches("secret-0123456789x", true, a, b, p));  // another secret
  CHECK_FALSE(AuthProofMatches("secret-0123456789", false, a, b, p));  // reflected
  CHECK_FALSE(AuthProofMatches("secret-0123456789", true, b, a, p));   // other nonces
  CHECK_FALSE(AuthProofMatches("secret-0123456789", true, a, b, std::span(p).first(31)));
  const auto challenge = EncodeAuthChallenge(a);
  REQUIRE(DecodeAuthChallenge(challenge).ok());
  CHECK(*DecodeAuthChallenge(challenge) == a);
  auto wrong = challenge;
  wrong[0] = 'X';
  CHECK(DecodeAuthChallenge(wrong).status().code() == StatusCode::kInvalidArgument);
  CHECK(NewClusterSecret().size() == 64);
}

TEST_CASE("control auth: a peer with another secret gets no message through, either way",
          "[control_auth]") {
  IoThread io;
  Side server, client;
  auto listener = Listen(io, &server);
  ControlOptions stranger = TestControlOptions();
  stranger.secret = "not-the-cluster-secret-at-all";
  auto conn = ConnectControl(io.io, "127.0.0.1:" + std::to_string(listener->port()), 5, stranger);
  REQUIRE(conn.ok());
  Submit submit;
  submit.request_id = "attack";
  submit.prompt = {1, 2, 3};
  CHECK((*conn)->Send(submit));  // queued: it would leave only after the handshake
  (*conn)->Start(client.OnMessage(), client.OnClose());
  REQUIRE(client.WaitClosed());
  REQUIRE(server.WaitClosed());
  CHECK(server.closed->code() == StatusCode::kPermissionDenied);
  CHECK(client.closed->code() == StatusCode::kPermissionDenied);  // it checks the listener too
  CHECK(server.messages.empty());
  CHECK(client.messages.empty());
  CHECK_FALSE((*conn)->authenticated());
}

TEST_CASE("control auth: members exchange messages once the handshake is done",
          "[control_auth]") {
  IoThread io;
  Side server, client;
  auto listener = Listen(io, &server);
  auto conn = ConnectControl(io.io, "127.0.0.1:" + std::to_string(listener->port()), 5,
                             TestControlOptions());
  REQUIRE(conn.ok());
  CHECK((*conn)->Send(Cancel{"early"}));  // sent before Start: delivered after the handshake
  (*conn)->Start(client.OnMessage(), client.OnClose());
  REQUIRE(server.WaitMessages(1));
  CHECK(std::get<Cancel>(server.messages[0]).request_id == "early");
  CHECK((*conn)->authenticated());
}

TEST_CASE("control auth: a stranger's bytes are never read as a frame", "[control_auth]") {
  IoThread io;
  Side server;
  auto listener = Listen(io, &server);
  SECTION("a frame header declaring 32 MiB, before any handshake") {
    tcp::socket raw = RawConnect(io, listener->port());
    std::string frame = EncodeControl(Cancel{"x"});
    // The header's size field says 32 MiB; only the handshake's 40 bytes are ever read.
    std::string header = frame.substr(0, kFrameHeaderBytes);
    header[8] = 0, header[9] = 0, header[10] = 0, header[11] = 2;
    boost::asio::write(raw, boost::asio::buffer(header + std::string(40, 'A')));
    REQUIRE(server.WaitClosed());
    CHECK(server.closed->code() == StatusCode::kPermissionDenied);
  }
  SECTION("the right handshake with the wrong secret") {
    tcp::socket raw = RawConnect(io, listener->port());
    CHECK_FALSE(test::HandshakeAsDialer(raw, "a-guess-at-the-cluster-secret"));
    REQUIRE(server.WaitClosed());
    CHECK(server.closed->code() == StatusCode::kPermissionDenied);
    CHECK(PeerCloses(raw, 5000ms));
  }
  CHECK(server.messages.empty());
}

TEST_CASE("control auth: a silent peer is closed after control.handshake_timeout_s",
          "[control_auth]") {
  IoThread io;
  Side server;
  ControlOptions options = TestControlOptions();
  options.handshake_timeout_s = 0.3;
  auto listener = Listen(io, &server, options);
  tcp::socket raw = RawConnect(io, listener->port());
  const auto start = std::chrono::steady_clock::now();
  REQUIRE(server.WaitClosed(5000ms));
  CHECK(server.closed->code() == StatusCode::kDeadlineExceeded);
  CHECK(std::chrono::steady_clock::now() - start < 3s);
  CHECK(PeerCloses(raw, 5000ms));
}

TEST_CASE("control auth: a listener holds at most control.max_connections", "[control_auth]") {
  IoThread io;
  ControlOptions options = TestControlOptions();
  options.max_connections = 4;
  options.handshake_timeout_s = 30;  // strangers stay until displaced or the test ends
  auto listener = ControlListener::Listen(io.io, "127.0.0.1", 0, options, [](auto c) {
    c->Start([](ControlMessage) {}, [](const Status&) {});
  });
  REQUIRE(listener.ok());
  const int port = (*listener)->port();
  auto accepted = [](tcp::socket& s) {  // the listener's challenge arrives: it was accepted
    std::array<uint8_t, kAuthChallengeBytes> challenge{};
    boost::system::error_code ec;
    boost::asio::read(s, boost::asio::buffer(challenge), ec);
    return !ec;
  };

  // Four strangers fill the listener without ever answering the handshake.
  std::vector<tcp::socket> strangers;
  for (int i = 0; i < 4; ++i) {
    strangers.push_back(RawConnect(io, port));
    REQUIRE(accepted(strangers.back()));
  }

  // A member still gets in: it displaces the oldest stranger, not another member.
  std::vector<tcp::socket> members;
  for (int i = 0; i < 4; ++i) {
    members.push_back(RawConnect(io, port));
    CHECK(test::HandshakeAsDialer(members.back(), test::kTestClusterSecret));
    CHECK(PeerCloses(strangers[i], 5000ms));  // oldest first
    std::this_thread::sleep_for(50ms);  // the listener's side has checked the member's proof
  }

  // Every slot is a member's: a newcomer is closed as it is accepted, and members stay.
  for (int i = 0; i < 6; ++i) {
    tcp::socket extra = RawConnect(io, port);
    CHECK(PeerCloses(extra, 5000ms));
  }
  for (auto& m : members) CHECK_FALSE(PeerCloses(m, 100ms));

  members.clear();  // closing frees the slots
  bool accepted_again = false;
  for (int attempt = 0; attempt < 50 && !accepted_again; ++attempt) {
    std::this_thread::sleep_for(50ms);
    tcp::socket again = RawConnect(io, port);
    accepted_again = test::HandshakeAsDialer(again, test::kTestClusterSecret);
  }
  CHECK(accepted_again);
}

TEST_CASE("control auth: a member that does not read is cut off, not buffered without bound",
          "[control_auth]") {
  IoThread io;
  std::shared_ptr<ControlConnection> accepted;
  std::mutex mutex;
  std::condition_variable cv;
  ControlOptions options = TestControlOptions();
  options.max_queued_bytes = 1 << 20;
  Side server;
  auto listener = ControlListener::Listen(io.io, "127.0.0.1", 0, options, [&](auto c) {
    c->Start(server.OnMessage(), server.OnClose());
    std::lock_guard<std::mutex> lock(mutex);
    accepted = c;
    cv.notify_all();
  });
  REQUIRE(listener.ok());
  tcp::socket raw = RawConnect(io, (*listener)->port());
  REQUIRE(test::HandshakeAsDialer(raw, test::kTestClusterSecret));  // then never reads
  {
    std::unique_lock<std::mutex> lock(mutex);
    REQUIRE(cv.wait_for(lock, 5s, [&] { return accepted != nullptr; }));
  }
  Tokens t;
  t.request_id = "r";
  t.tokens.resize(4096);  // ~50 KB a frame
  int sent = 0;
  while (sent < 4000 && accepted->Send(t)) ++sent;  // at most ~200 MB if nothing bounded it
  CHECK(sent < 4000);
  REQUIRE(server.WaitClosed());
  CHECK(server.closed->code() == StatusCode::kResourceExhausted);
}

TEST_CASE("control auth: the connection cap leaves file descriptors to the process",
          "[control_auth]") {
  CHECK(MaxConnectionsForFds(1024, 1048576) == 1024);  // a high limit: the configured cap
  CHECK(MaxConnectionsForFds(1024, 1024) == 768);      // 256 descriptors kept back
  CHECK(MaxConnectionsForFds(1024, 256) == 128);       // half of a small limit kept back
  CHECK(MaxConnectionsForFds(100, 256) == 100);
  CHECK(MaxConnectionsForFds(1024, 6) == 4);           // never below 4
}
