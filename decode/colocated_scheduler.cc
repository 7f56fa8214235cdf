#include "decode/colocated_scheduler.h"

#include <algorithm>

namespace tandem {
namespace {

int32_t BlocksFor(int64_t tokens, int32_t block_size) {
  return static_cast<int32_t>((tokens + block_size - 1) / block_size);
}

}  // namespace

StepPlan ScheduleStep(std::span<const SeqState> running, std::span<const SeqState> waiting,
                      const StepLimits& limits, int32_t free_blocks) {
  StepPlan plan;
  int32_t budget = limits.token_budget;
  size_t end = running.size();  // running[end..) has been preempted
  for (size_t i = 0; i < end; ++i) {
    if (budget <= 0 || static_cast<int32_t>(plan.scheduled.size()) >= limits.max_batch_size)
      break;
    const SeqState& s = running[i];
    const int32_t n = std::min(s.num_tokens - s.num_computed, budget);
    if (n <= 0) continue;
    const int32_t need =
        std::max(0, BlocksFor(s.num_computed + n, limits.block_size) - s.num_blocks);
    while (need > free_blocks && end > i + 1) {
      --end;
      plan.preempted.push_back(end);
      free_blocks += running[end].num_blocks;
    }
    if (need > free_blocks) {  // nobody younger is left: it gives way itself
      plan.preempted.push_back(i);
      free_blocks += s.num_blocks;
      end = i;
      break;
    }
    free_blocks -= need;
    budget -= n;
    plan.scheduled.push_back({false, i, n, need});
  }
  if (!plan.preempted.empty()) return plan;
  for (size_t j = 0; j < waiting.size(); ++j) {
    if (budget <= 0 || static_cast<int32_t>(plan.scheduled.size()) >= limits.max_batch_size)
      break;
    const SeqState& s = waiting[j];
    const int32_t n = std::min(s.num_tokens - s.num_computed, budget);
    if (n <= 0) continue;
    const int32_t need =
        std::max(0, BlocksFor(s.num_computed + n, limits.block_size) - s.num_blocks);
    if (need > free_blocks) break;
    free_blocks -= need;
    budget -= n;
    plan.scheduled.push_back({true, j, n, need});
  }
  return plan;
}

}  // namespace tandem
