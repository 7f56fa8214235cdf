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
// Threads: Run is called by one thread at a time (the engine thread).
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

  int threads() const { return threads_.degree(); }

 private:
  std::vector<SamplerWorkspace> workspaces_;  // one per thread
  RankThreads threads_;
};

}  // namespace tandem
