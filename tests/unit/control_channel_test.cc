#include <catch2/catch.hpp>

#include <boost/asio/write.hpp>
#include <condition_variable>
#include <thread>

#include "common/net/control_channel.h"
#include "io_thread.h"
#include "tests/test_control.h"

using namespace tandem;
using namespace std::chrono_literals;
using test::IoThread;
using test::TestControlOptions;

namespace {

// Collects what a connection receives; Wait* bound every wait.
struct Inbox {
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<ControlMessage> messages;
  bool closed = false;
  Status close_reason;

  void Add(ControlMessage m) {
    std::lock_guard<std::mutex> lock(mutex);
    messages.push_back(std::move(m));
    cv.notify_all();
  }
  void Close(const Status& s) {
    std::lock_guard<std::mutex> lock(mutex);
    closed = true;
    close_reason = s;
    cv.notify_all();
  }
  bool WaitCount(size_t n) {
    std::unique_lock<std::mutex> lock(mutex);
    return cv.wait_for(lock, 10s, [&] { return messages.size() >= n; });
  }
  bool WaitClosed() {
    std::unique_lock<std::mutex> lock(mutex);
    return cv.wait_for(lock, 10s, [&] { return closed; });
  }
};

}  // namespace

TEST_CASE("control channel: messages flow both ways in order", "[control_channel]") {
  IoThread io;
  Inbox server_inbox, client_inbox;
  std::shared_ptr<ControlConnection> server_side;
  std::mutex accept_mutex;
  auto listener = ControlListener::Listen(io.io, "127.0.0.1", 0, TestControlOptions(), [&](auto connection) {
    std::lock_guard<std::mutex> lock(accept_mutex);
    server_side = connection;
    connection->Start([&](ControlMessage m) { server_inbox.Add(std::move(m)); },
                      [&](const Status& s) { server_inbox.Close(s); });
  });
  REQUIRE(listener.ok());
  auto client = ConnectControl(io.io, "127.0.0.1:" + std::to_string((*listener)->port()), 5, TestControlOptions());
  REQUIRE(client.ok());
  (*client)->Start([&](ControlMessage m) { client_inbox.Add(std::move(m)); },
                   [&](const Status& s) { client_inbox.Close(s); });

  // Many senders at once: the frames must not interleave and each sender's order holds.
  constexpr int kPerThread = 2000;
  std::vector<std::thread> senders;
  for (int t = 0; t < 4; ++t)
    senders.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        Tokens tokens{"req-" + std::to_string(t), {{i, -1.0f, {}}}};
        REQUIRE((*client)->Send(tokens));
      }
    });
  for (auto& s : senders) s.join();
  REQUIRE(server_inbox.WaitCount(4 * kPerThread));
  std::map<std::string, int> next;
  for (const ControlMessage& m : server_inbox.messages) {
    const Tokens& tokens = std::get<Tokens>(m);
    CHECK(tokens.tokens[0].token_id == next[tokens.request_id]++);
  }
  {
    std::lock_guard<std::mutex> lock(accept_mutex);
    REQUIRE(server_side);
    REQUIRE(server_side->Send(Cancel{"req-1"}));
  }
  REQUIRE(client_inbox.WaitCount(1));
  CHECK(std::get<Cancel>(client_inbox.messages[0]).request_id == "req-1");

  // Closing one side closes the other with a reason; Send then returns false.
  (*client)->Close();
  REQUIRE(server_inbox.WaitClosed());
  REQUIRE(client_inbox.WaitClosed());
  CHECK(server_inbox.close_reason.code() == StatusCode::kUnavailable);
  CHECK_FALSE((*client)->Send(Cancel{"x"}));
}

TEST_CASE("control channel: a malformed frame from a member closes the connection",
          "[control_channel]") {
  IoThread io;
  Inbox server_inbox;
  auto listener = ControlListener::Listen(io.io, "127.0.0.1", 0, TestControlOptions(), [&](auto connection) {
    connection->Start([&](ControlMessage m) { server_inbox.Add(std::move(m)); },
                      [&](const Status& s) { server_inbox.Close(s); });
  });
  REQUIRE(listener.ok());
  boost::asio::ip::tcp::socket raw(io.io);
  raw.connect({boost::asio::ip::make_address("127.0.0.1"),
               static_cast<unsigned short>((*listener)->port())});
  test::HandshakeAsDialer(raw, test::kTestClusterSecret);
  boost::asio::write(raw, boost::asio::buffer(std::string("GET / HTTP/1.1\r\n\r\n")));
  REQUIRE(server_inbox.WaitClosed());
  CHECK(server_inbox.close_reason.code() == StatusCode::kDataLoss);
  CHECK(server_inbox.messages.empty());
}

TEST_CASE("control channel: connecting to nobody fails fast", "[control_channel]") {
  IoThread io;
  auto listener = ControlListener::Listen(io.io, "127.0.0.1", 0, TestControlOptions(), [](auto) {});
  REQUIRE(listener.ok());
  int port = (*listener)->port();
  (*listener)->Stop();
  auto client = ConnectControl(io.io, "127.0.0.1:" + std::to_string(port), 5, TestControlOptions());
  REQUIRE_FALSE(client.ok());
  CHECK(client.status().code() == StatusCode::kUnavailable);
  CHECK(ConnectControl(io.io, "nohost", 1, TestControlOptions()).status().message() == "address 'nohost' is not host:port");
}
