// The decode instance's admission of pulled requests, as a plain function of state.
//
// A request announced by KvReady waits in the pull queue (FCFS) until the instance can take it:
// a free batch slot, blocks for prompt + 1 tokens, and KV usage below the watermark. That wait is
// the back-pressure on prefill (which keeps holding the KV meanwhile). Step scheduling and
// preemption of running requests: decode/colocated_scheduler.h.
#pragma once

#include <cstdint>
#include <span>

#include "common/engine/kv_cache.h"
#include "decode/colocated_scheduler.h"

namespace tandem {

struct PullLimits {
  int32_t total_blocks = 0;
  double kv_usage_watermark = 0.95;  // admit only while used/total is below this
  int32_t max_batch_size = 64;       // requests running + being pulled
};

// Blocks a pulled request needs: its prompt and the first token.
inline int32_t BlocksForPull(int32_t prompt_tokens, int32_t block_size) {
  return BlocksForTokens(int64_t{prompt_tokens} + 1, block_size);
}

// How many requests at the front of the pull queue to admit now. blocks_needed: per queued
// request, in order. active: requests already running or being pulled.
size_t AdmitPulls(std::span<const int32_t> blocks_needed, const PullLimits& limits,
                  int32_t free_blocks, int32_t active);

}  // namespace tandem
