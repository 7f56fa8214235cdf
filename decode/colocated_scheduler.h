// Continuous batching of one engine step, as a plain function of state (no model, no network):
// used by the colocated instance (prefill chunks and decode steps in one batch, vLLM-style) and
// by the decode instance (decode steps, plus recomputation of preempted requests).
//
// A sequence has num_tokens tokens (prompt + generated so far) of which num_computed have their
// KV in the cache; a step computes the next min(num_tokens - num_computed, budget left) of them
// (1 for a sequence that is decoding). Running sequences go first, oldest first. When the pool
// cannot hold a running sequence's new tokens, the YOUNGEST running sequences not yet scheduled
// are preempted (recompute: their blocks are freed and they return to the front of the waiting
// queue), down to the sequence itself. Waiting sequences are admitted FCFS only in a step that
// preempted nobody, while budget, batch slots and blocks last.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tandem {

struct StepLimits {
  int32_t token_budget = 2048;
  int32_t max_batch_size = 64;
  int32_t block_size = 16;
};

struct SeqState {
  int32_t num_tokens = 0;
  int32_t num_computed = 0;
  int32_t num_blocks = 0;
};

struct ScheduledSeq {
  bool from_waiting = false;
  size_t index = 0;           // into running or waiting
  int32_t num_tokens = 0;     // new tokens this step
  int32_t new_blocks = 0;     // blocks to allocate first
};

struct StepPlan {
  std::vector<ScheduledSeq> scheduled;  // running first (in order), then admitted waiting
  std::vector<size_t> preempted;        // indices into running, youngest first
};

StepPlan ScheduleStep(std::span<const SeqState> running, std::span<const SeqState> waiting,
                      const StepLimits& limits, int32_t free_blocks);

}  // namespace tandem
