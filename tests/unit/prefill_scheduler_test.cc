// The prefill scheduler as a plain function: FCFS, token budget, batch size, blocks, chunking.
#include "prefill/prefill_scheduler.h"

#include <catch2/catch.hpp>
#include <vector>

namespace tandem {
namespace {

TEST_CASE("prefill: batches FCFS up to the token budget", "[prefill_scheduler]") {
  std::vector<PrefillItem> queue = {{100, 0, 0}, {200, 0, 0}, {300, 0, 0}};
  PrefillLimits limits{/*token_budget=*/350, /*max_batch_size=*/8, /*block_size=*/16};
  auto batch = SchedulePrefill(queue, limits, 1000);
  REQUIRE(batch.size() == 3);
  CHECK(batch[0].index == 0);
  CHECK(batch[0].num_tokens == 100);
  CHECK(batch[0].new_blocks == 7);
  CHECK(batch[1].num_tokens == 200);
  // The third is chunked to what is left of the budget, but gets its whole prompt's blocks.
  CHECK(batch[2].num_tokens == 50);
  CHECK(batch[2].new_blocks == 19);
}

TEST_CASE("prefill: a long prompt is chunked and continues where it stopped",
          "[prefill_scheduler]") {
  PrefillLimits limits{64, 8, 16};
  std::vector<PrefillItem> queue = {{200, 0, 0}};
  auto first = SchedulePrefill(queue, limits, 100);
  REQUIRE(first.size() == 1);
  CHECK(first[0].num_tokens == 64);
  CHECK(first[0].new_blocks == 13);
  queue[0] = {200, 192, 13};
  auto last = SchedulePrefill(queue, limits, 0);  // no free blocks needed any more
  REQUIRE(last.size() == 1);
  CHECK(last[0].num_tokens == 8);
  CHECK(last[0].new_blocks == 0);
}

TEST_CASE("prefill: max_batch_size caps the sequences", "[prefill_scheduler]") {
  std::vector<PrefillItem> queue(10, PrefillItem{4, 0, 0});
  auto batch = SchedulePrefill(queue, PrefillLimits{1000, 3, 16}, 1000);
  CHECK(batch.size() == 3);
}

TEST_CASE("prefill: a request without blocks stops the scan (no overtaking)",
          "[prefill_scheduler]") {
  std::vector<PrefillItem> queue = {{16, 0, 0}, {64, 0, 0}, {16, 0, 0}};
  auto batch = SchedulePrefill(queue, PrefillLimits{1000, 8, 16}, 3);
  REQUIRE(batch.size() == 1);  // the second needs 4 blocks, 2 left; the third must wait too
  CHECK(batch[0].index == 0);
  CHECK(SchedulePrefill(queue, PrefillLimits{1000, 8, 16}, 0).empty());
}

TEST_CASE("prefill: BlocksForTokens rounds up", "[prefill_scheduler]") {
  CHECK(BlocksForTokens(1, 16) == 1);
  CHECK(BlocksForTokens(16, 16) == 1);
  CHECK(BlocksForTokens(17, 16) == 2);
}

}  // namespace
}  // namespace tandem
