#include "prefill/prefill_scheduler.h"

#include <algorithm>

namespace tandem {

std::vector<PrefillChunk> SchedulePrefill(std::span<const PrefillItem> queue,
                                          const PrefillLimits& limits, int32_t free_blocks) {
  std::vector<PrefillChunk> batch;
  int32_t budget = limits.token_budget;
  for (size_t i = 0; i < queue.size(); ++i) {
    if (budget <= 0 || static_cast<int32_t>(batch.size()) >= limits.max_batch_size) break;
    const PrefillItem& item = queue[i];
    const int32_t remaining = item.prompt_tokens - item.num_computed;
    if (remaining <= 0) continue;
    const int32_t need =
        std::max(0, BlocksForTokens(item.prompt_tokens, limits.block_size) - item.num_blocks);
    // FCFS: nobody overtakes a request waiting for memory.
    if (need + item.cached_blocks > free_blocks) break;
    const int32_t n = std::min(remaining, budget);
    free_blocks -= need + item.cached_blocks;
    budget -= n;
    batch.push_back({i, n, need});
  }
  return batch;
}

}  // namespace tandem
