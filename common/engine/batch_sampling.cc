#include "common/engine/batch_sampling.h"

namespace tandem {

BatchSampling::BatchSampling(int threads, int32_t vocab_size) : threads_(threads) {
  workspaces_.reserve(threads);
  for (int t = 0; t < threads; ++t) workspaces_.emplace_back(vocab_size);
}

void BatchSampling::Run(std::span<const Job> jobs, std::span<SampleResult> results) {
  TANDEM_CHECK(results.size() == jobs.size(), "BatchSampling: one result per job");
  const size_t n = jobs.size();
  auto run = [&](int thread) {
    // Interleaved: rows of one step cost about the same.
    for (size_t k = static_cast<size_t>(thread); k < n; k += workspaces_.size())
      results[k] = jobs[k].sampler->Sample(jobs[k].logits, jobs[k].tokens, workspaces_[thread]);
  };
  if (n < 2 || workspaces_.size() == 1) {
    for (size_t k = 0; k < n; ++k)
      results[k] = jobs[k].sampler->Sample(jobs[k].logits, jobs[k].tokens, workspaces_[0]);
    return;
  }
  threads_.Run(run);
}

}  // namespace tandem
