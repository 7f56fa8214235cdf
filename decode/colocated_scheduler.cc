#include "decode/colocated_scheduler.h"

#include <algorithm>

#include "common/engine/kv_cache.h"

namespace tandem {

StepPolicy StepPolicyFromConfig(const std::string& scheduling) {
  return scheduling == "prefill_first" ? StepPolicy::kPrefillFirst : StepPolicy::kChunked;
}

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
        std::max(0, BlocksForTokens(s.num_computed + n, limits.block_size) - s.num_blocks);
    while (need > free_blocks && end > i + 1) {
      --end;
      plan.preempted.push_back(end);
      free_blocks += running[end].num_blocks - running[end].shared_blocks;
    }
    if (need > free_blocks) {  // nobody younger is left: it gives way itself
      plan.preempted.push_back(i);
      free_blocks += s.num_blocks - s.shared_blocks;
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
        std::max(0, BlocksForTokens(s.num_computed + n, limits.block_size) - s.num_blocks);
    if (need + s.cached_blocks > free_blocks) break;
    free_blocks -= need + s.cached_blocks;
    budget -= n;
    plan.scheduled.push_back({true, j, n, need});
  }
  return plan;
}

StepPlan SchedulePrefillFirstStep(std::span<const SeqState> running,
                                  std::span<const SeqState> waiting, const StepLimits& limits,
                                  int32_t free_blocks) {
  // Blocks the running sequences take in their next decode step stay free for it.
  int32_t reserved = 0;
  for (const SeqState& s : running)
    reserved += std::max(0, BlocksForTokens(s.num_computed + 1, limits.block_size) - s.num_blocks);
  int32_t available = free_blocks - reserved;
  int32_t budget = limits.token_budget;
  int32_t slots = limits.max_batch_size - static_cast<int32_t>(running.size());
  StepPlan plan;
  for (size_t j = 0; j < waiting.size(); ++j) {
    if (slots <= 0) break;
    const SeqState& s = waiting[j];
    const int32_t n = s.num_tokens - s.num_computed;  // the whole prompt, never a chunk
    if (n <= 0) continue;
    if (n > budget && !plan.scheduled.empty()) break;  // alone, it may exceed the budget
    const int32_t need = std::max(0, BlocksForTokens(s.num_tokens, limits.block_size) - s.num_blocks);
    if (need + s.cached_blocks > available) break;
    available -= need + s.cached_blocks;
    budget = std::max(0, budget - n);
    slots -= 1;
    plan.scheduled.push_back({true, j, n, need});
  }
  if (!plan.scheduled.empty()) return plan;
  return ScheduleStep(running, {}, limits, free_blocks);
}

StepPlan ScheduleEngineStep(std::span<const SeqState> running, std::span<const SeqState> waiting,
                            const StepLimits& limits, int32_t free_blocks) {
  return limits.policy == StepPolicy::kPrefillFirst
             ? SchedulePrefillFirstStep(running, waiting, limits, free_blocks)
             : ScheduleStep(running, waiting, limits, free_blocks);
}

}  // namespace tandem
