// Continuous batching of one engine step, as plain functions of state (no model, no network):
// used by the colocated instance and by the decode instance (decode steps, plus recomputation of
// preempted requests). Two policies (colocated.scheduling in the config):
//
// ScheduleStep (chunked, the default; vLLM today): prefill chunks and decode steps in one batch.
// A sequence has num_tokens tokens (prompt + generated so far) of which num_computed have their
// KV in the cache; a step computes the next min(num_tokens - num_computed, budget left) of them
// (1 for a sequence that is decoding). Running sequences go first, oldest first. When the pool
// cannot hold a running sequence's new tokens, the YOUNGEST running sequences not yet scheduled
// are preempted (recompute: their blocks are freed and they return to the front of the waiting
// queue), down to the sequence itself. Waiting sequences are admitted FCFS only in a step that
// preempted nobody, while budget, batch slots and blocks last.
//
// SchedulePrefillFirstStep (prefill_first; vLLM as of 2023, the baseline DistServe measured
// against): when waiting sequences fit, the step runs only their WHOLE prompts (never chunked;
// a preempted sequence recomputes its prompt + generated tokens), FCFS, while the token budget,
// the batch slots (running + admitted <= max_batch_size) and the blocks last; every running
// sequence is paused for that step. The first waiting sequence is admitted even when it is
// larger than the budget (it then runs alone): vLLM rejected such prompts, but it also required
// budget >= max_model_len, and the router already caps prompts by max_model_len, so nothing is
// lost. Admission leaves free the blocks the running sequences need for their next decode
// token, so that the decode step that follows does not preempt what was just admitted (vLLM
// kept a 1% block watermark for the same purpose). When nothing waits, or the first waiting
// sequence does not fit, the step is a decode step of the running sequences exactly as
// ScheduleStep does it with nothing waiting, preemption included (youngest first, recompute;
// the victims wait at the front of the queue and come back through a prompt step).
//
// Both plan only blocks that are free; a plan never mixes preemption and admission.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tandem {

enum class StepPolicy { kChunked, kPrefillFirst };

// The policy named by an instance section's `scheduling` value (validated by the config
// loader: "chunked" | "prefill_first").
StepPolicy StepPolicyFromConfig(const std::string& scheduling);

struct StepLimits {
  int32_t token_budget = 2048;
  int32_t max_batch_size = 64;
  int32_t block_size = 16;
  StepPolicy policy = StepPolicy::kChunked;  // read by ScheduleEngineStep only
};

struct SeqState {
  int32_t num_tokens = 0;
  int32_t num_computed = 0;
  int32_t num_blocks = 0;
  // Of num_blocks, those other requests hold too (a shared prefix): preempting this one does
  // not free them.
  int32_t shared_blocks = 0;
  // A waiting sequence's num_blocks may be a prefix it will take from the KV cache's published
  // blocks when admitted (num_computed covers them); of those, cached_blocks are owned by
  // nobody yet, so taking them uses up as many free blocks.
  int32_t cached_blocks = 0;
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

StepPlan SchedulePrefillFirstStep(std::span<const SeqState> running,
                                  std::span<const SeqState> waiting, const StepLimits& limits,
                                  int32_t free_blocks);

// The step of limits.policy: what the engine (decode/batch_engine.h) and the simulator call.
StepPlan ScheduleEngineStep(std::span<const SeqState> running, std::span<const SeqState> waiting,
                            const StepLimits& limits, int32_t free_blocks);

}  // namespace tandem
