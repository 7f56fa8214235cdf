#include <catch2/catch.hpp>

#include "cluster/simulator.h"

using namespace tandem;

namespace {

// Hand-computable step times: prefill 0.01 + 0.001 / token, decode 0.02 + 0.001 / sequence.
LatencyModelFile Model(double transfer_latency = 0, double bytes_per_s = 0) {
  LatencyModel m;
  m.device = "cpu";
  m.threads = 1;
  m.c1 = 0.01;
  m.c2 = 0.001;
  m.c4 = 0.02;
  m.c5 = 0.001;
  m.kv_bytes_per_token = 1000;
  LatencyModelFile f;
  f.entries.push_back(m);
  f.transfer.latency_s = transfer_latency;
  f.transfer.bytes_per_s = bytes_per_s;
  return f;
}

ClusterConfig Disaggregated(const std::string& policy = "least_loaded") {
  ClusterConfig c;
  c.router.policy = policy;
  c.prefill.instances = 1;
  c.decode.instances = 1;
  c.colocated.instances = 0;
  c.model.max_model_len = 4096;
  return c;
}

// One colocated instance and nothing else.
ClusterConfig OneColocated() {
  ClusterConfig c;
  c.router.policy = "least_loaded";
  c.prefill.instances = 0;
  c.decode.instances = 0;
  c.colocated.instances = 1;
  return c;
}

WorkloadRequest Request(int64_t id, double arrival, int32_t prompt, int32_t max_tokens) {
  WorkloadRequest r;
  r.id = id;
  r.arrival_s = arrival;
  r.prompt_tokens = prompt;
  r.max_tokens = max_tokens;
  return r;
}

}  // namespace

TEST_CASE("one request on an idle 1P1D cluster: TTFT is the prefill, TPOT the decode step",
          "[simulator]") {
  SECTION("instant transfer") {
    auto r = Simulate(Disaggregated(), Model(), {Request(0, 1.0, 100, 5)});
    REQUIRE(r.ok());
    const RequestOutcome& o = r->outcomes.at(0);
    CHECK(o.ok);
    CHECK(o.output_tokens == 5);
    CHECK(o.ttft_s == Approx(0.01 + 0.1));
    CHECK(o.tpot_s == Approx(0.021));  // 4 decode steps of one sequence
    CHECK(o.e2e_s == Approx(0.11 + 4 * 0.021));
  }
  SECTION("the KV transfer sits between the first and second tokens") {
    // 100 tokens = 7 blocks of 16 = 112 tokens x 1000 bytes at 1 MB/s + 5 ms.
    ClusterConfig c = Disaggregated();
    c.transfer.layerwise = false;
    auto r = Simulate(c, Model(0.005, 1e6), {Request(0, 0, 100, 5)});
    REQUIRE(r.ok());
    const RequestOutcome& o = r->outcomes.at(0);
    CHECK(o.ttft_s == Approx(0.11));
    CHECK(o.e2e_s == Approx(0.11 + 0.117 + 4 * 0.021));
    // Layer-wise, the 0.112 s of bytes stream during the 0.11 s prefill pass: 2 ms + 5 ms remain.
    c.transfer.layerwise = true;
    auto lw = Simulate(c, Model(0.005, 1e6), {Request(0, 0, 100, 5)});
    REQUIRE(lw.ok());
    CHECK(lw->outcomes.at(0).e2e_s == Approx(0.11 + 0.007 + 4 * 0.021));
  }
  SECTION("max_tokens 1 ends at prefill") {
    auto r = Simulate(Disaggregated(), Model(), {Request(0, 0, 10, 1)});
    REQUIRE(r.ok());
    CHECK(r->outcomes[0].ok);
    CHECK(r->outcomes[0].e2e_s == Approx(0.02));
  }
}

TEST_CASE("prefill is FCFS and batches by the token budget", "[simulator]") {
  ClusterConfig c = Disaggregated();
  c.prefill.token_budget = 100;
  auto r = Simulate(c, Model(), {Request(0, 0, 100, 2), Request(1, 0, 100, 2)});
  REQUIRE(r.ok());
  CHECK(r->outcomes[0].ttft_s == Approx(0.11));
  CHECK(r->outcomes[1].ttft_s == Approx(0.22));  // waited for the first batch
  c.prefill.token_budget = 200;
  r = Simulate(c, Model(), {Request(0, 0, 100, 2), Request(1, 0, 100, 2)});
  REQUIRE(r.ok());
  CHECK(r->outcomes[0].ttft_s == Approx(0.21));  // one batch of both
  CHECK(r->outcomes[1].ttft_s == Approx(0.21));
}

TEST_CASE("decode admits pulls only within the batch limit and the KV blocks", "[simulator]") {
  auto check = [](const ClusterConfig& c) {
    auto r = Simulate(c, Model(), {Request(0, 0, 100, 3), Request(1, 0, 100, 3)});
    REQUIRE(r.ok());
    const RequestOutcome& a = r->outcomes[0];
    const RequestOutcome& b = r->outcomes[1];
    CHECK(a.ttft_s == Approx(0.21));
    CHECK(b.ttft_s == Approx(0.21));
    CHECK(a.e2e_s == Approx(0.21 + 2 * 0.021));
    CHECK(b.e2e_s == Approx(0.21 + 4 * 0.021));  // pulled after the first finished
    CHECK(b.tpot_s == Approx(0.042));
  };
  SECTION("max_batch_size 1") {
    ClusterConfig c = Disaggregated();
    c.decode.max_batch_size = 1;
    check(c);
  }
  SECTION("10 blocks: one request's 7 leave too few") {
    ClusterConfig c = Disaggregated();
    c.decode.kv_blocks = 10;
    c.decode.kv_usage_watermark = 1.0;
    c.model.max_model_len = 160;  // a pool must hold one whole request: 10 blocks of 16
    check(c);
  }
  SECTION("both fit: one batch of two") {
    auto r = Simulate(Disaggregated(), Model(), {Request(0, 0, 100, 3), Request(1, 0, 100, 3)});
    REQUIRE(r.ok());
    CHECK(r->outcomes[1].e2e_s == Approx(0.21 + 2 * 0.022));
  }
}

TEST_CASE("colocated: a prompt arriving mid-decode slows the running request", "[simulator]") {
  ClusterConfig c = OneColocated();
  auto alone = Simulate(c, Model(), {Request(0, 0, 10, 50)});
  auto mixed = Simulate(c, Model(), {Request(0, 0, 10, 50), Request(1, 0.2, 1000, 2)});
  REQUIRE(alone.ok());
  REQUIRE(mixed.ok());
  CHECK(alone->outcomes[0].ttft_s == Approx(0.02));
  CHECK(alone->outcomes[0].tpot_s == Approx(0.021));
  // One of its 49 steps also computes request 1's 1000-token prompt (+1 s): +0.02 s TPOT.
  CHECK(mixed->outcomes[0].tpot_s > alone->outcomes[0].tpot_s + 0.015);
  CHECK(mixed->outcomes[1].ok);
}

TEST_CASE("colocated prefill_first: a prompt pauses the running request for its whole prefill",
          "[simulator]") {
  ClusterConfig c = OneColocated();
  c.colocated.token_budget = 512;  // the 1000-token prompt exceeds it: it runs alone, whole
  c.colocated.scheduling = "prefill_first";
  auto alone = Simulate(c, Model(), {Request(0, 0, 10, 50)});
  auto mixed = Simulate(c, Model(), {Request(0, 0, 10, 50), Request(1, 0.2, 1000, 2)});
  REQUIRE(alone.ok());
  REQUIRE(mixed.ok());
  CHECK(alone->outcomes[0].ttft_s == Approx(0.02));
  CHECK(alone->outcomes[0].tpot_s == Approx(0.021));
  REQUIRE(mixed->outcomes[1].ok);
  // Request 0 waits out one prefill-only step of 1000 tokens (0.01 + 1.0 s), then shares one
  // decode step with request 1's second token (+0.001 s).
  CHECK(mixed->outcomes[0].e2e_s == Approx(alone->outcomes[0].e2e_s + 1.01 + 0.001));
  // Request 1's first token: the decode step in flight at 0.2 s ends, then its prefill step.
  CHECK(mixed->outcomes[1].ttft_s < 1.01 + 0.021 + 1e-9);
  CHECK(mixed->outcomes[1].ttft_s >= 1.01);
  // Under chunked it rides in two mixed steps of at most 512 tokens instead.
  c.colocated.scheduling = "chunked";
  auto chunked = Simulate(c, Model(), {Request(0, 0, 10, 50), Request(1, 0.2, 1000, 2)});
  REQUIRE(chunked.ok());
  CHECK(chunked->outcomes[1].ttft_s > mixed->outcomes[1].ttft_s);
}

TEST_CASE("the simulation is deterministic", "[simulator]") {
  ClusterConfig c = Disaggregated("goodput");
  c.prefill.instances = 2;
  c.decode.instances = 2;
  c.slo.ttft_s = 1.0;
  c.slo.tpot_s = 0.1;
  WorkloadOptions wo;
  wo.rate = 20;
  wo.num_requests = 300;
  wo.max_model_len = 1024;
  auto requests = GenerateWorkload(*WorkloadShapeByName("chatbot"), wo);
  SimulationOptions so;
  so.load_report_interval_s = 0.1;
  auto a = Simulate(c, Model(), requests, so);
  auto b = Simulate(c, Model(), requests, so);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(a->outcomes.size() == 300);
  for (size_t i = 0; i < a->outcomes.size(); ++i) {
    CHECK(a->outcomes[i].ttft_s == b->outcomes[i].ttft_s);
    CHECK(a->outcomes[i].e2e_s == b->outcomes[i].e2e_s);
    CHECK(a->outcomes[i].rejected == b->outcomes[i].rejected);
  }
  CHECK(a->makespan_s == b->makespan_s);
}

TEST_CASE("goodput placement rejects what cannot meet the SLO", "[simulator]") {
  ClusterConfig c = Disaggregated("goodput");
  c.slo.ttft_s = 0.15;
  c.slo.tpot_s = 1.0;
  std::vector<WorkloadRequest> burst;
  for (int i = 0; i < 20; ++i) burst.push_back(Request(i, 0.001 * i, 100, 2));
  auto r = Simulate(c, Model(), burst);
  REQUIRE(r.ok());
  int rejected = 0, ok = 0;
  for (const RequestOutcome& o : r->outcomes) {
    rejected += o.rejected ? 1 : 0;
    ok += o.ok ? 1 : 0;
    if (o.rejected) CHECK_FALSE(o.ok);
  }
  CHECK(r->outcomes[0].ok);  // an idle cluster always takes the request
  CHECK(rejected > 0);
  CHECK(ok + rejected == 20);
  RunSummary s = Summarize(r->outcomes, Slo{0.15, 1.0});
  CHECK(s.rejected == rejected);
}

TEST_CASE("an instance shape without a latency model entry is an error", "[simulator]") {
  ClusterConfig c = Disaggregated();
  c.decode.tensor_parallel = 2;
  auto r = Simulate(c, Model(), {Request(0, 0, 10, 2)});
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("tensor_parallel 2") != std::string::npos);
  auto bad = Simulate(Disaggregated(), Model(), {Request(0, 0, -1, 2)});
  CHECK_FALSE(bad.ok());
}

TEST_CASE("server-like reports: the router adds what a lagging report lacks", "[simulator]") {
  // Request 0 starts a 1.01 s batch at t=0; request 1 (1000 tokens) arrives at t=0.5. With the
  // exact state the router counts request 0's 1000 queued tokens (predicted TTFT 2.01 s > 1.5 s)
  // and rejects. The servers publish only after a step, so at t=0.5 the latest report is the
  // idle one from before the batch; it says it took nothing in (LoadReport::last_submit_seq),
  // so the router adds request 0 back and decides as with the exact state.
  ClusterConfig c = Disaggregated("goodput");
  c.slo.ttft_s = 1.5;
  c.slo.tpot_s = 1.0;
  c.router.latency_model = "lm.yaml";  // the router predicts from the (simulated) entries
  std::vector<WorkloadRequest> two{Request(0, 0, 1000, 2), Request(1, 0.5, 1000, 2)};
  auto exact = Simulate(c, Model(), two);
  REQUIRE(exact.ok());
  CHECK(exact->outcomes[0].ok);
  CHECK(exact->outcomes[1].rejected);
  SimulationOptions o = ServerLikeSimulationOptions();
  CHECK(o.reports_after_steps);
  CHECK(o.load_report_interval_s == Approx(0.1));
  auto server = Simulate(c, Model(), two, o);
  REQUIRE(server.ok());
  CHECK(server->outcomes[0].ok);
  CHECK(server->outcomes[1].rejected);
  SECTION("a request that arrives during a batch is counted until a report has it") {
    // Requests 1-4 arrive during request 0's batch, when the latest report is still the idle one
    // from before it: each decision must count every request placed before it, as the exact
    // state does (a router whose count the idle report erased admitted request 4 too).
    std::vector<WorkloadRequest> r{Request(0, 0, 1000, 2), Request(1, 0.5, 100, 2),
                                   Request(2, 0.7, 400, 2), Request(3, 0.8, 600, 2),
                                   Request(4, 0.9, 500, 2)};
    auto ex = Simulate(c, Model(), r);
    auto sv = Simulate(c, Model(), r, o);
    REQUIRE(ex.ok());
    REQUIRE(sv.ok());
    for (size_t i = 0; i < r.size(); ++i) {
      INFO("request " << i);
      CHECK(sv->outcomes[i].rejected == ex->outcomes[i].rejected);
    }
    CHECK(sv->outcomes[1].ok);
    CHECK(sv->outcomes[4].rejected);
  }
}

TEST_CASE("each outcome says where it ran, and goodput keeps a prompt off a decoding instance",
          "[simulator]") {
  ClusterConfig c = OneColocated();
  c.router.policy = "goodput";
  c.colocated.instances = 2;
  c.slo.ttft_s = 10;
  c.slo.tpot_s = 0.05;
  // Request 0 decodes 200 tokens from t = 0.02 s; request 1's 500-token prompt (0.51 s of
  // prefill) arrives at 1 s. On request 0's instance it would stall it; the other is idle.
  auto r = Simulate(c, Model(), {Request(0, 0, 10, 200), Request(1, 1.0, 500, 5)});
  REQUIRE(r.ok());
  const RequestOutcome& first = r->outcomes.at(0);
  const RequestOutcome& second = r->outcomes.at(1);
  CHECK(first.placed_on.rfind("colocated-", 0) == 0);
  CHECK(second.placed_on.rfind("colocated-", 0) == 0);
  CHECK(first.placed_on != second.placed_on);
  CHECK(first.tpot_s == Approx(0.021));  // never stalled
  auto pair = Simulate(Disaggregated(), Model(), {Request(0, 0, 10, 2)});
  REQUIRE(pair.ok());
  CHECK(pair->outcomes.at(0).placed_on == "prefill-0 + decode-0");
}

TEST_CASE("decode_time_scale: decode slower than profiled, and a router that corrects for it",
          "[simulator]") {
  SimulationOptions slow;
  slow.decode_time_scale = 2.0;
  auto r = Simulate(Disaggregated(), Model(), {Request(0, 0, 100, 5)}, slow);
  REQUIRE(r.ok());
  CHECK(r->outcomes.at(0).ttft_s == Approx(0.11));  // prefill as modelled
  CHECK(r->outcomes.at(0).tpot_s == Approx(2 * 0.021));
  // Colocated, chunked: the step that carries request 1's prompt beside request 0's decode
  // costs its decode share (c5 x 1 sequence + c6 x context = 0.001 s) twice; the prompt's
  // part is as modelled.
  const std::vector<WorkloadRequest> mixed = {Request(0, 0, 10, 3), Request(1, 0.01, 50, 1)};
  auto as_modelled = Simulate(OneColocated(), Model(), mixed);
  auto slower = Simulate(OneColocated(), Model(), mixed, slow);
  REQUIRE(as_modelled.ok());
  REQUIRE(slower.ok());
  CHECK(slower->outcomes.at(1).e2e_s - as_modelled->outcomes.at(1).e2e_s ==
        Approx(0.001).margin(1e-9));
  // The goodput router keeps the profile (TPOT 0.021-0.022 s, within 0.03) and learns the real
  // decode speed from the load reports: request 1 arrives while request 0 decodes at twice the
  // modelled step, so its predicted TPOT (~0.044 s) misses and it is turned away. At the
  // profiled speed it is taken.
  ClusterConfig c = Disaggregated("goodput");
  c.router.latency_model = "profile.yaml";  // any path: the simulation uses its own model
  c.slo.ttft_s = 10;
  c.slo.tpot_s = 0.03;
  const std::vector<WorkloadRequest> two = {Request(0, 0, 10, 200), Request(1, 1.0, 10, 50)};
  auto profiled = Simulate(c, Model(), two);
  REQUIRE(profiled.ok());
  CHECK(profiled->outcomes.at(1).ok);
  auto corrected = Simulate(c, Model(), two, slow);
  REQUIRE(corrected.ok());
  CHECK(corrected->outcomes.at(0).ok);  // an idle cluster takes the first request
  CHECK(corrected->outcomes.at(1).rejected);
}
