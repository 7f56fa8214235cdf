// ClusterBackend against fake instances that speak the real control protocol over TCP.
#include <catch2/catch.hpp>

#include <condition_variable>
#include <thread>

#include "common/net/control_channel.h"
#include "fake_instance.h"
#include "io_thread.h"
#include "router/cluster_backend.h"
#include "tests/test_control.h"

using namespace tandem;
using namespace std::chrono_literals;
using test::FakeInstance;
using test::FreePortPair;
using test::IoThread;
using test::WaitFor;

namespace {

ClusterBackendOptions TestBackendOptions() {
  ClusterBackendOptions options;
  options.control = test::TestControlOptions();
  return options;
}

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

}  // namespace

TEST_CASE("cluster backend: a request flows prefill -> decode -> callback", "[cluster_backend]") {
  IoThread io;
  FakeInstance p(io.io, InstanceRole::kPrefill, 0), d(io.io, InstanceRole::kDecode, 0);
  ClusterBackend backend(Config(p.port(), 1, d.port(), 1), TestBackendOptions());
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
  ClusterBackend backend(Config(p.port(), 1, d_base, 2), TestBackendOptions());
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
  ClusterBackend backend(Config(p.port(), 1, d.port(), 1), TestBackendOptions());
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
  ClusterConfig config = Config(p.port(), 1, d.port(), 1);
  config.control.heartbeat_timeout_s = 1.0;
  ClusterBackend backend(config, TestBackendOptions());
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
  ClusterBackend backend(config, TestBackendOptions());
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
  ClusterBackend backend(config, TestBackendOptions());
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

TEST_CASE("cluster backend: one late report within the heartbeat timeout fails nothing",
          "[cluster_backend]") {
  IoThread io;
  FakeInstance p(io.io, InstanceRole::kPrefill, 0), d(io.io, InstanceRole::kDecode, 0);
  ClusterConfig config = Config(p.port(), 1, d.port(), 1);
  config.control.heartbeat_timeout_s = 3.0;
  ClusterBackend backend(config, TestBackendOptions());
  REQUIRE(backend.Start().ok());
  REQUIRE(WaitFor([&] { return backend.Ready(); }));
  Events e;
  REQUIRE(backend.Submit(Request("r"), e.Callback()).ok());
  REQUIRE(WaitFor([&] { return p.submits().size() == 1; }));
  p.SendTokens("r", {1});
  // The decode instance stalls for 1.5 s: more than a second, less than the timeout.
  d.StopHeartbeat();
  std::this_thread::sleep_for(1500ms);
  d.ResumeHeartbeat();
  std::this_thread::sleep_for(300ms);
  CHECK_FALSE(e.Done());
  CHECK(backend.Ready());
  CHECK(d.closes() == 0);
  d.SendTokens("r", {2});
  d.SendFinish("r", "length");
  REQUIRE(WaitFor([&] { return e.Done(); }));
  CHECK(e.error.ok());
  CHECK(e.tokens == std::vector<int32_t>{1, 2});
  backend.Stop();
}

TEST_CASE("cluster backend: router sessions: a fresh id per connection, ended when given up",
          "[cluster_backend]") {
  IoThread io;
  FakeInstance p(io.io, InstanceRole::kPrefill, 0), d(io.io, InstanceRole::kDecode, 0);
  ClusterConfig config = Config(p.port(), 1, d.port(), 1);
  config.control.heartbeat_timeout_s = 1.0;
  ClusterBackend backend(config, TestBackendOptions());
  REQUIRE(backend.Start().ok());
  REQUIRE(WaitFor([&] { return backend.Ready(); }));
  REQUIRE(p.hellos().size() == 1);
  REQUIRE(d.hellos().size() == 1);
  const uint64_t p_session = p.hellos()[0].instance_id, d_session = d.hellos()[0].instance_id;
  CHECK(p.hellos()[0].role == InstanceRole::kRouter);
  CHECK(p_session != 0);
  CHECK(d_session != 0);
  CHECK(p_session != d_session);
  CHECK(backend.Instances()[1].session == d_session);

  // Every Submit names the router's session with the chosen decode instance.
  Events e;
  REQUIRE(backend.Submit(Request("r"), e.Callback()).ok());
  REQUIRE(WaitFor([&] { return p.submits().size() == 1; }));
  CHECK(p.submits()[0].decode_session == d_session);

  // The decode instance goes silent: the router fails its request and closes the connection
  // (the instance reads the close and drops the session's requests).
  d.StopHeartbeat();
  REQUIRE(WaitFor([&] { return e.Done(); }));
  CHECK(e.error.code() == StatusCode::kUnavailable);
  CHECK(e.error.message().find("decode-0") != std::string::npos);
  REQUIRE(WaitFor([&] { return d.closes() == 1; }));

  // It comes back: a new connection, a new session id, and new Submits carry it.
  d.ResumeHeartbeat();
  REQUIRE(WaitFor([&] { return d.hellos().size() == 2 && backend.Ready(); }));
  const uint64_t d_session2 = d.hellos()[1].instance_id;
  CHECK(d_session2 != 0);
  CHECK(d_session2 != d_session);
  Events e2;
  REQUIRE(backend.Submit(Request("r2"), e2.Callback()).ok());
  REQUIRE(WaitFor([&] { return p.submits().size() == 2; }));
  CHECK(p.submits()[1].decode_session == d_session2);
  backend.Stop();
}

TEST_CASE("cluster backend: a burst spreads over idle decode instances under every policy",
          "[cluster_backend]") {
  for (const char* policy : {"goodput", "least_loaded", "round_robin"}) {
    for (bool first_tokens : {false, true}) {
      INFO("policy " << policy << (first_tokens ? ", first tokens come back" : ""));
      IoThread io;
      int d_base = FreePortPair(io.io);
      FakeInstance p(io.io, InstanceRole::kPrefill, 0);
      FakeInstance d0(io.io, InstanceRole::kDecode, d_base);
      FakeInstance d1(io.io, InstanceRole::kDecode, d_base + 1);
      ClusterConfig config = Config(p.port(), 1, d_base, 2);
      config.router.policy = policy;
      config.slo.ttft_s = 60;
      ClusterBackend backend(config, TestBackendOptions());
      REQUIRE(backend.Start().ok());
      REQUIRE(WaitFor([&] {
        auto all = backend.Instances();
        return std::all_of(all.begin(), all.end(), [](auto& s) { return s.usable; });
      }));
      // 16 streams at once. The fakes' reports always say "idle" (a real instance's would count
      // what it was sent): paused for the burst (well inside the 3 s heartbeat timeout), so that
      // one arriving mid-burst on a slow machine does not wipe what the router placed since the
      // last one, which is what this checks it counts.
      d0.StopHeartbeat();
      d1.StopHeartbeat();
      std::vector<std::unique_ptr<Events>> events;
      for (int i = 0; i < 16; ++i) {
        events.push_back(std::make_unique<Events>());
        std::string id = "r" + std::to_string(i);
        REQUIRE(backend.Submit(Request(id), events.back()->Callback()).ok());
        if (first_tokens) {  // a fast prefill: the first token is back before the next request
          REQUIRE(WaitFor([&] { return static_cast<int>(p.submits().size()) == i + 1; }));
          p.SendTokens(id, {1});
          REQUIRE(WaitFor([&] {
            std::lock_guard<std::mutex> lock(events.back()->mutex);
            return !events.back()->tokens.empty();
          }));
        }
      }
      REQUIRE(WaitFor([&] { return p.submits().size() == 16; }));
      int on_d0 = 0;
      for (const auto& s : p.submits())
        on_d0 += s.decode_address == "127.0.0.1:" + std::to_string(d_base) ? 1 : 0;
      CHECK(on_d0 >= 6);
      CHECK(on_d0 <= 10);
      d0.ResumeHeartbeat();
      d1.ResumeHeartbeat();
      backend.Stop();
    }
  }
}

TEST_CASE("cluster backend: the choices of one request go where the first went",
          "[cluster_backend]") {
  // round_robin alternates the two decode instances; choices placed with "c-0" do not.
  IoThread io;
  int d_base = FreePortPair(io.io);
  FakeInstance p(io.io, InstanceRole::kPrefill, 0);
  FakeInstance d0(io.io, InstanceRole::kDecode, d_base);
  FakeInstance d1(io.io, InstanceRole::kDecode, d_base + 1);
  ClusterConfig config = Config(p.port(), 1, d_base, 2);
  config.router.policy = "round_robin";
  ClusterBackend backend(config, TestBackendOptions());
  REQUIRE(backend.Start().ok());
  REQUIRE(WaitFor([&] {
    auto all = backend.Instances();
    return std::all_of(all.begin(), all.end(), [](auto& s) { return s.usable; });
  }));
  std::vector<std::unique_ptr<Events>> events;
  for (int i = 0; i < 4; ++i) {
    GenerateRequest r = Request("c-" + std::to_string(i));
    if (i > 0) r.place_with = "c-0";
    events.push_back(std::make_unique<Events>());
    REQUIRE(backend.Submit(r, events.back()->Callback()).ok());
  }
  // A sibling that is not (or no longer) known: placed as any request (round robin goes on).
  GenerateRequest orphan = Request("o-1");
  orphan.place_with = "o-0";
  events.push_back(std::make_unique<Events>());
  REQUIRE(backend.Submit(orphan, events.back()->Callback()).ok());
  REQUIRE(WaitFor([&] { return p.submits().size() == 5; }));
  const auto submits = p.submits();
  for (int i = 1; i < 4; ++i) CHECK(submits[i].decode_address == submits[0].decode_address);
  CHECK(submits[4].decode_address != submits[0].decode_address);
  backend.Stop();
}

TEST_CASE("cluster backend: an unknown SLO class is refused naming the header",
          "[cluster_backend]") {
  IoThread io;
  FakeInstance p(io.io, InstanceRole::kPrefill, 0), d(io.io, InstanceRole::kDecode, 0);
  ClusterConfig config = Config(p.port(), 1, d.port(), 1);
  config.slo.classes.push_back(SloClass{"batch", 30, 1});
  ClusterBackend backend(config, TestBackendOptions());
  REQUIRE(backend.Start().ok());
  REQUIRE(WaitFor([&] { return backend.Ready(); }));
  GenerateRequest request = Request("r");
  request.slo_class = "premium";
  Events e;
  Status s = backend.Submit(request, e.Callback());
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("x-tandem-slo-class") != std::string::npos);
  CHECK(s.message().find("premium") != std::string::npos);
  CHECK(s.message().find("batch") != std::string::npos);
  CHECK(backend.CheckSloClass("premium").code() == StatusCode::kInvalidArgument);
  CHECK(backend.CheckSloClass("batch").ok());
  CHECK(backend.CheckSloClass("").ok());
  request.slo_class = "batch";
  CHECK(backend.Submit(request, e.Callback()).ok());
  backend.Stop();
}

TEST_CASE("cluster backend: a decode instance counts a request until its report includes it",
          "[cluster_backend]") {
  IoThread io;
  int d_base = FreePortPair(io.io);
  FakeInstance p(io.io, InstanceRole::kPrefill, 0);
  FakeInstance d0(io.io, InstanceRole::kDecode, d_base), d1(io.io, InstanceRole::kDecode,
                                                              d_base + 1);
  LoadReport busy;
  busy.running_requests = 1;  // decode-1 runs one request of its own; decode-0 is idle
  d1.SetReport(busy);
  ClusterConfig config = Config(p.port(), 1, d_base, 2);
  config.router.policy = "least_loaded";
  ClusterBackend backend(config, TestBackendOptions());
  REQUIRE(backend.Start().ok());
  REQUIRE(WaitFor([&] {
    auto all = backend.Instances();
    return std::all_of(all.begin(), all.end(), [](auto& s) { return s.usable; });
  }));
  std::this_thread::sleep_for(200ms);  // decode-1's report is in
  const std::string d0_address = "127.0.0.1:" + std::to_string(d_base);
  Events e0, e1;
  REQUIRE(backend.Submit(Request("r0"), e0.Callback()).ok());
  REQUIRE(WaitFor([&] { return p.submits().size() == 1; }));
  CHECK(p.submits()[0].decode_address == d0_address);
  // The first token is back, but decode-0's reports (still "idle") do not include r0 yet: the
  // router keeps counting it there, so decode-0 is no emptier than decode-1.
  p.SendTokens("r0", {1});
  REQUIRE(WaitFor([&] {
    std::lock_guard<std::mutex> lock(e0.mutex);
    return !e0.tokens.empty();
  }));
  std::this_thread::sleep_for(250ms);  // reports from both arrive
  REQUIRE(backend.Submit(Request("r1"), e1.Callback()).ok());
  REQUIRE(WaitFor([&] { return p.submits().size() == 2; }));
  CHECK(p.submits()[1].decode_address != d0_address);
  backend.Stop();
}
