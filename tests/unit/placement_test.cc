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
