// The prefill instance's scheduler, as a plain function of its state (no model, no network).
//
// FCFS: requests are taken in arrival order; a request that does not fit stops the scan (no
// overtaking, so a long prompt is never starved). A batch holds at most token_budget new tokens
// and max_batch_size sequences. A prompt longer than what is left of the budget is cut into
// chunks (chunked prefill); a request gets the blocks for its whole prompt when its first chunk
// is scheduled, so a half-done prompt never waits for memory.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/engine/kv_cache.h"

namespace tandem {

struct PrefillLimits {
  int32_t token_budget = 2048;
  int32_t max_batch_size = 64;
  int32_t block_size = 16;
};

// One queued request, in arrival order.
struct PrefillItem {
  int32_t prompt_tokens = 0;
  int32_t num_computed = 0;  // prompt tokens whose KV is already in the cache
  int32_t num_blocks = 0;    // blocks it holds
  // A request not started yet may count, in num_computed and num_blocks, a prefix it will take
  // from the KV cache's published blocks when scheduled; of those, cached_blocks are owned by
  // nobody yet, so taking them uses up as many free blocks.
  int32_t cached_blocks = 0;
};

struct PrefillChunk {
  size_t index = 0;           // into the queue
  int32_t num_tokens = 0;     // new tokens this batch: [num_computed, num_computed + num_tokens)
  int32_t new_blocks = 0;     // blocks to allocate before running it
};


// The next prefill batch. Uses at most free_blocks new blocks. Empty when nothing fits.
std::vector<PrefillChunk> SchedulePrefill(std::span<const PrefillItem> queue,
                                          const PrefillLimits& limits, int32_t free_blocks);

}  // namespace tandem
