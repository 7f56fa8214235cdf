// Decode admission (blocks, watermark, batch slots) and step scheduling with preemption, as plain
// functions of state: the chunked policy (ScheduleStep) and the prefill-first one
// (SchedulePrefillFirstStep).
#include "decode/decode_scheduler.h"

#include <catch2/catch.hpp>
#include <vector>

#include "decode/colocated_scheduler.h"

namespace tandem {
namespace {

TEST_CASE("decode: BlocksForPull covers prompt + first token", "[decode_scheduler]") {
  CHECK(BlocksForPull(15, 16) == 1);
  CHECK(BlocksForPull(16, 16) == 2);
  CHECK(BlocksForPull(1, 16) == 1);
}

TEST_CASE("decode: admits pulls while blocks last, FCFS", "[decode_scheduler]") {
  std::vector<int32_t> needs = {4, 4, 2};
  PullLimits limits{/*total_blocks=*/100, /*watermark=*/1.0, /*max_batch_size=*/64};
  CHECK(AdmitPulls(needs, limits, 100, 0) == 3);
  CHECK(AdmitPulls(needs, limits, 8, 0) == 2);
  CHECK(AdmitPulls(needs, limits, 7, 0) == 1);
  CHECK(AdmitPulls(needs, limits, 3, 0) == 0);  // the 2-block one does not overtake
}

TEST_CASE("decode: the KV usage watermark holds pulls back", "[decode_scheduler]") {
  std::vector<int32_t> needs = {1, 1, 1};
  PullLimits limits{100, 0.9, 64};
  CHECK(AdmitPulls(needs, limits, 50, 0) == 3);
  CHECK(AdmitPulls(needs, limits, 10, 0) == 0);  // 90% used: not under the watermark
  CHECK(AdmitPulls(needs, limits, 11, 0) == 1);  // 89% used, then 90%
  // The check is on usage before admission: an empty pool admits unless the watermark is 0.
  CHECK(AdmitPulls(needs, PullLimits{100, 0.0, 64}, 100, 0) == 0);
  CHECK(AdmitPulls(needs, PullLimits{100, 0.01, 64}, 100, 0) == 1);
}

TEST_CASE("decode: max_batch_size counts running and pulling requests", "[decode_scheduler]") {
  std::vector<int32_t> needs = {1, 1, 1};
  CHECK(AdmitPulls(needs, PullLimits{100, 1.0, 4}, 100, 2) == 2);
  CHECK(AdmitPulls(needs, PullLimits{100, 1.0, 4}, 100, 4) == 0);
}

TEST_CASE("step: decodes every running sequence, then prefills waiting ones",
          "[decode_scheduler]") {
  std::vector<SeqState> running = {{33, 32, 3}, {10, 9, 1}};  // decoding
  std::vector<SeqState> waiting = {{40, 0, 0}, {40, 0, 0}};
  StepPlan plan = ScheduleStep(running, waiting, StepLimits{50, 8, 16}, 100);
  REQUIRE(plan.preempted.empty());
  REQUIRE(plan.scheduled.size() == 4);
  CHECK(plan.scheduled[0].num_tokens == 1);
  CHECK(plan.scheduled[0].new_blocks == 0);  // token 33 fits block 3
  CHECK(plan.scheduled[1].num_tokens == 1);
  CHECK(plan.scheduled[2].from_waiting);
  CHECK(plan.scheduled[2].num_tokens == 40);
  CHECK(plan.scheduled[2].new_blocks == 3);
  CHECK(plan.scheduled[3].num_tokens == 8);  // chunk: what is left of the budget
  CHECK(plan.scheduled[3].new_blocks == 1);
}

TEST_CASE("step: a sequence crossing a block boundary gets a new block", "[decode_scheduler]") {
  std::vector<SeqState> running = {{33, 32, 2}};
  StepPlan plan = ScheduleStep(running, {}, StepLimits{50, 8, 16}, 1);
  REQUIRE(plan.scheduled.size() == 1);
  CHECK(plan.scheduled[0].new_blocks == 1);
}

TEST_CASE("step: the pool running out preempts the youngest", "[decode_scheduler]") {
  // Three decoding sequences at a block boundary, one free block.
  std::vector<SeqState> running = {{33, 32, 2}, {33, 32, 2}, {33, 32, 2}};
  std::vector<SeqState> waiting = {{5, 0, 0}};
  StepPlan plan = ScheduleStep(running, waiting, StepLimits{50, 8, 16}, 1);
  // Oldest takes the free block; the second needs one: the youngest (2) gives its 2 blocks.
  REQUIRE(plan.preempted.size() == 1);
  CHECK(plan.preempted[0] == 2);
  REQUIRE(plan.scheduled.size() == 2);
  CHECK(plan.scheduled[0].index == 0);
  CHECK(plan.scheduled[1].index == 1);
  for (const auto& s : plan.scheduled) CHECK_FALSE(s.from_waiting);  // no admission this step
}

TEST_CASE("step: preempting a sequence frees only the blocks it does not share",
          "[decode_scheduler]") {
  // The youngest holds two blocks, both shared (a prefix it took from the oldest): preempting
  // it frees nothing, so the oldest gives way too instead of being planned a block that is not
  // free.
  std::vector<SeqState> running = {{33, 32, 2, 2}, {20, 19, 2, 2}};
  StepPlan plan = ScheduleStep(running, {}, StepLimits{50, 8, 16}, 0);
  CHECK(plan.scheduled.empty());
  CHECK(plan.preempted == std::vector<size_t>{1, 0});
  // One of its blocks its own: that one is enough.
  running[1].shared_blocks = 1;
  plan = ScheduleStep(running, {}, StepLimits{50, 8, 16}, 0);
  CHECK(plan.preempted == std::vector<size_t>{1});
  REQUIRE(plan.scheduled.size() == 1);
  CHECK(plan.scheduled[0].new_blocks == 1);
}

TEST_CASE("step: the only sequence that cannot grow gives way itself", "[decode_scheduler]") {
  std::vector<SeqState> running = {{33, 32, 2}};
  StepPlan plan = ScheduleStep(running, {}, StepLimits{50, 8, 16}, 0);
  CHECK(plan.scheduled.empty());
  REQUIRE(plan.preempted.size() == 1);
  CHECK(plan.preempted[0] == 0);
}

TEST_CASE("step: max_batch_size and budget cap the batch", "[decode_scheduler]") {
  std::vector<SeqState> running(5, SeqState{10, 9, 1});
  CHECK(ScheduleStep(running, {}, StepLimits{50, 3, 16}, 10).scheduled.size() == 3);
  CHECK(ScheduleStep(running, {}, StepLimits{2, 8, 16}, 10).scheduled.size() == 2);
}

// ---- prefill_first ----

StepLimits PrefillFirst(int32_t budget, int32_t max_batch_size) {
  return StepLimits{budget, max_batch_size, 16, StepPolicy::kPrefillFirst};
}

TEST_CASE("prefill_first: waiting prompts run whole, alone, FCFS, running ones pause",
          "[decode_scheduler]") {
  std::vector<SeqState> running = {{33, 32, 3}, {10, 9, 1}};  // decoding
  std::vector<SeqState> waiting = {{40, 0, 0}, {40, 0, 0}, {40, 0, 0}};
  StepPlan plan = SchedulePrefillFirstStep(running, waiting, PrefillFirst(100, 8), 100);
  CHECK(plan.preempted.empty());
  REQUIRE(plan.scheduled.size() == 2);  // 80 of 100 tokens; the third would need 40 more
  for (size_t k = 0; k < plan.scheduled.size(); ++k) {
    CHECK(plan.scheduled[k].from_waiting);
    CHECK(plan.scheduled[k].index == k);
    CHECK(plan.scheduled[k].num_tokens == 40);  // never a chunk
    CHECK(plan.scheduled[k].new_blocks == 3);
  }
  // The chunked policy would have decoded both running sequences and chunked the third prompt.
  CHECK(ScheduleStep(running, waiting, PrefillFirst(100, 8), 100).scheduled.size() == 5);
}

TEST_CASE("prefill_first: batch slots count the running sequences", "[decode_scheduler]") {
  std::vector<SeqState> running = {{10, 9, 1}, {10, 9, 1}};
  std::vector<SeqState> waiting = {{5, 0, 0}, {5, 0, 0}};
  StepPlan plan = SchedulePrefillFirstStep(running, waiting, PrefillFirst(100, 3), 100);
  REQUIRE(plan.scheduled.size() == 1);
  CHECK(plan.scheduled[0].from_waiting);
  // No slot at all: the step decodes.
  plan = SchedulePrefillFirstStep(running, waiting, PrefillFirst(100, 2), 100);
  REQUIRE(plan.scheduled.size() == 2);
  for (const auto& s : plan.scheduled) CHECK_FALSE(s.from_waiting);
}

TEST_CASE("prefill_first: a prompt larger than the budget runs alone", "[decode_scheduler]") {
  std::vector<SeqState> big_first = {{60, 0, 0}, {5, 0, 0}};
  StepPlan plan = SchedulePrefillFirstStep({}, big_first, PrefillFirst(50, 8), 100);
  REQUIRE(plan.scheduled.size() == 1);
  CHECK(plan.scheduled[0].num_tokens == 60);
  CHECK(plan.scheduled[0].new_blocks == 4);
  // Behind a smaller one it waits for the next step (FCFS: nothing overtakes it either).
  std::vector<SeqState> big_second = {{5, 0, 0}, {60, 0, 0}, {5, 0, 0}};
  plan = SchedulePrefillFirstStep({}, big_second, PrefillFirst(50, 8), 100);
  REQUIRE(plan.scheduled.size() == 1);
  CHECK(plan.scheduled[0].index == 0);
  CHECK(plan.scheduled[0].num_tokens == 5);
}

TEST_CASE("prefill_first: nothing waiting, or the first prompt does not fit: a decode step",
          "[decode_scheduler]") {
  std::vector<SeqState> running = {{33, 32, 2}, {10, 9, 1}};
  StepPlan plan = SchedulePrefillFirstStep(running, {}, PrefillFirst(100, 8), 10);
  REQUIRE(plan.scheduled.size() == 2);
  CHECK(plan.scheduled[0].num_tokens == 1);
  CHECK(plan.scheduled[0].new_blocks == 1);
  // The first waiting prompt needs 4 blocks, 3 are free (one of them kept for running[0]'s next
  // token): decode; the small prompt behind it does not overtake.
  std::vector<SeqState> waiting = {{50, 0, 0}, {5, 0, 0}};
  plan = SchedulePrefillFirstStep(running, waiting, PrefillFirst(100, 8), 3);
  REQUIRE(plan.scheduled.size() == 2);
  for (const auto& s : plan.scheduled) CHECK_FALSE(s.from_waiting);
  // With 5 free, the prompt fits beside that block.
  plan = SchedulePrefillFirstStep(running, waiting, PrefillFirst(100, 8), 5);
  REQUIRE(plan.scheduled.size() == 1);
  CHECK(plan.scheduled[0].from_waiting);
  CHECK(plan.scheduled[0].num_tokens == 50);
}

TEST_CASE("prefill_first: the pool running out preempts the youngest, it recomputes whole",
          "[decode_scheduler]") {
  // Three decoding sequences at a block boundary, one free block, a prompt that cannot fit.
  std::vector<SeqState> running = {{33, 32, 2}, {33, 32, 2}, {33, 32, 2}};
  std::vector<SeqState> waiting = {{20, 0, 0}};
  StepPlan plan = SchedulePrefillFirstStep(running, waiting, PrefillFirst(100, 8), 1);
  REQUIRE(plan.preempted.size() == 1);
  CHECK(plan.preempted[0] == 2);
  REQUIRE(plan.scheduled.size() == 2);
  for (const auto& s : plan.scheduled) CHECK_FALSE(s.from_waiting);
  // The victim waits at the front with nothing computed: its prompt + generated tokens come
  // back as one whole prompt once the blocks are there (2 running need 0 more blocks now).
  std::vector<SeqState> after = {{34, 33, 3}, {34, 33, 3}};
  std::vector<SeqState> queue = {{33, 0, 0}, {20, 0, 0}};
  plan = SchedulePrefillFirstStep(after, queue, PrefillFirst(100, 8), 3);
  REQUIRE(plan.scheduled.size() == 1);
  CHECK(plan.scheduled[0].index == 0);
  CHECK(plan.scheduled[0].num_tokens == 33);
  CHECK(plan.scheduled[0].new_blocks == 3);
}

TEST_CASE("ScheduleEngineStep follows the policy, config names map to policies",
          "[decode_scheduler]") {
  CHECK(StepPolicyFromConfig("chunked") == StepPolicy::kChunked);
  CHECK(StepPolicyFromConfig("prefill_first") == StepPolicy::kPrefillFirst);
  std::vector<SeqState> running = {{10, 9, 1}};
  std::vector<SeqState> waiting = {{5, 0, 0}};
  StepLimits chunked{100, 8, 16};
  CHECK(ScheduleEngineStep(running, waiting, chunked, 10).scheduled.size() == 2);
  CHECK(ScheduleEngineStep(running, waiting, PrefillFirst(100, 8), 10).scheduled.size() == 1);
}

}  // namespace
}  // namespace tandem
