#include <catch2/catch.hpp>

#include "cluster/planner.h"
#include "common/config/config.h"

using namespace tandem;

namespace {

LatencyModel Entry(int tp, double c2) {
  LatencyModel m;
  m.device = "cpu";
  m.threads = 1;
  m.tensor_parallel = tp;
  m.c1 = 0.01;
  m.c2 = c2;
  m.c4 = 0.02;
  m.c5 = 0.001;
  m.kv_bytes_per_token = 1000;
  return m;
}

// A chatbot plan on 4 GPUs of one node, short enough for a unit test.
PlanOptions SmallPlan() {
  PlanOptions o;
  o.workload = "chatbot";
  o.slo = Slo{1.0, 0.1};
  o.gpus = 4;
  o.gpus_per_node = 4;
  o.max_model_len = 256;
  o.num_requests = 100;
  o.horizon_s = 20;
  return o;
}

}  // namespace

TEST_CASE("the planner picks the shape that is super-linear for prefill and writes a loadable "
          "config",
          "[planner]") {
  LatencyModelFile models;
  models.entries.push_back(Entry(1, 0.01));
  models.entries.push_back(Entry(2, 0.002));  // 2 GPUs, 5x faster prefill; decode no faster
  PlanOptions o = SmallPlan();
  auto plan = MakePlan(models, o);
  REQUIRE(plan.ok());
  REQUIRE_FALSE(plan->prefill_candidates.empty());
  CHECK(plan->prefill_candidates[0].prefill_tp == 2);
  CHECK(plan->decode_candidates[0].decode_tp == 1);  // the same work on fewer GPUs
  CHECK(plan->chosen.prefill_tp == 2);
  CHECK(plan->chosen.decode_tp == 1);
  CHECK(plan->chosen.gpus <= 4);
  CHECK(plan->chosen.rate > 0);
  CHECK(plan->colocated.rate > 0);
  // The colocated baseline under both scheduling policies, each with its own best shape over
  // every shape searched, replicated within the budget.
  CHECK(plan->colocated.scheduling == "chunked");
  CHECK(plan->colocated_prefill_first.scheduling == "prefill_first");
  CHECK(plan->colocated_prefill_first.rate > 0);
  REQUIRE(plan->colocated_prefill_first_candidates.size() == plan->colocated_candidates.size());
  for (const PlanCandidate& c : plan->colocated_prefill_first_candidates)
    CHECK(c.scheduling == "prefill_first");
  for (const PlanCandidate* v : {&plan->colocated, &plan->colocated_prefill_first}) {
    CHECK(v->kind == "colocated");
    CHECK(v->gpus <= 4);
    CHECK(v->gpus == v->prefill_instances * v->prefill_tp * v->prefill_pp);
  }
  CHECK(plan->colocated_prefill_first.prefill_tp ==
        plan->colocated_prefill_first_candidates.front().prefill_tp);
  auto config = ParseConfig(plan->config_yaml, "plan.yaml");
  REQUIRE(config.ok());
  CHECK(config->prefill.tensor_parallel == 2);
  CHECK(config->prefill.instances == plan->chosen.prefill_instances);
  CHECK(config->decode.instances == plan->chosen.decode_instances);
  CHECK(config->colocated.instances == 0);
  CHECK(config->slo.ttft_s == 1.0);

  SECTION("low affinity: units of one node") {
    o.high_affinity = false;
    auto low = MakePlan(models, o);
    REQUIRE(low.ok());
    REQUIRE_FALSE(low->unit_candidates.empty());
    CHECK(low->chosen.prefill_tp == 2);
    CHECK(low->chosen.gpus <= 4);
    CHECK(ParseConfig(low->config_yaml, "plan.yaml").ok());
    CHECK(low->colocated_prefill_first.rate > 0);
  }
}

TEST_CASE("the planner says when nothing fits", "[planner]") {
  LatencyModelFile models;
  models.entries.push_back(Entry(8, 0.001));
  PlanOptions o;
  o.gpus = 4;
  auto plan = MakePlan(models, o);
  REQUIRE_FALSE(plan.ok());
  CHECK(plan.status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("the planner leaves out pipeline stages over --max-pipeline-parallel", "[planner]") {
  LatencyModelFile models;
  models.entries.push_back(Entry(1, 0.01));
  LatencyModel staged = Entry(1, 0.001);  // two stages, 10x faster prefill: the planner's pick
  staged.pipeline_parallel = 2;
  models.entries.push_back(staged);
  PlanOptions o = SmallPlan();
  auto any = MakePlan(models, o);
  REQUIRE(any.ok());
  CHECK(any->prefill_candidates[0].prefill_pp == 2);  // DistServe's search takes it
  o.max_pipeline_parallel = 1;  // what the servers run
  auto servable = MakePlan(models, o);
  REQUIRE(servable.ok());
  for (const auto* list : {&servable->prefill_candidates, &servable->decode_candidates,
                           &servable->pair_candidates, &servable->colocated_candidates})
    for (const PlanCandidate& c : *list) {
      CHECK(c.prefill_pp <= 1);
      CHECK(c.decode_pp <= 1);
    }
  auto config = ParseConfig(servable->config_yaml, "plan.yaml");
  REQUIRE(config.ok());
  CHECK(config->prefill.pipeline_parallel == 1);
  CHECK(config->decode.pipeline_parallel == 1);
  // Only staged shapes: nothing fits, and the message says why.
  models.entries.erase(models.entries.begin());
  auto none = MakePlan(models, o);
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().message() ==
        "no latency model entry fits 4 GPUs (4 per node, pipeline_parallel <= 1)");
}
