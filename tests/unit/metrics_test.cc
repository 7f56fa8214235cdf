#include <catch2/catch.hpp>

#include <cmath>
#include <thread>

#include "common/base/metrics.h"
#include "test_util.h"

using namespace tandem;

TEST_CASE("metrics: counter, gauge and labels render in text format", "[metrics]") {
  MetricsRegistry registry(Labels{{"role", "decode"}, {"model", "tiny"}});
  registry.AddCounter("tandem_requests_total", "Requests finished.", {"finish_reason"})
      .WithLabels({"stop"})
      .Inc(3);
  registry.AddGauge("tandem_num_requests_running", "Requests in the running batch.").Get().Set(5);
  std::string text = registry.Render();
  CHECK(text ==
        "# HELP tandem_requests_total Requests finished.\n"
        "# TYPE tandem_requests_total counter\n"
        "tandem_requests_total{role=\"decode\",model=\"tiny\",finish_reason=\"stop\"} 3\n"
        "# HELP tandem_num_requests_running Requests in the running batch.\n"
        "# TYPE tandem_num_requests_running gauge\n"
        "tandem_num_requests_running{role=\"decode\",model=\"tiny\"} 5\n");
}

TEST_CASE("metrics: a scraper reads back what the registry renders", "[metrics]") {
  MetricsRegistry registry(Labels{{"role", "router"}});
  auto& gauge =
      registry.AddGauge("tandem_router_decode_model_correction", "Correction.", {"instance"});
  gauge.WithLabels({"decode-0"}).Set(1.25);
  gauge.WithLabels({"odd\"}name"}).Set(0.5);
  registry.AddGauge("tandem_router_decode_model_correction_other", "Same prefix.").Get().Set(9);
  auto samples = ParseMetricSamples(registry.Render(), "tandem_router_decode_model_correction");
  REQUIRE(samples.size() == 2);
  CHECK(samples.at("role=\"router\",instance=\"decode-0\"") == 1.25);
  CHECK(samples.at("role=\"router\",instance=\"odd\\\"}name\"") == 0.5);
  // Without labels, with a timestamp, special values; broken lines are skipped.
  auto plain = ParseMetricSamples(
      "# TYPE x gauge\nx 3 1700000000\nx{a=\"1\"} +Inf\nx{b=\"2\" 4\nx{c=\"3\"} four\n", "x");
  REQUIRE(plain.size() == 2);
  CHECK(plain.at("") == 3);
  CHECK(std::isinf(plain.at("a=\"1\"")));
  CHECK(ParseMetricSamples("", "x").empty());
}

TEST_CASE("metrics: histogram buckets are cumulative, le inclusive, with +Inf", "[metrics]") {
  MetricsRegistry registry;
  Histogram& h = registry.AddHistogram("tandem_x_seconds", "X.", {}, {0.1, 1.0}).Get();
  h.Observe(0.05);
  h.Observe(0.1);  // on the bound: counts in le="0.1"
  h.Observe(0.5);
  h.Observe(7);
  CHECK(registry.Render() ==
        "# HELP tandem_x_seconds X.\n"
        "# TYPE tandem_x_seconds histogram\n"
        "tandem_x_seconds_bucket{le=\"0.1\"} 2\n"
        "tandem_x_seconds_bucket{le=\"1\"} 3\n"
        "tandem_x_seconds_bucket{le=\"+Inf\"} 4\n"
        "tandem_x_seconds_sum 7.65\n"
        "tandem_x_seconds_count 4\n");
  CHECK(h.Count() == 4);
}

TEST_CASE("metrics: label values and help are escaped", "[metrics]") {
  CHECK(EscapeLabelValue("a\\b\"c\nd") == "a\\\\b\\\"c\\nd");
  CHECK(EscapeHelp("line1\nback\\slash \"quotes\" stay") == "line1\\nback\\\\slash \"quotes\" stay");
  MetricsRegistry registry(Labels{{"model", "we\"ird\\name\n"}});
  registry.AddGauge("tandem_g", "G.").Get().Set(1);
  CHECK(registry.Render().find("tandem_g{model=\"we\\\"ird\\\\name\\n\"} 1\n") != std::string::npos);
}

TEST_CASE("metrics: values format like Prometheus expects", "[metrics]") {
  CHECK(FormatMetricValue(0) == "0");
  CHECK(FormatMetricValue(1.5) == "1.5");
  CHECK(FormatMetricValue(1e-7) == "1e-07");
  CHECK(FormatMetricValue(1.0 / 0.0) == "+Inf");
  CHECK(FormatMetricValue(-1.0 / 0.0) == "-Inf");
  CHECK(FormatMetricValue(0.0 / 0.0) == "NaN");
  CHECK(FormatMetricValue(123456789012.0) == "123456789012");
}

TEST_CASE("metrics: registering twice returns the same family", "[metrics]") {
  MetricsRegistry registry;
  auto& a = registry.AddCounter("tandem_a_total", "A.", {"x"});
  auto& b = registry.AddCounter("tandem_a_total", "A.", {"x"});
  CHECK(&a == &b);
  CHECK(&a.WithLabels({"1"}) == &b.WithLabels({"1"}));
}

TEST_CASE("metrics: concurrent updates are not lost", "[metrics]") {
  MetricsRegistry registry;
  Counter& counter = registry.AddCounter("tandem_c_total", "C.").Get();
  Histogram& hist = registry.AddHistogram("tandem_h_seconds", "H.", {}, LatencyBuckets()).Get();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 100000; ++i) {
        counter.Inc();
        hist.Observe(0.003);
      }
    });
  for (auto& t : threads) t.join();
  CHECK(counter.Value() == 400000);
  CHECK(hist.Count() == 400000);
  CHECK(hist.Sum() == Approx(1200.0));
}

TEST_CASE("metrics: promtool check metrics accepts the exposition", "[metrics][promtool]") {
  MetricsRegistry registry(Labels{{"role", "router"}, {"model", "tandem-tiny"}});
  registry.AddCounter("tandem_request_success_total", "Finished requests.", {"finish_reason"})
      .WithLabels({"length"})
      .Inc(2);
  registry.AddGauge("tandem_kv_cache_usage_ratio", "KV blocks in use / total.").Get().Set(0.25);
  auto& ttft = registry.AddHistogram("tandem_time_to_first_token_seconds",
                                     "Time to first token.", {}, LatencyBuckets());
  ttft.Get().Observe(0.12);
  registry.AddHistogram("tandem_kv_transfer_bytes", "Bytes per KV transfer.", {"transport"},
                        ExponentialBuckets(1024, 4, 10))
      .WithLabels({"tcp \"fast\"\npath"})
      .Observe(65536);
  test::TempDir dir;
  std::string file = dir.Write("metrics.txt", registry.Render());
  test::CommandResult result = test::RunCommand("promtool check metrics < '" + file + "'");
  INFO(result.output);
  CHECK(result.exit_code == 0);
  CHECK(result.output.empty());  // no lint warnings either
}

TEST_CASE("metrics: a gauge about another role replaces the constant role label on its series",
          "[metrics]") {
  MetricsRegistry registry(Labels{{"role", "router"}, {"model", "tiny"}});
  registry.AddGaugeAbout("tandem_recommended_replicas", "Replicas.", {"role"})
      .WithLabels({"decode"})
      .Set(3);
  registry.AddGauge("tandem_num_requests_running", "Running.").Get().Set(1);
  const std::string text = registry.Render();
  CHECK(text.find("tandem_recommended_replicas{model=\"tiny\",role=\"decode\"} 3\n") !=
        std::string::npos);
  CHECK(text.find("role=\"router\",model=\"tiny\",role") == std::string::npos);  // never twice
  CHECK(text.find("tandem_num_requests_running{role=\"router\",model=\"tiny\"} 1\n") !=
        std::string::npos);
}
