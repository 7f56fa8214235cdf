// tandem_recommended_replicas: the traffic window, the planner's calculation on it, and the
// router's loop that exports it.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <fstream>

#include "cluster/replica_advisor.h"
#include "common/config/config.h"
#include "router/replica_advice.h"
#include "router/traffic_recorder.h"
#include "test_util.h"

using namespace tandem;
using Clock = std::chrono::steady_clock;

namespace {

// A CPU instance: prefill 0.1 ms per prompt token, a decode step 5 ms + 1 ms per sequence.
LatencyModelFile Models() {
  LatencyModel m;
  m.device = "cpu";
  m.threads = 1;
  m.c1 = 0.002;
  m.c2 = 1e-4;
  m.c4 = 0.005;
  m.c5 = 0.001;
  m.kv_bytes_per_token = 1000;
  LatencyModelFile file;
  file.entries.push_back(m);
  file.source = "<test>";
  return file;
}

ClusterConfig Config() {
  ClusterConfig c;
  c.model.max_model_len = 1024;
  c.slo.ttft_s = 0.5;
  c.slo.tpot_s = 0.05;
  c.slo.attainment_target = 0.9;
  c.prefill.max_batch_size = 64;
  c.prefill.token_budget = 1024;
  c.decode.max_batch_size = 32;
  return c;
}

// `rate` requests/s for `seconds` ending at `now`, each with 200 prompt and 50 output tokens,
// all finished.
void Offer(TrafficRecorder* traffic, Clock::time_point now, double rate, double seconds) {
  const int n = static_cast<int>(rate * seconds);
  for (int i = 0; i < n; ++i) {
    auto at = now - std::chrono::duration_cast<Clock::duration>(
                        std::chrono::duration<double>(seconds * (n - i) / (n + 1.0)));
    traffic->RecordArrival(at, 200, 50);
    traffic->RecordFinish(at, 200, 50);
  }
}

}  // namespace

TEST_CASE("replica advice: the window counts offered requests and takes the finished lengths",
          "[replica_advice]") {
  TrafficRecorder traffic;
  const Clock::time_point now = Clock::now();
  traffic.RecordArrival(now - std::chrono::seconds(90), 10, 10);  // before the window
  traffic.RecordArrival(now - std::chrono::seconds(30), 100, 64);
  traffic.RecordArrival(now - std::chrono::seconds(10), 300, 64);
  TrafficWindow window = traffic.Window(now, 60);
  CHECK(window.arrivals == 2);
  CHECK(window.rate_rps() == Approx(2.0 / 60));
  // Nothing finished yet: the arrivals' prompts with their max_tokens are the mix.
  REQUIRE(window.samples.size() == 2);
  CHECK(window.samples[0].output_tokens == 64);
  traffic.RecordFinish(now - std::chrono::seconds(30), 100, 7);
  window = traffic.Window(Clock::now(), 60);
  REQUIRE(window.samples.size() == 1);
  CHECK(window.samples[0].output_tokens == 7);
}

TEST_CASE("replica advice: the recommendation rises when the offered rate doubles and falls back",
          "[replica_advice]") {
  const LatencyModelFile models = Models();
  const ClusterConfig config = Config();
  auto advise = [&](double rate) {
    TrafficRecorder traffic;
    Offer(&traffic, Clock::now(), rate, 60);
    StatusOr<ReplicaAdvice> advice =
        RecommendReplicas(config, models, traffic.Window(Clock::now(), 60));
    REQUIRE(advice.ok());
    return *advice;
  };
  const ReplicaAdvice low = advise(20);
  const ReplicaAdvice high = advise(40);
  const ReplicaAdvice back = advise(20);
  INFO("capacity prefill " << low.prefill_capacity_rps << " decode " << low.decode_capacity_rps
                           << "; at 20/s " << low.prefill << "+" << low.decode << ", at 40/s "
                           << high.prefill << "+" << high.decode);
  CHECK(low.rate_rps == Approx(20).epsilon(0.05));
  CHECK(low.prefill_capacity_rps > 0);
  CHECK(low.decode_capacity_rps > 0);
  // The planner's n = ceil(R / capacity) per role.
  CHECK(low.prefill == static_cast<int>(std::ceil(low.rate_rps / low.prefill_capacity_rps)));
  CHECK(low.decode == static_cast<int>(std::ceil(low.rate_rps / low.decode_capacity_rps)));
  CHECK(high.prefill + high.decode > low.prefill + low.decode);
  CHECK(high.prefill >= low.prefill);
  CHECK(high.decode >= low.decode);
  CHECK(back.prefill == low.prefill);
  CHECK(back.decode == low.decode);
}

TEST_CASE("replica advice: prefill and decode follow their own part of the length mix",
          "[replica_advice]") {
  const LatencyModelFile models = Models();
  const ClusterConfig config = Config();
  auto advise = [&](int prompt, int output) {
    TrafficRecorder traffic;
    const Clock::time_point now = Clock::now();
    for (int i = 0; i < 600; ++i) {
      auto at = now - std::chrono::milliseconds(100 * (600 - i));
      traffic.RecordArrival(at, prompt, output);
      traffic.RecordFinish(at, prompt, output);
    }
    StatusOr<ReplicaAdvice> advice = RecommendReplicas(config, models, traffic.Window(now, 60));
    REQUIRE(advice.ok());
    return *advice;
  };
  // Long prompts, short answers (summarization) against short prompts, long answers.
  const ReplicaAdvice summarize = advise(900, 8);
  const ReplicaAdvice chat = advise(50, 400);
  CHECK(summarize.prefill_capacity_rps < chat.prefill_capacity_rps);
  CHECK(summarize.decode_capacity_rps > chat.decode_capacity_rps);
}

TEST_CASE("replica advice: no traffic recommends one of each, and an unmeetable SLO says which",
          "[replica_advice]") {
  const LatencyModelFile models = Models();
  ClusterConfig config = Config();
  TrafficRecorder traffic;
  StatusOr<ReplicaAdvice> idle = RecommendReplicas(config, models, traffic.Window(Clock::now(), 60));
  REQUIRE(idle.ok());
  CHECK(idle->prefill == 1);
  CHECK(idle->decode == 1);

  Offer(&traffic, Clock::now(), 5, 60);
  config.slo.tpot_s = 0.001;  // a decode step alone takes 6 ms
  StatusOr<ReplicaAdvice> advice =
      RecommendReplicas(config, models, traffic.Window(Clock::now(), 60));
  REQUIRE_FALSE(advice.ok());
  CHECK(advice.status().message().find("decode") != std::string::npos);
  CHECK(advice.status().message().find("slo.tpot_s") != std::string::npos);
}

TEST_CASE("replica advice: the router's loop exports the gauges and follows a reload",
          "[replica_advice]") {
  MetricsRegistry metrics(Labels{{"role", "router"}, {"model", "m"}});
  TrafficRecorder traffic;
  Offer(&traffic, Clock::now(), 10, 60);
  int calls = 0;
  double seen_ttft = 0;
  ReplicaAdvisor advisor = [&](const ClusterConfig& config, const LatencyModelFile&,
                               const TrafficWindow& window) -> StatusOr<ReplicaAdvice> {
    ++calls;
    seen_ttft = config.slo.ttft_s;
    ReplicaAdvice advice;
    advice.rate_rps = window.rate_rps();
    advice.prefill = 2;
    advice.decode = 5;
    return advice;
  };
  ReplicaAdviceLoop loop(advisor, &traffic, &metrics);
  ClusterConfig config = Config();
  // Off by default: nothing computed, nothing exported.
  REQUIRE(loop.Start(config).ok());
  CHECK_FALSE(loop.RunOnce().ok());
  CHECK(calls == 0);
  CHECK(metrics.Render().find("tandem_recommended_replicas{") == std::string::npos);
  // An interval needs a latency model file that loads.
  config.router.recommend_interval_s = 3600;
  config.router.latency_model = "/nonexistent/lm.yaml";
  CHECK_FALSE(loop.Reconfigure(config).ok());
  test::TempDir dir;
  const std::string lm = dir.Write("lm.yaml", LatencyModelToYaml(Models()));
  config.router.latency_model = lm;
  REQUIRE(loop.Reconfigure(config).ok());
  REQUIRE(loop.RunOnce().ok());
  CHECK(seen_ttft == Approx(0.5));
  const std::string text = metrics.Render();
  CHECK(text.find("tandem_recommended_replicas{model=\"m\",role=\"prefill\"} 2\n") !=
        std::string::npos);
  CHECK(text.find("tandem_recommended_replicas{model=\"m\",role=\"decode\"} 5\n") !=
        std::string::npos);
  CHECK(text.find("tandem_router_offered_requests_per_second{role=\"router\",model=\"m\"} ") !=
        std::string::npos);
  // A reload's SLO reaches the next computation.
  config.slo.ttft_s = 2.0;
  REQUIRE(loop.Reconfigure(config).ok());
  REQUIRE(loop.RunOnce().ok());
  CHECK(seen_ttft == Approx(2.0));
  loop.Stop();
}
