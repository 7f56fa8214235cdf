// The instance host (common/serving), its gate, the connection table's router sessions, and the
// two handoff state machines' transition tables.
#include <catch2/catch.hpp>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "common/net/connection_table.h"
#include "common/net/control_channel.h"
#include "common/serving/gate.h"
#include "common/serving/instance_host.h"
#include "decode/kv_intake.h"
#include "io_thread.h"
#include "tests/test_control.h"
#include "prefill/kv_handoff.h"

using namespace tandem;
using namespace std::chrono_literals;
using test::TestControlOptions;
using test::IoThread;

namespace {

using Clock = std::chrono::steady_clock;

// What a client connection received.
struct Received {
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<ControlMessage> messages;
  bool closed = false;

  template <typename Pred>
  bool WaitFor(Pred pred, std::chrono::milliseconds timeout = 10s) {
    std::unique_lock<std::mutex> lock(mutex);
    return cv.wait_for(lock, timeout, [&] { return pred(); });
  }
  template <typename T>
  int Count() {
    int n = 0;
    for (auto& m : messages) n += std::holds_alternative<T>(m);
    return n;
  }
};

std::shared_ptr<ControlConnection> Client(IoThread& io, int port, Received* received) {
  auto conn = ConnectControl(io.io, "127.0.0.1:" + std::to_string(port), 5, TestControlOptions());
  REQUIRE(conn.ok());
  (*conn)->Start(
      [received](ControlMessage m) {
        std::lock_guard<std::mutex> lock(received->mutex);
        received->messages.push_back(std::move(m));
        received->cv.notify_all();
      },
      [received](const Status&) {
        std::lock_guard<std::mutex> lock(received->mutex);
        received->closed = true;
        received->cv.notify_all();
      });
  return *conn;
}

// A driver that records what the host hands it; `busy` in-flight requests keep a drain going
// until FailAll (or a Cancel) ends them.
class FakeDriver : public InstanceDriver {
 public:
  explicit FakeDriver(InstanceHost** host) : host_(host) {}
  void OnMessage(ConnId conn, ControlMessage message) override {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto* s = std::get_if<Submit>(&message)) {
      submits.push_back(s->request_id);
      router = conn;
      ++busy;
    }
    if (std::holds_alternative<Cancel>(message)) --busy;
    cv.notify_all();
  }
  void OnClosed(ConnId, std::optional<uint64_t> session) override {
    std::lock_guard<std::mutex> lock(mutex);
    closed_sessions.push_back(session.value_or(0));
    cv.notify_all();
  }
  bool Step() override { return false; }
  bool Idle() const override {
    std::lock_guard<std::mutex> lock(mutex);
    return busy == 0;
  }
  void FailAll(const Status& why) override {
    std::lock_guard<std::mutex> lock(mutex);
    for (const std::string& id : submits) {
      Finish f;
      f.request_id = id;
      f.code = why.code();
      (*host_)->Send(router, f);
    }
    busy = 0;
  }
  LoadReport Load() override { return LoadReport{}; }

  mutable std::mutex mutex;
  std::condition_variable cv;
  std::vector<std::string> submits;
  std::vector<uint64_t> closed_sessions;
  ConnId router = 0;
  int busy = 0;

 private:
  InstanceHost** host_;
};

HostOptions Options(double heartbeat_s, double drain_s) {
  HostOptions o;
  o.name = "test-0";
  o.role = InstanceRole::kDecode;
  o.model = "m";
  o.control.heartbeat_interval_s = heartbeat_s;
  o.control_options = TestControlOptions();
  o.drain_timeout_s = drain_s;
  return o;
}

Hello RouterHello(uint64_t session) {
  Hello h;
  h.role = InstanceRole::kRouter;
  h.instance_id = session;
  h.name = "router";
  return h;
}

}  // namespace

TEST_CASE("gate: closing refuses entries, waiting ends when the last one leaves", "[serving]") {
  Gate gate;
  REQUIRE(gate.TryEnter());
  REQUIRE(gate.TryEnter());
  gate.Close();
  CHECK_FALSE(gate.TryEnter());
  CHECK_FALSE(gate.Wait(Clock::now() + 20ms));  // two inside
  std::thread leaver([&] {
    gate.Leave();
    gate.Leave();
  });
  CHECK(gate.Wait(Clock::now() + 5s));
  leaver.join();
  CHECK(gate.inside() == 0);
}

TEST_CASE("control channel: CloseAfterFlush writes every queued frame, then closes",
          "[control_channel]") {
  IoThread io;
  Received server;
  std::shared_ptr<ControlConnection> accepted;
  std::mutex accept_mutex;
  std::condition_variable accept_cv;
  auto listener = ControlListener::Listen(io.io, "127.0.0.1", 0, TestControlOptions(), [&](auto c) {
    std::lock_guard<std::mutex> lock(accept_mutex);
    accepted = c;
    accept_cv.notify_all();
  });
  REQUIRE(listener.ok());
  Received client_side;
  auto client = Client(io, (*listener)->port(), &client_side);
  {
    std::unique_lock<std::mutex> lock(accept_mutex);
    REQUIRE(accept_cv.wait_for(lock, 5s, [&] { return accepted != nullptr; }));
  }
  accepted->Start([](ControlMessage) {}, [](const Status&) {});  // the handshake runs
  Tokens t;
  t.request_id = "r";
  t.tokens.resize(64);
  for (int i = 0; i < 500; ++i) REQUIRE(accepted->Send(t));
  accepted->CloseAfterFlush();
  CHECK_FALSE(accepted->Send(t));  // refused once the close is asked for
  REQUIRE(client_side.WaitFor([&] { return client_side.closed; }));
  std::lock_guard<std::mutex> lock(client_side.mutex);
  CHECK(client_side.Count<Tokens>() == 500);
}

TEST_CASE("connection table: a router session is open while one of its connections is",
          "[serving]") {
  IoThread io;
  auto listener = ControlListener::Listen(io.io, "127.0.0.1", 0, TestControlOptions(), [](auto) {});
  REQUIRE(listener.ok());
  auto a = ConnectControl(io.io, "127.0.0.1:" + std::to_string((*listener)->port()), 5, TestControlOptions());
  auto b = ConnectControl(io.io, "127.0.0.1:" + std::to_string((*listener)->port()), 5, TestControlOptions());
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  ConnectionTable table;
  const ConnId ia = table.Add(*a);
  const ConnId ib = table.Add(*b);
  CHECK_FALSE(table.RouterSession(7).has_value());
  table.MarkRouter(ia, 7);
  table.MarkRouter(ib, 7);
  CHECK(table.RouterSession(7) == ib);  // the latest
  CHECK(table.SessionOf(ia) == 7u);
  CHECK(table.Routers().size() == 2);
  table.Remove(ib);
  CHECK(table.RouterSession(7) == ia);
  table.Remove(ia);
  CHECK_FALSE(table.RouterSession(7).has_value());
  CHECK(table.size() == 0);
}

TEST_CASE("instance host: Hello, sessions, load reports at the configured interval",
          "[serving]") {
  InstanceHost* host_ptr = nullptr;
  FakeDriver driver(&host_ptr);
  auto host = InstanceHost::Create(Options(0.05, 5));
  REQUIRE(host.ok());
  host_ptr = host->get();
  (*host)->Run(&driver);
  IoThread io;
  Received router;
  auto conn = Client(io, (*host)->control_port(), &router);
  conn->Send(RouterHello(42));
  REQUIRE(router.WaitFor([&] { return router.Count<Hello>() == 1; }));
  {
    std::lock_guard<std::mutex> lock(router.mutex);
    const Hello& hello = std::get<Hello>(router.messages[0]);
    CHECK(hello.role == InstanceRole::kDecode);
    CHECK(hello.name == "test-0");
    CHECK(hello.instance_id == (*host)->instance_id());
  }
  CHECK((*host)->RouterSession(42).has_value());
  const auto t0 = Clock::now();
  REQUIRE(router.WaitFor([&] { return router.Count<LoadReport>() >= 10; }));
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  CHECK(seconds > 0.3);  // ten reports 50 ms apart
  CHECK(seconds < 3.0);
  Submit s;
  s.request_id = "x";
  conn->Send(s);
  {
    std::unique_lock<std::mutex> lock(driver.mutex);
    REQUIRE(driver.cv.wait_for(lock, 5s, [&] { return driver.submits.size() == 1; }));
  }
  conn->Send(Cancel{"x"});
  conn->Close();
  {
    std::unique_lock<std::mutex> lock(driver.mutex);
    REQUIRE(driver.cv.wait_for(lock, 5s, [&] { return driver.closed_sessions.size() == 1; }));
    CHECK(driver.closed_sessions[0] == 42);
  }
  CHECK_FALSE((*host)->RouterSession(42).has_value());
  (*host)->Stop();
}

TEST_CASE("instance host: only the router may Submit or Cancel", "[serving]") {
  InstanceHost* host_ptr = nullptr;
  FakeDriver driver(&host_ptr);
  auto host = InstanceHost::Create(Options(0.05, 5));
  REQUIRE(host.ok());
  host_ptr = host->get();
  (*host)->Run(&driver);
  IoThread io;
  for (bool hello_first : {false, true}) {
    // A member (it holds the secret) that is not the router: a peer instance, or one that
    // skipped Hello. Its Submit and Cancel are refused and its connection closed.
    Received peer;
    auto conn = Client(io, (*host)->control_port(), &peer);
    if (hello_first) {
      Hello h = RouterHello(7);
      h.role = InstanceRole::kPrefill;
      conn->Send(h);
    }
    Submit s;
    s.request_id = "not-from-the-router";
    conn->Send(s);
    conn->Send(Cancel{"someone-elses"});
    REQUIRE(peer.WaitFor([&] { return peer.closed; }));
  }
  std::lock_guard<std::mutex> lock(driver.mutex);
  CHECK(driver.submits.empty());
  CHECK(driver.busy == 0);
}

TEST_CASE("instance host: stop drains, and the last frames leave before the socket closes",
          "[serving]") {
  InstanceHost* host_ptr = nullptr;
  FakeDriver driver(&host_ptr);
  auto host = InstanceHost::Create(Options(0.05, 0.3));
  REQUIRE(host.ok());
  host_ptr = host->get();
  (*host)->Run(&driver);
  IoThread io;
  Received router;
  auto conn = Client(io, (*host)->control_port(), &router);
  conn->Send(RouterHello(1));
  for (int i = 0; i < 50; ++i) {
    Submit s;
    s.request_id = "r" + std::to_string(i);
    conn->Send(s);
  }
  {
    std::unique_lock<std::mutex> lock(driver.mutex);
    REQUIRE(driver.cv.wait_for(lock, 5s, [&] { return driver.submits.size() == 50; }));
  }
  const auto t0 = Clock::now();
  (*host)->Stop();  // the requests never finish: the drain runs out, FailAll sends 50 Finishes
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  CHECK(seconds >= 0.3);
  CHECK(seconds < 5);
  CHECK_FALSE((*host)->accepting());
  REQUIRE(router.WaitFor([&] { return router.closed; }));
  std::lock_guard<std::mutex> lock(router.mutex);
  CHECK(router.Count<Finish>() == 50);
}

TEST_CASE("handoff state machines: only the named transitions are allowed", "[serving]") {
  using H = HandoffState;
  CHECK(HandoffTransitionAllowed(H::kQueued, H::kPrefilling));
  CHECK(HandoffTransitionAllowed(H::kQueued, H::kPublished));
  CHECK(HandoffTransitionAllowed(H::kPrefilling, H::kPublished));
  CHECK(HandoffTransitionAllowed(H::kPublished, H::kReleased));
  CHECK(HandoffTransitionAllowed(H::kPublished, H::kFailed));
  CHECK_FALSE(HandoffTransitionAllowed(H::kPublished, H::kQueued));
  CHECK_FALSE(HandoffTransitionAllowed(H::kPrefilling, H::kReleased));
  CHECK_FALSE(HandoffTransitionAllowed(H::kReleased, H::kFailed));
  CHECK_FALSE(HandoffTransitionAllowed(H::kFailed, H::kReleased));

  using I = IntakeState;
  CHECK(IntakeTransitionAllowed(I::kWaiting, I::kPulling));
  CHECK(IntakeTransitionAllowed(I::kPulling, I::kStreaming));
  CHECK(IntakeTransitionAllowed(I::kPulling, I::kPulled));
  CHECK(IntakeTransitionAllowed(I::kPulled, I::kReleased));
  CHECK(IntakeTransitionAllowed(I::kStreaming, I::kAbandoned));
  CHECK(IntakeTransitionAllowed(I::kAbandoned, I::kFailed));
  for (I from : {I::kWaiting, I::kPulling, I::kStreaming, I::kPulled, I::kAbandoned})
    CHECK(IntakeTransitionAllowed(from, I::kFailed));
  CHECK_FALSE(IntakeTransitionAllowed(I::kWaiting, I::kReleased));
  CHECK_FALSE(IntakeTransitionAllowed(I::kPulled, I::kPulling));
  CHECK_FALSE(IntakeTransitionAllowed(I::kAbandoned, I::kStreaming));
  CHECK_FALSE(IntakeTransitionAllowed(I::kReleased, I::kFailed));
}

TEST_CASE("decode stops starting pulls a margin before prefill's hold ends", "[instance]") {
  // cuda_ipc copies read prefill's pool directly and cannot be refused once prefill reuses the
  // blocks, so they keep a transfer timeout's margin; the others 1 s; a fifth of a short hold.
  CHECK(PullStartMarginSeconds("ucx", 5, 30) == 1.0);
  CHECK(PullStartMarginSeconds("nccl", 5, 30) == 1.0);
  CHECK(PullStartMarginSeconds("cuda_ipc", 5, 30) == 5.0);
  CHECK(PullStartMarginSeconds("cuda_ipc", 0.5, 30) == 1.0);
  CHECK(PullStartMarginSeconds("cuda_ipc", 5, 10) == 5.0);  // never less than a copy's bound
  CHECK(PullStartMarginSeconds("ucx", 5, 1) == Approx(0.2));
}
