// The host sampling of one engine step, over several threads: each row that needs the Sampler
// (not a plain argmax, GreedyRows) is sampled on one of `threads` threads (the calling thread is
// one), each with its own SamplerWorkspace. Rows are independent (a Sampler belongs to one
// request and its draw depends only on its seed and tokens), so the results are the same as
// one thread's, in any order; the engine then emits them in row order, on its own thread.
//
// Why: sampling a row costs 0.06 ms (greedy) to 1.4 ms (top-p) at a 49k vocabulary on one core
// (perf/README.md, Host sampling); a GPU decode step of 64 rows is well under that total, so a
// step's sampling is spread over the host's cores (S.threads).
//
// The rows a device picks itself still need their score edits built on the host (logit_bias,
// penalties: Sampler::AppendScoreEdits, a walk over the request's tokens: 0.3 ms a row at a 32k
// prompt under repetition_penalty), and AppendScoreEdits spreads those over the same threads.
//
// Threads: Run and AppendScoreEdits are called by one thread at a time (the engine thread).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/engine/rank_threads.h"
#include "common/engine/sampling.h"

namespace tandem {

class BatchSampling {
 public:
  // threads >= 1; vocab_size: the model's.
  BatchSampling(int threads, int32_t vocab_size);

  struct Job {
    Sampler* sampler = nullptr;
    std::span<const float> logits;           // [vocab]
    std::span<const int32_t> tokens;         // prompt and output so far
  };
  // results[k] = jobs[k].sampler->Sample(jobs[k].logits, jobs[k].tokens); returns when all are
  // done. A job's sampler is used by one thread only.
  void Run(std::span<const Job> jobs, std::span<SampleResult> results);

  struct EditJob {
    const Sampler* sampler = nullptr;
    std::span<const int32_t> tokens;  // prompt and output so far
    size_t row = 0;                   // the batch row whose edits these are
  };
  // Builds every job's score edits (jobs[k].sampler->AppendScoreEdits(jobs[k].tokens)) on the
  // threads and writes them in row order into *edits (cleared first), with *edit_begin =
  // [rows + 1] offsets (GreedyRows::edit_begin); rows without a job get none. Jobs must be in
  // increasing row order, rows < `rows`. The same result as one thread's.
  void AppendScoreEdits(std::span<const EditJob> jobs, size_t rows,
                        std::vector<ScoreEdit>* edits, std::vector<int32_t>* edit_begin);

  int threads() const { return threads_.degree(); }

 private:
  std::vector<SamplerWorkspace> workspaces_;  // one per thread
  std::vector<std::vector<ScoreEdit>> thread_edits_;  // AppendScoreEdits: one per thread
  std::vector<size_t> job_end_;  // AppendScoreEdits: per job, its end in its thread's list
  RankThreads threads_;
};

}  // namespace tandem
