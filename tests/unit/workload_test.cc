#include <catch2/catch.hpp>

#include <cmath>

#include "cluster/workload.h"
#include "tests/unit/test_util.h"

using namespace tandem;

TEST_CASE("synthetic workloads are seeded, within the budget, and shaped", "[workload]") {
  for (const std::string& name : WorkloadNames()) {
    StatusOr<WorkloadShape> shape = WorkloadShapeByName(name);
    REQUIRE(shape.ok());
    WorkloadOptions options;
    options.rate = 2.0;
    options.num_requests = 2000;
    options.seed = 7;
    options.max_model_len = 1024;
    std::vector<WorkloadRequest> a = GenerateWorkload(*shape, options);
    std::vector<WorkloadRequest> b = GenerateWorkload(*shape, options);
    REQUIRE(a.size() == 2000);
    std::vector<double> inputs, outputs;
    double last = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      CHECK(a[i].id == static_cast<int64_t>(i));
      CHECK(a[i].prompt_tokens == b[i].prompt_tokens);
      CHECK(a[i].max_tokens == b[i].max_tokens);
      CHECK(a[i].arrival_s == b[i].arrival_s);
      CHECK(a[i].arrival_s > last);
      last = a[i].arrival_s;
      CHECK(a[i].prompt_tokens >= 1);
      CHECK(a[i].max_tokens >= 1);
      CHECK(a[i].prompt_tokens + a[i].max_tokens <= 1024);
      inputs.push_back(a[i].prompt_tokens);
      outputs.push_back(a[i].max_tokens);
    }
    // Poisson at 2 req/s: 2000 arrivals take ~1000 s (within 5%: the sd is ~2.2%).
    CHECK(last == Approx(1000).epsilon(0.07));
    // Medians follow the shape (clipping moves them only a little).
    CHECK(Percentile(inputs, 50) == Approx(shape->input.median_fraction * 1024).epsilon(0.1));
    CHECK(Percentile(outputs, 50) == Approx(shape->output.median_fraction * 1024).epsilon(0.15));
  }
  // Another seed, another workload.
  WorkloadOptions options;
  options.num_requests = 50;
  WorkloadShape chat = *WorkloadShapeByName("chatbot");
  options.seed = 1;
  auto a = GenerateWorkload(chat, options);
  options.seed = 2;
  auto b = GenerateWorkload(chat, options);
  int same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i].prompt_tokens == b[i].prompt_tokens;
  CHECK(same < 10);
  // Rate 0: everything at t = 0 (fixed-concurrency mode).
  options.rate = 0;
  for (const WorkloadRequest& r : GenerateWorkload(chat, options)) CHECK(r.arrival_s == 0);
  // The shapes differ where they should: summarization prompts are much longer than code's.
  CHECK(WorkloadShapeByName("summarization")->input.median_fraction >
        5 * WorkloadShapeByName("code")->input.median_fraction);
  StatusOr<WorkloadShape> bad = WorkloadShapeByName("chat");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("'chat'") && Catch::Contains("chatbot"));
}

TEST_CASE("chatbot-history matches the lengths of DistServe's ShareGPT requests", "[workload]") {
  // DistServe's OPT-13B ShareGPT requests (its artifact's ground-truth workload, 219 requests):
  // input median 740 and p90 1521 of a 2048 budget, output median 66 and p90 491.
  StatusOr<WorkloadShape> shape = WorkloadShapeByName("chatbot-history");
  REQUIRE(shape.ok());
  WorkloadOptions options;
  options.num_requests = 5000;
  options.seed = 3;
  options.max_model_len = 2048;
  std::vector<double> inputs, outputs;
  for (const WorkloadRequest& r : GenerateWorkload(*shape, options)) {
    inputs.push_back(r.prompt_tokens);
    outputs.push_back(r.max_tokens);
  }
  CHECK(Percentile(inputs, 50) == Approx(740).epsilon(0.05));
  CHECK(Percentile(inputs, 90) == Approx(1521).epsilon(0.05));
  CHECK(Percentile(outputs, 50) == Approx(66).epsilon(0.1));
  CHECK(Percentile(outputs, 90) == Approx(491).epsilon(0.1));
}

TEST_CASE("traces round-trip and bad lines name the line and field", "[workload]") {
  test::TempDir dir;
  std::string good = dir.Write("good.jsonl",
                               "{\"prompt_tokens\": 12, \"max_tokens\": 4, \"arrival_s\": 0}\n"
                               "\n"
                               "{\"prompt\": \"hello\", \"max_tokens\": 2, \"arrival_s\": 0.5}\n"
                               "{\"prompt_tokens\": [5, 6, 7], \"max_tokens\": 3, "
                               "\"arrival_s\": 1.25}\n");
  StatusOr<std::vector<WorkloadRequest>> trace = LoadTrace(good);
  REQUIRE(trace.ok());
  REQUIRE(trace->size() == 3);
  CHECK((*trace)[0].prompt_tokens == 12);
  CHECK((*trace)[1].prompt_tokens == -1);
  CHECK((*trace)[1].prompt_text == "hello");
  CHECK((*trace)[2].prompt_token_ids == std::vector<int32_t>{5, 6, 7});
  CHECK((*trace)[2].arrival_s == 1.25);
  CHECK((*trace)[2].id == 2);

  std::string again = dir.Write("again.jsonl", TraceToJsonl(*trace));
  StatusOr<std::vector<WorkloadRequest>> back = LoadTrace(again);
  REQUIRE(back.ok());
  REQUIRE(back->size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK((*back)[i].prompt_tokens == (*trace)[i].prompt_tokens);
    CHECK((*back)[i].prompt_text == (*trace)[i].prompt_text);
    CHECK((*back)[i].prompt_token_ids == (*trace)[i].prompt_token_ids);
    CHECK((*back)[i].max_tokens == (*trace)[i].max_tokens);
    CHECK((*back)[i].arrival_s == (*trace)[i].arrival_s);
  }

  struct Bad {
    const char* line;
    const char* message;
  } cases[] = {
      {"not json", "bad.jsonl:2: not a JSON object"},
      {"{\"prompt_tokens\": 0, \"max_tokens\": 1, \"arrival_s\": 0}", "2: prompt_tokens: must be"},
      {"{\"prompt_tokens\": 3, \"max_tokens\": \"x\", \"arrival_s\": 0}", "2: max_tokens: must"},
      {"{\"prompt_tokens\": 3, \"max_tokens\": 2, \"arrival_s\": -1}", "2: arrival_s: must"},
      {"{\"prompt_tokens\": 3, \"max_tokens\": 2}", "2: arrival_s: missing"},
      {"{\"max_tokens\": 2, \"arrival_s\": 1}", "2: prompt: exactly one"},
      {"{\"prompt_tokens\": 3, \"max_tokens\": 2, \"arrival_s\": 1, \"temp\": 1}",
       "2: temp: unknown field"},
      {"{\"prompt_tokens\": 3, \"max_tokens\": 2, \"arrival_s\": 0}", "2: arrival_s: must not"},
  };
  for (const Bad& c : cases) {
    std::string path = dir.Write(
        "bad.jsonl",
        std::string("{\"prompt_tokens\": 3, \"max_tokens\": 2, \"arrival_s\": 0.5}\n") + c.line +
            "\n");
    StatusOr<std::vector<WorkloadRequest>> r = LoadTrace(path);
    INFO(c.line);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains(c.message));
  }
  CHECK(LoadTrace(dir.path().string() + "/missing.jsonl").status().code() ==
        StatusCode::kNotFound);
}

TEST_CASE("scoring: TPOT, SLO checks, percentiles and attainment", "[workload]") {
  CHECK(TpotSeconds(2.0, 0.5, 4) == Approx(0.5));
  CHECK(TpotSeconds(2.0, 0.5, 1) == 0);
  CHECK(Percentile({}, 50) == 0);
  CHECK(Percentile({3, 1, 2}, 50) == 2);
  CHECK(Percentile({1, 2, 3, 4}, 50) == Approx(2.5));
  CHECK(Percentile({1, 2, 3, 4}, 100) == 4);
  CHECK(Percentile({1, 2, 3, 4}, 0) == 1);

  Slo slo{1.0, 0.1};
  auto outcome = [](double arrival, double ttft, double tpot, bool ok = true,
                    bool rejected = false) {
    RequestOutcome o;
    o.arrival_s = arrival;
    o.ok = ok;
    o.rejected = rejected;
    o.ttft_s = ttft;
    o.tpot_s = tpot;
    o.output_tokens = 11;
    o.e2e_s = ttft + 10 * tpot;
    return o;
  };
  std::vector<RequestOutcome> runs = {
      outcome(0, 0.5, 0.05),             // meets both
      outcome(1, 1.5, 0.05),             // TTFT miss
      outcome(2, 0.5, 0.2),              // TPOT miss
      outcome(3, 0, 0, false, true),     // rejected: a miss
      outcome(4, 0, 0, false, false),    // failed: a miss
  };
  CHECK(MeetsSlo(runs[0], slo));
  CHECK_FALSE(MeetsSlo(runs[1], slo));
  CHECK(MeetsSlo(runs[1], Slo{0, 0.1}));  // no TTFT objective
  RunSummary s = Summarize(runs, slo);
  CHECK(s.requests == 5);
  CHECK(s.completed == 3);
  CHECK(s.rejected == 1);
  CHECK(s.failed == 1);
  CHECK(s.attainment == Approx(0.2));
  CHECK(s.ttft_attainment == Approx(0.4));
  CHECK(s.tpot_attainment == Approx(0.4));
  CHECK(s.ttft_p50 == Approx(0.5));
  // Duration from the outcomes: first arrival 0 to the last completion 2 + 0.5 + 2.0.
  CHECK(s.duration_s == Approx(4.5));
  CHECK(s.throughput_rps == Approx(3 / 4.5));
  CHECK(s.output_tokens_per_s == Approx(33 / 4.5));
  CHECK(Summarize(runs, slo, 10).throughput_rps == Approx(0.3));
  CHECK(Summarize({}, slo).attainment == 0);
}
