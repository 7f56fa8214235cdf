#include <catch2/catch.hpp>

#include "router/placement.h"

using namespace tandem;

namespace {

InstanceLoad Up(std::string name, int64_t queued = 0, int32_t running = 0,
                double prefill_spt = 0.001, double step = 0.02) {
  InstanceLoad x;
  x.name = std::move(name);
  x.usable = true;
  x.load.queued_prefill_tokens = queued;
  x.load.running_requests = running;
  x.load.prefill_seconds_per_token = prefill_spt;
  x.load.decode_step_seconds = step;
  return x;
}

PlacementInput Input(const std::vector<InstanceLoad>& p, const std::vector<InstanceLoad>& d,
                     const std::vector<InstanceLoad>& c, int64_t prompt, SloTarget slo) {
  PlacementInput in;
  in.prefill = &p;
  in.decode = &d;
  in.colocated = &c;
  in.prompt_tokens = prompt;
  in.slo = slo;
  return in;
}

}  // namespace

TEST_CASE("placement: policy names parse and round-trip", "[placement]") {
  for (auto policy :
       {PlacementPolicy::kGoodput, PlacementPolicy::kLeastLoaded, PlacementPolicy::kRoundRobin}) {
    auto parsed = ParsePlacementPolicy(PlacementPolicyName(policy));
    REQUIRE(parsed.ok());
    CHECK(*parsed == policy);
  }
  auto bad = ParsePlacementPolicy("fastest");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("fastest") != std::string::npos);
}

TEST_CASE("placement: SLO classes fall back to the defaults", "[placement]") {
  SloSection slo;
  slo.ttft_s = 2;
  slo.tpot_s = 0.2;
  slo.classes.push_back(SloClass{"interactive", 0.5, 0.05});
  CHECK(SloForClass(slo, "").ttft_s == 2);
  CHECK(SloForClass(slo, "interactive").ttft_s == 0.5);
  CHECK(SloForClass(slo, "interactive").tpot_s == 0.05);
  CHECK(SloForClass(slo, "batch").tpot_s == 0.2);
}

TEST_CASE("placement: predictions follow the load report", "[placement]") {
  LoadReport load;
  load.queued_prefill_tokens = 900;
  load.prefill_seconds_per_token = 0.001;
  CHECK(PredictTtftSeconds(load, 100) == Approx(1.0));
  load.prefill_seconds_per_token = 0;  // not measured yet: the default
  CHECK(PredictTtftSeconds(load, 100) == Approx(1000 * kDefaultPrefillSecondsPerToken));
  load.decode_step_seconds = 0.04;
  load.running_requests = 4;
  CHECK(PredictTpotSeconds(load) == Approx(0.05));
  load.running_requests = 0;
  CHECK(PredictTpotSeconds(load) == Approx(0.04));
}

TEST_CASE("placement: no usable instance is Unavailable", "[placement]") {
  std::vector<InstanceLoad> p = {Up("prefill-0")}, d = {Up("decode-0")}, c;
  d[0].usable = false;
  for (auto policy :
       {PlacementPolicy::kGoodput, PlacementPolicy::kLeastLoaded, PlacementPolicy::kRoundRobin}) {
    auto placed = Place(policy, Input(p, d, c, 10, {2, 0.2}));
    REQUIRE_FALSE(placed.ok());
    CHECK(placed.status().code() == StatusCode::kUnavailable);
  }
}

TEST_CASE("placement: round_robin rotates over usable instances", "[placement]") {
  std::vector<InstanceLoad> p = {Up("p0"), Up("p1"), Up("p2")}, d = {Up("d0"), Up("d1")}, c;
  p[1].usable = false;
  PlacementInput in = Input(p, d, c, 10, {2, 0.2});
  std::vector<int> ps, ds;
  for (uint64_t k = 0; k < 4; ++k) {
    in.round_robin = k;
    auto placed = Place(PlacementPolicy::kRoundRobin, in);
    REQUIRE(placed.ok());
    ps.push_back(placed->prefill);
    ds.push_back(placed->decode);
    CHECK(placed->colocated == -1);
  }
  CHECK(ps == std::vector<int>{0, 2, 0, 2});
  CHECK(ds == std::vector<int>{0, 1, 0, 1});
}

TEST_CASE("placement: least_loaded picks the emptiest of each kind", "[placement]") {
  std::vector<InstanceLoad> p = {Up("p0", 500), Up("p1", 20), Up("p2", 300)};
  std::vector<InstanceLoad> d = {Up("d0", 0, 3), Up("d1", 0, 9), Up("d2", 0, 1)};
  std::vector<InstanceLoad> c;
  auto placed = Place(PlacementPolicy::kLeastLoaded, Input(p, d, c, 10, {2, 0.2}));
  REQUIRE(placed.ok());
  CHECK(placed->prefill == 1);
  CHECK(placed->decode == 2);

  // A decode instance without free blocks for the prompt is a last resort.
  d[2].kv_block_size = 16;
  d[2].load.total_kv_blocks = 100;
  d[2].load.free_kv_blocks = 1;
  placed = Place(PlacementPolicy::kLeastLoaded, Input(p, d, c, 100, {2, 0.2}));
  REQUIRE(placed.ok());
  CHECK(placed->decode == 0);
}

TEST_CASE("placement: goodput picks the pair with the most headroom", "[placement]") {
  // TTFT: p0 (1000 + 100) * 1 ms = 1.1 s, p1 (100 + 100) * 1 ms = 0.2 s.
  std::vector<InstanceLoad> p = {Up("p0", 1000), Up("p1", 100)};
  // TPOT: d0 20 ms * 9/8 = 22.5 ms, d1 60 ms * 2 = 120 ms.
  std::vector<InstanceLoad> d = {Up("d0", 0, 8, 0, 0.02), Up("d1", 0, 1, 0, 0.06)};
  std::vector<InstanceLoad> c;
  auto placed = Place(PlacementPolicy::kGoodput, Input(p, d, c, 100, {2, 0.2}));
  REQUIRE(placed.ok());
  CHECK(placed->prefill == 1);
  CHECK(placed->decode == 0);
  CHECK(placed->predicted_ttft_s == Approx(0.2));
  CHECK(placed->predicted_tpot_s == Approx(0.0225));
}

TEST_CASE("placement: goodput rejects with 429 when no pair meets the SLO", "[placement]") {
  std::vector<InstanceLoad> p = {Up("p0", 5000), Up("p1", 4000)};  // >= 4.1 s of queue
  std::vector<InstanceLoad> d = {Up("d0", 0, 2)};
  std::vector<InstanceLoad> c;
  auto placed = Place(PlacementPolicy::kGoodput, Input(p, d, c, 100, {2, 0.2}));
  REQUIRE_FALSE(placed.ok());
  CHECK(placed.status().code() == StatusCode::kResourceExhausted);
  CHECK(placed.status().message().find("retry after") != std::string::npos);

  // TPOT miss alone also rejects: the decode batch is too slow.
  p = {Up("p0", 0)};
  d = {Up("d0", 0, 10, 0, 0.3)};
  placed = Place(PlacementPolicy::kGoodput, Input(p, d, c, 100, {2, 0.2}));
  REQUIRE_FALSE(placed.ok());
  CHECK(placed.status().code() == StatusCode::kResourceExhausted);

  // A per-class SLO that is looser admits the same request.
  placed = Place(PlacementPolicy::kGoodput, Input(p, d, c, 100, {10, 1.0}));
  CHECK(placed.ok());
}

TEST_CASE("placement: goodput admits what even an idle pair cannot serve in time",
          "[placement]") {
  // 10k tokens at 1 ms = 10 s > 2 s, but the cluster is idle: rejecting would not help.
  std::vector<InstanceLoad> p = {Up("p0")}, d = {Up("d0")}, c;
  auto placed = Place(PlacementPolicy::kGoodput, Input(p, d, c, 10000, {2, 0.2}));
  REQUIRE(placed.ok());
  CHECK(placed->predicted_ttft_s == Approx(10.0));
}

TEST_CASE("placement: goodput spreads equal instances with the counter", "[placement]") {
  std::vector<InstanceLoad> p = {Up("p0"), Up("p1")}, d = {Up("d0"), Up("d1")}, c;
  PlacementInput in = Input(p, d, c, 10, {2, 0.2});
  in.round_robin = 0;
  auto a = Place(PlacementPolicy::kGoodput, in);
  in.round_robin = 1;
  auto b = Place(PlacementPolicy::kGoodput, in);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->prefill != b->prefill);
  CHECK(a->decode != b->decode);
}

TEST_CASE("placement: colocated instances are used only without a usable pair",
          "[placement]") {
  std::vector<InstanceLoad> p = {Up("p0")}, d = {Up("d0")};
  std::vector<InstanceLoad> c = {Up("c0", 800, 4), Up("c1", 10, 1)};
  for (auto policy :
       {PlacementPolicy::kGoodput, PlacementPolicy::kLeastLoaded, PlacementPolicy::kRoundRobin}) {
    auto placed = Place(policy, Input(p, d, c, 10, {2, 0.2}));
    REQUIRE(placed.ok());
    CHECK(placed->colocated == -1);
    CHECK(placed->prefill == 0);
  }
  d[0].usable = false;
  auto placed = Place(PlacementPolicy::kGoodput, Input(p, d, c, 10, {2, 0.2}));
  REQUIRE(placed.ok());
  CHECK(placed->colocated == 1);
  CHECK(placed->prefill == -1);
  placed = Place(PlacementPolicy::kLeastLoaded, Input(p, d, c, 10, {2, 0.2}));
  REQUIRE(placed.ok());
  CHECK(placed->colocated == 1);
}

// ---- with a latency model (router.latency_model) -------------------------------------------

#include "router/cluster_backend.h"
#include "test_util.h"

namespace {

LatencyModel SimpleModel() {
  LatencyModel lm;
  lm.c1 = 0.01;   // prefill: 10 ms + 1 ms per token (+ c3 l^2 where a case sets it)
  lm.c2 = 0.001;
  lm.c3 = 0;
  lm.c4 = 0.02;   // decode: 20 ms + 2 ms per sequence + 10 us per context token
  lm.c5 = 0.002;
  lm.c6 = 1e-5;
  return lm;
}

InstanceLoad WithModel(InstanceLoad x, const LatencyModel* lm, int budget, int64_t context = 0) {
  x.latency_model = lm;
  x.token_budget = budget;
  x.load.context_tokens = context;
  return x;
}

}  // namespace

TEST_CASE("placement: latency-model predictions by hand", "[placement]") {
  LatencyModel lm = SimpleModel();
  // One batch holds the queue and the prompt: 10 ms + (1000 + 500) ms.
  CHECK(PredictTtftSeconds(WithModel(Up("p", 1000), &lm, 2048), 500) == Approx(1.51));
  // Budget 1000: three whole batches of queue (3 x 1.01 s), then the prompt (0.51 s).
  CHECK(PredictTtftSeconds(WithModel(Up("p", 3000), &lm, 1000), 500) == Approx(3.54));
  // Budget 0 = one batch, whatever its size.
  CHECK(PredictTtftSeconds(WithModel(Up("p", 3000), &lm, 0), 500) == Approx(3.51));
  // Chunked prompt with attention: chunk 1000 (past 0) then 500 (past 1000).
  lm.c3 = 1e-6;
  CHECK(PredictTtftSeconds(WithModel(Up("p"), &lm, 1000), 1500) ==
        Approx((0.01 + 1.0 + 1.0) + (0.01 + 0.5 + 1e-6 * 500 * (500 + 2000))));
  // The queue's tail shares the prompt's first batch: 700 queued + 300 of the prompt, then 200.
  CHECK(PredictTtftSeconds(WithModel(Up("p", 700), &lm, 1000), 500) ==
        Approx((0.01 + 1.0 + 1e-6 * (700.0 * 700 + 300.0 * 300)) +
               (0.01 + 0.2 + 1e-6 * 200 * (200 + 600))));
  lm.c3 = 0;
  // Decode: 11 sequences over 5000 + 500 tokens of context.
  CHECK(PredictDecodeTpotSeconds(WithModel(Up("d", 0, 10), &lm, 0, 5000), 500) ==
        Approx(0.02 + 0.022 + 0.055));
  // Colocated: a decode step of 3 sequences over 2000 tokens (its own prefill is in its TTFT).
  CHECK(PredictColocatedTpotSeconds(WithModel(Up("c", 0, 2), &lm, 512, 1000), 1000) ==
        Approx(0.02 + 0.006 + 0.02));
  CHECK(PredictTtftSeconds(WithModel(Up("c", 0, 2), &lm, 512, 1000), 1000) ==
        Approx(0.522 + 0.498));
  // No model: the measured averages, as before.
  InstanceLoad plain = Up("p", 1000, 0, 0.002);
  CHECK(PredictTtftSeconds(plain, 500) == Approx(PredictTtftSeconds(plain.load, 500)));
  CHECK(PredictDecodeTpotSeconds(Up("d", 0, 3, 0.001, 0.05), 10) == Approx(0.05 * 4 / 3));
}

TEST_CASE("placement: goodput with a latency model picks and rejects as predicted",
          "[placement]") {
  LatencyModel lm = SimpleModel();
  // The measured averages say the opposite of the model (P0 fast, D1 fast): the model wins.
  std::vector<InstanceLoad> p = {WithModel(Up("prefill-0", 1000, 0, 1e-6), &lm, 2048),
                                 WithModel(Up("prefill-1", 0, 0, 0.01), &lm, 2048)};
  std::vector<InstanceLoad> d = {WithModel(Up("decode-0", 0, 10, 0.001, 0.5), &lm, 0, 5000),
                                 WithModel(Up("decode-1", 0, 30, 0.001, 0.001), &lm, 0, 3000)};
  std::vector<InstanceLoad> none;
  auto placed = Place(PlacementPolicy::kGoodput, Input(p, d, none, 500, SloTarget{1.0, 0.1}));
  REQUIRE(placed.ok());
  CHECK(placed->prefill == 1);  // 0.51 s vs 1.51 s
  CHECK(placed->decode == 0);   // 0.097 s vs 0.117 s
  CHECK(placed->predicted_ttft_s == Approx(0.51));
  CHECK(placed->predicted_tpot_s == Approx(0.097));
  // TPOT 50 ms: neither decode instance can, and neither is idle: 429.
  auto rejected = Place(PlacementPolicy::kGoodput, Input(p, d, none, 500, SloTarget{1.0, 0.05}));
  REQUIRE_FALSE(rejected.ok());
  CHECK(rejected.status().code() == StatusCode::kResourceExhausted);
  CHECK(rejected.status().message().find("TPOT 0.097 s vs 0.050 s") != std::string::npos);
  // TTFT 0.4 s: even the empty prefill needs 0.51 s; P1 is idle but D0 is not: rejected.
  CHECK(Place(PlacementPolicy::kGoodput, Input(p, d, none, 500, SloTarget{0.4, 0.1}))
            .status()
            .code() == StatusCode::kResourceExhausted);

  // Colocated only: C1 meets TTFT 1.2 s (1.02 s) where C0 with its queue cannot.
  std::vector<InstanceLoad> c = {WithModel(Up("colocated-0", 600, 2), &lm, 512, 1000),
                                 WithModel(Up("colocated-1", 0, 2), &lm, 512, 1000)};
  auto colocated = Place(PlacementPolicy::kGoodput, Input(none, none, c, 1000, SloTarget{1.2, 1.0}));
  REQUIRE(colocated.ok());
  CHECK(colocated->colocated == 1);
  CHECK(colocated->predicted_ttft_s == Approx(1.02));
  CHECK(colocated->predicted_tpot_s == Approx(0.046));
}

TEST_CASE("placement: measured decode steps correct the latency model", "[placement]") {
  LatencyModel lm = SimpleModel();
  // Decode: 10 running over 5000 tokens; the prediction for one more over +500 is 0.097 s.
  InstanceLoad d = WithModel(Up("decode-0", 0, 10), &lm, 0, 5000);
  d.load.decode_forward_seconds = 0.05;  // but no batch reported: no measured step to compare
  CHECK(DecodeModelCorrection(d) == 1.0);
  CHECK(PredictDecodeTpotSeconds(d, 500) == Approx(0.097));
  // The whole step's time is not what the model describes (it has sampling, bookkeeping and KV
  // waits in it): it does not correct the model.
  d.load.decode_step_seconds = 0.5;
  d.load.decode_step_batch = 8;
  d.load.decode_step_context_tokens = 4000;
  d.load.decode_forward_seconds = 0;
  CHECK(DecodeModelCorrection(d) == 1.0);
  // Its recent steps: the forward passes of batch 8 over 4000 tokens took 0.038 s; the model says
  // 0.02 + 0.016 + 0.04 = 0.076 s there. The model is ~2x slow on this machine, so the prediction halves.
  d.load.decode_step_batch = 8;
  d.load.decode_step_context_tokens = 4000;
  d.load.decode_forward_seconds = 0.038;
  CHECK(DecodeModelCorrection(d) == Approx(0.5));
  CHECK(PredictDecodeTpotSeconds(d, 500) == Approx(0.097 * 0.5));
  // ... and so does a colocated instance's (the same decode step).
  InstanceLoad c = WithModel(Up("colocated-0", 0, 2), &lm, 512, 1000);
  c.load.decode_step_batch = 8;
  c.load.decode_step_context_tokens = 4000;
  c.load.decode_forward_seconds = 0.076 * 1.5;
  CHECK(PredictColocatedTpotSeconds(c, 1000) == Approx((0.02 + 0.006 + 0.02) * 1.5));
  // A correction out of all proportion is clamped: the model stays a prior.
  d.load.decode_forward_seconds = 0.076 * 100;
  CHECK(DecodeModelCorrection(d) == kMaxDecodeModelCorrection);
  d.load.decode_forward_seconds = 0.076 / 100;
  CHECK(DecodeModelCorrection(d) == kMinDecodeModelCorrection);
  // Without a model there is nothing to correct (the measured averages are used as they are).
  d.latency_model = nullptr;
  CHECK(DecodeModelCorrection(d) == 1.0);

  // Admission follows: TPOT SLO 60 ms rejects at the model's 0.097 s, admits at half of it.
  std::vector<InstanceLoad> p = {WithModel(Up("prefill-0"), &lm, 2048)};
  InstanceLoad slow = WithModel(Up("decode-0", 0, 10), &lm, 0, 5000);
  std::vector<InstanceLoad> ds = {slow};
  std::vector<InstanceLoad> none;
  CHECK(Place(PlacementPolicy::kGoodput, Input(p, ds, none, 500, SloTarget{1.0, 0.06}))
            .status()
            .code() == StatusCode::kResourceExhausted);
  ds[0].load.decode_step_batch = 8;
  ds[0].load.decode_step_context_tokens = 4000;
  ds[0].load.decode_forward_seconds = 0.038;
  auto placed = Place(PlacementPolicy::kGoodput, Input(p, ds, none, 500, SloTarget{1.0, 0.06}));
  REQUIRE(placed.ok());
  CHECK(placed->predicted_tpot_s == Approx(0.0485));
}

TEST_CASE("placement: the router loads router.latency_model relative to the config",
          "[placement]") {
  test::TempDir dir;
  std::filesystem::create_directories(dir.path() / "conf");
  dir.Write("conf/lm.yaml",
            "latency_model:\n"
            "  - {model: medium, threads: 1, prefill: {c1: 0.01, c2: 0.001, c3: 0},\n"
            "     decode: {c4: 0.02, c5: 0.002, c6: 1.0e-5}}\n"
            "  - {model: medium, threads: 2, prefill: {c1: 0.005, c2: 0.0005, c3: 0},\n"
            "     decode: {c4: 0.01, c5: 0.001, c6: 1.0e-5}}\n");
  std::string config_path = dir.Write("conf/cluster.yaml",
                                      "router: {latency_model: lm.yaml}\n"
                                      "decode: {threads: 2}\n");
  auto config = LoadConfig(config_path);
  REQUIRE(config.ok());
  auto models = LoadRouterLatencyModels(*config);
  REQUIRE(models.ok());
  REQUIRE(models->file != nullptr);
  REQUIRE(models->prefill != nullptr);
  REQUIRE(models->decode != nullptr);
  CHECK(models->prefill->threads == 1);
  CHECK(models->decode->threads == 2);
  CHECK(models->colocated == nullptr);  // no colocated instances

  config->router.latency_model.clear();
  auto off = LoadRouterLatencyModels(*config);
  REQUIRE(off.ok());
  CHECK(off->file == nullptr);

  // A shape the file does not have.
  config->router.latency_model = "lm.yaml";
  config->prefill.threads = 4;
  auto missing = LoadRouterLatencyModels(*config);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message().find("no entry for prefill (device cpu, threads 4") !=
        std::string::npos);

  // A bad file stops start-up with its line and field.
  dir.Write("conf/bad.yaml",
            "latency_model:\n  - model: medium\n    prefill: {c1: 0.01, c2: x, c3: 0}\n"
            "    decode: {c4: 0.02, c5: 0.002, c6: 1.0e-5}\n");
  config->prefill.threads = 1;
  config->router.latency_model = "bad.yaml";
  auto bad = LoadRouterLatencyModels(*config);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("bad.yaml:3:29: latency_model[0].prefill.c2: must be a number") !=
        std::string::npos);
  ClusterConfig with_ports = *config;
  with_ports.prefill.port = 1;
  with_ports.decode.port = 100;
  ClusterBackend backend(with_ports);
  Status start = backend.Start();
  CHECK(start.code() == StatusCode::kInvalidArgument);
  CHECK(start.message().find("latency_model[0].prefill.c2") != std::string::npos);
}

TEST_CASE("placement: decode TPOT is the mean step over the request's life", "[placement]") {
  LatencyModel lm = SimpleModel();  // decode: 20 ms + 2 ms per sequence + 10 us per token
  InstanceLoad d = WithModel(Up("decode-0", 0, 2), &lm, 0, 3000);
  d.residents_known = true;
  // Alone, 11 tokens = 10 decode steps at batch 1, its context 500 + s (mean 505.5).
  CHECK(PredictDecodeTpotSeconds(d, 500, 11) == Approx(0.02 + 0.002 + 0.005055));
  // Two decoding residents: one leaves after 4 steps, the other stays. Steps 1-4: batch 3,
  // contexts (1000 + s) + (2000 + s) + (500 + s); steps 5-10: batch 2, (2000 + s) + (500 + s).
  // Mean batch 24 / 10, mean context (4 x 3500 + 3 x 10 + 6 x 2500 + 2 x 45) / 10 = 2912.
  d.residents = {DecodeResident{1000, 4, true}, DecodeResident{2000, 100, true}};
  CHECK(PredictDecodeTpotSeconds(d, 500, 11) == Approx(0.02 + 0.002 * 2.4 + 1e-5 * 2912));
  // The next-step rule prices all 10 steps at batch 3 over 3500 tokens (still what an unknown
  // max_tokens or unknown residents get).
  CHECK(PredictDecodeTpotSeconds(d, 500) == Approx(0.02 + 0.006 + 0.035));
  InstanceLoad unknown = d;
  unknown.residents_known = false;
  CHECK(PredictDecodeTpotSeconds(unknown, 500, 11) == Approx(0.02 + 0.006 + 0.035));
  // Its first token 3.5 of today's steps (0.054 s) away: the residents run 3 steps on first.
  // Step 1: batch 3 over 501 + 1004 + 2004; steps 2-10: batch 2 over (500 + s) + (2003 + s).
  CHECK(PredictDecodeTpotSeconds(d, 500, 11, 0.054 * 3.5) ==
        Approx(0.02 + 0.002 * 2.1 + 1e-5 * (3509 + 9 * 2503 + 2 * 54) / 10));
  // A resident whose prompt is ahead in the prefill queue: 800 of the 1300 queued tokens, so
  // its first token comes at 800 / 1300 of the 0.5 s wait, and it decodes for the remaining
  // 0.19 s (8 steps of 22 ms, alone) before the request joins: it has 20 - 8 steps left, at
  // context 808 + s.
  d.residents = {DecodeResident{800, 20, false}};
  CHECK(PredictDecodeTpotSeconds(d, 500, 11, 0.5) == Approx(0.02 + 0.002 * 2 + 1e-5 * 1319));
  // With 5 steps it is gone by then.
  d.residents = {DecodeResident{800, 5, false}};
  CHECK(PredictDecodeTpotSeconds(d, 500, 11, 0.5) == Approx(0.02 + 0.002 + 0.005055));
  // Two, placed in this order: the first is 0.5 s x (1 - 800 / 2000) = 0.3 s ahead (13 steps:
  // 7 left, context 813 + s), the second 0.5 s x (1 - 1500 / 2000) = 0.125 s (5 steps: 15
  // left, 705 + s). Steps 1-7: batch 3 over 2018 + 3s; steps 8-10: batch 2 over 1205 + 2s.
  d.residents = {DecodeResident{800, 20, false}, DecodeResident{700, 20, false}};
  CHECK(PredictDecodeTpotSeconds(d, 500, 11, 0.5) ==
        Approx(0.02 + 0.002 * 2.7 + 1e-5 * (7 * 2018 + 3 * 28 + 3 * 1205 + 2 * 27) / 10));
  // Requests that arrive later ramp up to the typical population (2 requests over 2400
  // tokens) over the typical 4 decode steps: shares 1/4, 2/4, 3/4, then 1 (8.5 in all).
  d.residents.clear();
  d.typical.requests.Add(2);
  d.typical.context_tokens.Add(2400);
  d.typical.decode_steps.Add(4);
  CHECK(PredictDecodeTpotSeconds(d, 500, 11) ==
        Approx(0.02 + 0.002 * (10 + 2 * 8.5) / 10 + 1e-5 * (5055 + 2400 * 8.5) / 10));
  // A long life costs no more than a short one: closed forms between departures.
  d.residents = {DecodeResident{1000, 4, true}};
  d.typical = ResidentAverage{};
  // steps 1-4: batch 2, 1000 + 500 + 2s; steps 5-1000000: batch 1, 500 + s.
  const double steps = 1e6, tail = steps - 4;
  const double context = (4 * 1500 + 2 * 10 + tail * 500 + (5 + steps) * tail / 2) / steps;
  CHECK(PredictDecodeTpotSeconds(d, 500, 1000001) ==
        Approx(0.02 + 0.002 * (8 + tail) / steps + 1e-5 * context));
}

TEST_CASE("placement: the typical population is a moving average over arrivals", "[placement]") {
  ResidentAverage typical;
  // The first arrival seeds it: two decoding (one still prefilling does not count), 10 steps.
  typical.Observe({DecodeResident{1000, 5, true}, DecodeResident{2000, 5, true},
                   DecodeResident{500, 9, false}},
                  11);
  CHECK(typical.requests.value() == 2);
  CHECK(typical.context_tokens.value() == 3000);
  CHECK(typical.decode_steps.value() == 10);
  typical.Observe({}, 21);  // an arrival that found the instance empty, wanting 20 steps
  CHECK(typical.requests.value() == Approx(2 - kResidentAverageWeight * 2));
  CHECK(typical.context_tokens.value() == Approx(3000 - kResidentAverageWeight * 3000));
  CHECK(typical.decode_steps.value() == Approx(10 + kResidentAverageWeight * 10));
}

TEST_CASE("placement: goodput admits what the life-long TPOT allows", "[placement]") {
  LatencyModel lm = SimpleModel();
  std::vector<InstanceLoad> p = {WithModel(Up("prefill-0"), &lm, 2048)};
  InstanceLoad d = WithModel(Up("decode-0", 0, 2), &lm, 0, 3000);
  d.residents_known = true;
  d.residents = {DecodeResident{1000, 4, true}, DecodeResident{2000, 100, true}};
  std::vector<InstanceLoad> ds = {d};
  std::vector<InstanceLoad> none;
  PlacementInput in = Input(p, ds, none, 500, SloTarget{1.0, 0.058});
  // Without max_tokens: the next step (0.061 s) is over 58 ms: rejected.
  CHECK(Place(PlacementPolicy::kGoodput, in).status().code() == StatusCode::kResourceExhausted);
  // 11 tokens: its prefill takes 0.51 s, 9 of today's steps (0.054 s), by when the first
  // resident has left and the second has 91 steps to go; then 10 steps at batch 2 over
  // (500 + s) + (2009 + s).
  in.max_tokens = 11;
  auto placed = Place(PlacementPolicy::kGoodput, in);
  REQUIRE(placed.ok());
  CHECK(placed->predicted_ttft_s == Approx(0.51));
  CHECK(placed->predicted_tpot_s == Approx(0.02 + 0.004 + 1e-5 * (2509 + 11)));
}

TEST_CASE("placement: the correction compares at the fractional mean batch", "[placement]") {
  LatencyModel lm = SimpleModel();
  InstanceLoad d = WithModel(Up("decode-0"), &lm, 0);
  // Batch 2.5 over 1000 tokens: the model says 0.02 + 0.005 + 0.01 = 0.035 s, as measured.
  // (Rounding the batch down to 2 would call the model 1 ms fast and correct it by 1.03.)
  d.load.decode_step_batch = 2.5;
  d.load.decode_step_context_tokens = 1000;
  d.load.decode_forward_seconds = 0.035;
  CHECK(DecodeModelCorrection(d) == Approx(1.0));
}

TEST_CASE("placement: a colocated prompt's stall of the residents, by hand", "[placement]") {
  LatencyModel lm = SimpleModel();  // prefill 10 ms + 1 ms per token; decode 20 + 2 + 0.01/token
  InstanceLoad c = WithModel(Up("colocated-0"), &lm, 2048);
  // Unknown residents, or none: nothing to stall.
  CHECK(PredictStalledResidentTpotSeconds(c, 300, 0.31) == 0);
  c.residents_known = true;
  CHECK(PredictStalledResidentTpotSeconds(c, 300, 0.31) == 0);
  // One decoding resident, 1000 tokens of context, 40 of its 50 steps left. Today's step:
  // 0.02 + 0.002 + 0.01 = 0.032 s. The 300-token prompt's prefill (0.31 s) begins at once
  // (TTFT 0.31 s) and stalls it: 0.032 + 0.31 / 50.
  c.residents = {DecodeResident{1000, 40, true, 50}};
  CHECK(PredictStalledResidentTpotSeconds(c, 300, 0.31) == Approx(0.032 + 0.31 / 50));
  // Its 40 steps (1.28 s) are over before a prefill that begins 1.5 s from now: no stall.
  CHECK(PredictStalledResidentTpotSeconds(c, 300, 1.81) == 0);
  // A resident still queued ahead is always stalled (its first token comes before the
  // prompt's prefill); life_steps 0 (unknown) spreads the stall over its remaining steps.
  c.residents.push_back(DecodeResident{500, 10, false});
  CHECK(PredictStalledResidentTpotSeconds(c, 300, 1.81) == Approx(0.032 + 0.31 / 10));
  // Without a model: today's measured step and the measured prefill seconds per token.
  InstanceLoad plain = Up("colocated-1", 0, 1, 0.002, 0.05);
  plain.residents_known = true;
  plain.residents = {DecodeResident{1000, 40, true, 50}};
  CHECK(PredictStalledResidentTpotSeconds(plain, 300, 0.6) ==
        Approx(PredictTpotSeconds(plain.load) + 0.6 / 50));
}

TEST_CASE("placement: goodput sends a colocated prompt where it stalls no decode",
          "[placement]") {
  LatencyModel lm = SimpleModel();
  std::vector<InstanceLoad> none;
  // colocated-0 decodes a request with 16 of its 50 steps left; colocated-1 is idle. On the
  // new request's own predictions colocated-0 is the better: its resident is nearly done by
  // the request's first token (0.41 s of prefill = 14 of its 28.8 ms steps), and it has decoded
  // faster lately (measured forward passes 10% under the model's, colocated-1's 10% over):
  // TPOT 24.6 ms against 28.7 ms. But the 400-token prefill would stall the resident to
  // 0.0288 + 0.41 / 50 = 0.037 s: within the SLO, yet less slack than the idle one offers.
  InstanceLoad busy = WithModel(Up("colocated-0", 0, 1), &lm, 2048, 1000);
  busy.residents_known = true;
  busy.residents = {DecodeResident{1000, 16, true, 50}};
  busy.load.decode_step_batch = 1;
  busy.load.decode_step_context_tokens = 1000;
  busy.load.decode_forward_seconds = 0.032 * 0.9;
  InstanceLoad idle = WithModel(Up("colocated-1"), &lm, 2048);
  idle.residents_known = true;
  idle.load.decode_step_batch = 1;
  idle.load.decode_step_context_tokens = 1000;
  idle.load.decode_forward_seconds = 0.032 * 1.1;
  std::vector<InstanceLoad> c = {busy, idle};
  PlacementInput in = Input(none, none, c, 400, SloTarget{8, 0.05});
  in.max_tokens = 20;
  for (uint64_t rr = 0; rr < 2; ++rr) {  // whichever the tie-break would try first
    in.round_robin = rr;
    auto placed = Place(PlacementPolicy::kGoodput, in);
    REQUIRE(placed.ok());
    CHECK(placed->colocated == 1);
  }
  // TPOT SLO 30 ms: the stall would make the resident miss; the request goes to the idle
  // instance, where it meets the SLO itself.
  in.slo = SloTarget{8, 0.03};
  auto placed = Place(PlacementPolicy::kGoodput, in);
  REQUIRE(placed.ok());
  CHECK(placed->colocated == 1);
  // With only the busy instance the request is still admitted: admission (429) looks at the
  // request's own predictions only, which meet the SLO.
  std::vector<InstanceLoad> only_busy = {busy};
  PlacementInput alone = in;
  alone.colocated = &only_busy;
  placed = Place(PlacementPolicy::kGoodput, alone);
  REQUIRE(placed.ok());
  CHECK(placed->colocated == 0);
  // Both instances busy: the one whose resident has the longer life to spread the stall over.
  c[1] = busy;
  c[1].name = "colocated-1";
  c[1].residents = {DecodeResident{1000, 16, true, 400}};
  in.slo = SloTarget{8, 0.05};
  placed = Place(PlacementPolicy::kGoodput, in);
  REQUIRE(placed.ok());
  CHECK(placed->colocated == 1);
}

TEST_CASE("placement: decode-step predictions grow with what was just placed", "[placement]") {
  // Unmeasured, measured at a batch, and measured without a batch: each prediction grows with
  // `running` (which counts the router's unreported placements).
  LoadReport cold;
  LoadReport warm;
  warm.decode_step_seconds = 0.01;
  warm.decode_step_batch = 1;
  for (LoadReport* load : {&cold, &warm}) {
    double last = 0;
    for (int running = 0; running <= 32; ++running) {
      load->running_requests = running;
      double t = PredictTpotSeconds(*load);
      CHECK(t > last);
      last = t;
    }
  }
  cold.running_requests = 0;
  CHECK(PredictTpotSeconds(cold) == Approx(kDefaultDecodeStepSeconds));
  warm.running_requests = 0;  // the step measured at a batch of one
  CHECK(PredictTpotSeconds(warm) == Approx(0.01));
}

TEST_CASE("placement: a burst spreads over equal decode instances under every policy",
          "[placement]") {
  for (auto policy :
       {PlacementPolicy::kGoodput, PlacementPolicy::kLeastLoaded, PlacementPolicy::kRoundRobin}) {
    for (double step : {0.0, 0.01}) {  // unmeasured, and measured at a batch of one
      INFO(PlacementPolicyName(policy) << ", decode step " << step);
      std::vector<InstanceLoad> p = {Up("p0")}, d = {Up("d0", 0, 0, 0.001, step),
                                                     Up("d1", 0, 0, 0.001, step)};
      for (auto& x : d) x.load.decode_step_batch = step > 0 ? 1 : 0;
      std::vector<InstanceLoad> c;
      int on[2] = {0, 0};
      // 16 at once: no report comes between them; the router adds each to its instance.
      for (uint64_t k = 0; k < 16; ++k) {
        PlacementInput in = Input(p, d, c, 10, {60, 0.2});
        in.round_robin = k;
        auto placed = Place(policy, in);
        REQUIRE(placed.ok());
        ++on[placed->decode];
        AddUnreportedSubmit(p[0].load, 10, false);
        AddUnreportedHandoff(d[placed->decode].load, 10, 0);
      }
      CHECK(on[0] == 8);
      CHECK(on[1] == 8);
    }
  }
}
