// ClusterBackend against fake instances that speak the real control protocol over TCP.
#include <catch2/catch.hpp>

#include <condition_variable>
#include <thread>

#include "common/net/control_channel.h"
#include "io_thread.h"
#include "router/cluster_backend.h"

using namespace tandem;
using namespace std::chrono_literals;
using test::IoThread;

namespace {

template <typename Pred>
bool WaitFor(Pred pred, std::chrono::milliseconds limit = 5000ms) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return pred();
}

// An instance that answers Hello, sends LoadReports every 100 ms, records what the router sends
// and lets the test send Tokens/Finish.
class FakeInstance {
 public:
  FakeInstance(boost::asio::io_context& io, InstanceRole role, int port) : io_(io), role_(role) {
    Listen(port);
    heartbeat_ = std::thread([this] {
      while (!quit_) {
        std::this_thread::sleep_for(100ms);
        std::lock_guard<std::mutex> lock(mutex_);
        if (connection_ && beating_) connection_->Send(report_);
      }
    });
  }
  ~FakeInstance() {
    quit_ = true;
    heartbeat_.join();
    Kill();
  }
  int port() const { return port_; }

  void Listen(int port) {
    auto listener = ControlListener::Listen(io_, "127.0.0.1", port, [this](auto connection) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        connection_ = connection;
      }
      connection->Start([this, connection](ControlMessage m) { OnMessage(connection, m); },
                        [](const Status&) {});
    });
    REQUIRE(listener.ok());
    listener_ = std::move(listener).value();
    port_ = listener_->port();
  }
  // Like kill -9: the listener and the connection go away at once.
  void Kill() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (listener_) listener_->Stop();
    if (connection_) connection_->Close();
    connection_.reset();
  }
  void Restart() {
    Kill();
    std::this_thread::sleep_for(50ms);
    Listen(port_);
  }
  void StopHeartbeat() { beating_ = false; }
  // What the heartbeat reports from now on (default: an idle instance that took nothing in).
  void SetReport(const LoadReport& report) {
    std::lock_guard<std::mutex> lock(mutex_);
    report_ = report;
  }

  void Send(const ControlMessage& m) {
    std::lock_guard<std::mutex> lock(mutex_);
    REQUIRE(connection_);
    connection_->Send(m);
  }
  void SendTokens(const std::string& id, std::vector<int32_t> ids) {
    Tokens t;
    t.request_id = id;
    for (int32_t x : ids) t.tokens.push_back(GeneratedToken{x, 0, {}});
    Send(t);
  }
  void SendFinish(const std::string& id, std::string reason = "length") {
    Finish f;
    f.request_id = id;
    f.finish_reason = std::move(reason);
    Send(f);
  }
  std::vector<tandem::Submit> submits() {
    std::lock_guard<std::mutex> lock(mutex_);
    return submits_;
  }
  std::vector<std::string> cancels() {
    std::lock_guard<std::mutex> lock(mutex_);
    return cancels_;
  }

 private:
  void OnMessage(const std::shared_ptr<ControlConnection>& connection, ControlMessage m) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (std::holds_alternative<Hello>(m)) {
      Hello hello;
      hello.role = role_;
      hello.name = InstanceRoleName(role_);
      hello.model = "fake";
      hello.control_address = "127.0.0.1:" + std::to_string(port_);
      hello.kv_block_size = 16;
      hello.kv_total_blocks = 1000;
      connection->Send(hello);
    } else if (auto* s = std::get_if<tandem::Submit>(&m)) {
      submits_.push_back(*s);
    } else if (auto* c = std::get_if<tandem::Cancel>(&m)) {
      cancels_.push_back(c->request_id);
    }
  }

  boost::asio::io_context& io_;
  InstanceRole role_;
  int port_ = 0;
  std::atomic<bool> quit_{false};
  std::atomic<bool> beating_{true};
  std::mutex mutex_;
  std::unique_ptr<ControlListener> listener_;
  std::shared_ptr<ControlConnection> connection_;
  std::vector<tandem::Submit> submits_;
  std::vector<std::string> cancels_;
  LoadReport report_;
  std::thread heartbeat_;
};

// What one request's callback saw.
struct Events {
  std::mutex mutex;
  std::vector<int32_t> tokens;
  std::optional<std::string> finish;
  Status error;
  int finals = 0;

  std::function<void(BackendEvent)> Callback() {
    return [this](BackendEvent e) {
      std::lock_guard<std::mutex> lock(mutex);
      for (auto& t : e.tokens) tokens.push_back(t.token_id);
      if (e.finish_reason || !e.error.ok()) ++finals;
      if (e.finish_reason) finish = e.finish_reason;
      if (!e.error.ok()) error = e.error;
    };
  }
  bool Done() {
    std::lock_guard<std::mutex> lock(mutex);
    return finals > 0;
  }
};

GenerateRequest Request(const std::string& id, int prompt_tokens = 8) {
  GenerateRequest r;
  r.request_id = id;
  r.prompt_token_ids.assign(prompt_tokens, 7);
  r.sampling.max_tokens = 4;
  return r;
}

ClusterConfig Config(int prefill_port, int prefill_n, int decode_port, int decode_n) {
  ClusterConfig c;
  c.prefill.instances = prefill_n;
  c.prefill.port = prefill_port;
  c.decode.instances = decode_n;
  c.decode.port = decode_port;
  c.colocated.instances = 0;
  c.router.policy = "round_robin";
  c.source = "test";
  return c;
}

// Two adjacent free ports (instance I listens on base + I).
int FreePortPair(boost::asio::io_context& io) {
  for (int attempt = 0; attempt < 50; ++attempt) {
    auto a = ControlListener::Listen(io, "127.0.0.1", 0, [](auto) {});
    REQUIRE(a.ok());
    int base = (*a)->port();
    auto b = ControlListener::Listen(io, "127.0.0.1", base + 1, [](auto) {});
    if (b.ok()) return base;
  }
  FAIL("no two adjacent free ports");
  return 0;
}

}  // namespace

TEST_CASE("cluster backend: a request flows prefill -> decode -> callback", "[cluster_backend]") {
  IoThread io;
  FakeInstance p(io.io, InstanceRole::kPrefill, 0), d(io.io, InstanceRole::kDecode, 0);
  ClusterBackend backend(Config(p.port(), 1, d.port(), 1));
  CHECK_FALSE(backend.Ready());
  REQUIRE(backend.Start().ok());
  REQUIRE(WaitFor([&] { return backend.Ready(); }));

  Events events;
  REQUIRE(backend.Submit(Request("r1"), events.Callback()).ok());
  REQUIRE(WaitFor([&] { return p.submits().size() == 1; }));
  CHECK(p.submits()[0].decode_address == "127.0.0.1:" + std::to_string(d.port()));
  CHECK(p.submits()[0].prompt.size() == 8);

  // Decode's tokens overtake the first token: they are held back until it arrives.
  d.SendTokens("r1", {2, 3});
  std::this_thread::sleep_for(100ms);
  {
    std::lock_guard<std::mutex> lock(events.mutex);
    CHECK(events.tokens.empty());
  }
  p.SendTokens("r1", {1});
  d.SendTokens("r1", {4});
  d.SendFinish("r1", "length");
  REQUIRE(WaitFor([&] { return events.Done(); }));
  CHECK(events.tokens == std::vector<int32_t>{1, 2, 3, 4});
  CHECK(events.finish == "length");
  CHECK(events.finals == 1);
  CHECK(backend.InFlight() == 0);

  // Cancel reaches both instances; an unknown id is ignored.
  Events cancelled;
  REQUIRE(backend.Submit(Request("r2"), cancelled.Callback()).ok());
  backend.Cancel("r2");
  backend.Cancel("nope");
  REQUIRE(WaitFor([&] { return !p.cancels().empty() && !d.cancels().empty(); }));
  CHECK(p.cancels()[0] == "r2");
  Finish f;
  f.request_id = "r2";
  f.code = StatusCode::kCancelled;
  f.message = "cancelled";
  p.Send(f);
  REQUIRE(WaitFor([&] { return cancelled.Done(); }));
  CHECK(cancelled.error.code() == StatusCode::kCancelled);
  backend.Stop();
}

TEST_CASE("cluster backend: a dead decode fails exactly its requests", "[cluster_backend]") {
  IoThread io;
  int d_base = FreePortPair(io.io);
  FakeInstance p(io.io, InstanceRole::kPrefill, 0);
  FakeInstance d0(io.io, InstanceRole::kDecode, d_base), d1(io.io, InstanceRole::kDecode,
                                                              d_base + 1);
  ClusterBackend backend(Config(p.port(), 1, d_base, 2));
  REQUIRE(backend.Start().ok());
  REQUIRE(WaitFor([&] {
    auto all = backend.Instances();
    return std::all_of(all.begin(), all.end(), [](auto& s) { return s.usable; });
  }));

  // round_robin: r0 -> decode-0, r1 -> decode-1.
  Events e0, e1;
  REQUIRE(backend.Submit(Request("r0"), e0.Callback()).ok());
  REQUIRE(backend.Submit(Request("r1"), e1.Callback()).ok());
  REQUIRE(WaitFor([&] { return p.submits().size() == 2; }));
  CHECK(p.submits()[0].decode_address == "127.0.0.1:" + std::to_string(d_base));
  p.SendTokens("r0", {1});
  p.SendTokens("r1", {1});
  d0.SendTokens("r0", {2});
  d1.SendTokens("r1", {2});
  REQUIRE(WaitFor([&] {
    std::lock_guard<std::mutex> a(e0.mutex);
    std::lock_guard<std::mutex> b(e1.mutex);
    return e0.tokens.size() == 2 && e1.tokens.size() == 2;
  }));

  d0.Kill();
  REQUIRE(WaitFor([&] { return e0.Done(); }));
  CHECK(e0.error.code() == StatusCode::kUnavailable);
  CHECK(e0.error.message().find("decode-0") != std::string::npos);
  CHECK_FALSE(e1.Done());
  CHECK(backend.Ready());  // decode-1 still serves

  // The other request finishes normally; and the prefill dying now does not hurt it.
  p.Kill();
  std::this_thread::sleep_for(100ms);
  CHECK_FALSE(e1.Done());
  d1.SendTokens("r1", {3});
  d1.SendFinish("r1", "stop");
  REQUIRE(WaitFor([&] { return e1.Done(); }));
  CHECK(e1.error.ok());
  CHECK(e1.tokens == std::vector<int32_t>{1, 2, 3});
  CHECK(e1.finals == 1);
  CHECK_FALSE(backend.Ready());  // no prefill

  // Both come back (same ports) and are picked up again.
  d0.Restart();
  p.Restart();
  REQUIRE(WaitFor([&] {
    auto all = backend.Instances();
    return std::all_of(all.begin(), all.end(), [](auto& s) { return s.usable; });
  }, 8000ms));
  Events e2;
  REQUIRE(backend.Submit(Request("r2"), e2.Callback()).ok());
  REQUIRE(WaitFor([&] { return p.submits().size() == 3; }));
  backend.Stop();
  REQUIRE(e2.Done());
  CHECK(e2.error.code() == StatusCode::kUnavailable);  // the router stopped
}

TEST_CASE("cluster backend: a prefill that dies before the first token fails its request",
          "[cluster_backend]") {
  IoThread io;
  FakeInstance p(io.io, InstanceRole::kPrefill, 0), d(io.io, InstanceRole::kDecode, 0);
  ClusterBackend backend(Config(p.port(), 1, d.port(), 1));
  REQUIRE(backend.Start().ok());
  REQUIRE(WaitFor([&] { return backend.Ready(); }));
  Events e;
  REQUIRE(backend.Submit(Request("r"), e.Callback()).ok());
  REQUIRE(WaitFor([&] { return p.submits().size() == 1; }));
  p.Kill();
  REQUIRE(WaitFor([&] { return e.Done(); }));
  CHECK(e.error.code() == StatusCode::kUnavailable);
  CHECK(e.error.message().find("prefill-0") != std::string::npos);
  REQUIRE(WaitFor([&] { return !d.cancels().empty(); }));  // decode is told to drop it
  CHECK(d.cancels()[0] == "r");
  // No instance: Submit is refused at once, with no callback.
  Events refused;
  Status s = backend.Submit(Request("r3"), refused.Callback());
  CHECK(s.code() == StatusCode::kUnavailable);
  CHECK_FALSE(refused.Done());
}

TEST_CASE("cluster backend: a silent instance is down after the heartbeat timeout",
          "[cluster_backend]") {
  IoThread io;
  FakeInstance p(io.io, InstanceRole::kPrefill, 0), d(io.io, InstanceRole::kDecode, 0);
  ClusterBackend backend(Config(p.port(), 1, d.port(), 1));
  REQUIRE(backend.Start().ok());
  REQUIRE(WaitFor([&] { return backend.Ready(); }));
  d.StopHeartbeat();
  auto start = std::chrono::steady_clock::now();
  REQUIRE(WaitFor([&] { return !backend.Ready(); }, 3000ms));
  CHECK(std::chrono::steady_clock::now() - start >= 800ms);
}

TEST_CASE("cluster backend: goodput rejects with ResourceExhausted", "[cluster_backend]") {
  IoThread io;
  FakeInstance p(io.io, InstanceRole::kPrefill, 0), d(io.io, InstanceRole::kDecode, 0);
  ClusterConfig config = Config(p.port(), 1, d.port(), 1);
  config.router.policy = "goodput";
  config.slo.ttft_s = 0.05;  // 100 tokens at the default 0.5 ms/token = 50 ms
  ClusterBackend backend(config);
  REQUIRE(backend.Start().ok());
  REQUIRE(WaitFor([&] { return backend.Ready(); }));
  Events first, second;
  // The idle cluster takes even a request over the SLO; the next one (queued behind it) not.
  REQUIRE(backend.Submit(Request("a", 200), first.Callback()).ok());
  Status s = backend.Submit(Request("b", 200), second.Callback());
  CHECK(s.code() == StatusCode::kResourceExhausted);
  // A reload with a looser SLO admits it.
  config.slo.ttft_s = 10;
  REQUIRE(backend.Reconfigure(config).ok());
  CHECK(backend.Submit(Request("b", 200), second.Callback()).ok());
  backend.Stop();
}

TEST_CASE("cluster backend: a report that lags the submits does not erase them",
          "[cluster_backend]") {
  IoThread io;
  FakeInstance p(io.io, InstanceRole::kPrefill, 0), d(io.io, InstanceRole::kDecode, 0);
  ClusterConfig config = Config(p.port(), 1, d.port(), 1);
  config.router.policy = "goodput";
  config.slo.ttft_s = 0.15;  // 200 tokens at the default 0.5 ms/token = 0.1 s; 400 = 0.2 s
  ClusterBackend backend(config);
  REQUIRE(backend.Start().ok());
  REQUIRE(WaitFor([&] { return backend.Ready(); }));
  Events a, b;
  REQUIRE(backend.Submit(Request("a", 200), a.Callback()).ok());
  REQUIRE(WaitFor([&] { return p.submits().size() == 1; }));
  CHECK(p.submits()[0].seq == 1u);
  // The instance is busy with a long step: its heartbeats still say "idle, took in nothing"
  // (last_submit_seq 0). The router must keep counting "a", so "b" still does not fit.
  std::this_thread::sleep_for(350ms);
  CHECK(backend.Submit(Request("b", 200), b.Callback()).code() == StatusCode::kResourceExhausted);
  // Once a report has taken "a" in (and says its queue is empty again), "b" fits.
  LoadReport took_a;
  took_a.last_submit_seq = 1;
  p.SetReport(took_a);
  REQUIRE(WaitFor([&] { return backend.Submit(Request("b", 200), b.Callback()).ok(); }));
  REQUIRE(WaitFor([&] { return p.submits().size() == 2; }));
  CHECK(p.submits()[1].seq == 2u);
  backend.Stop();
}
