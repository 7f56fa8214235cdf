#include "common/engine/batch_sampling.h"

namespace tandem {

BatchSampling::BatchSampling(int threads, int32_t vocab_size)
    : thread_edits_(threads), threads_(threads) {
  workspaces_.reserve(threads);
  for (int t = 0; t < threads; ++t) workspaces_.emplace_back(vocab_size);
}

void BatchSampling::AppendScoreEdits(std::span<const EditJob> jobs, size_t rows,
                                     std::vector<ScoreEdit>* edits,
                                     std::vector<int32_t>* edit_begin) {
  const size_t n = jobs.size(), t = workspaces_.size();
  for (size_t k = 0; k < n; ++k)
    TANDEM_CHECK(jobs[k].row < rows && (k == 0 || jobs[k - 1].row < jobs[k].row),
                 "BatchSampling: edit jobs out of row order");
  // Job k runs on thread k % t, which appends its edits to its own list; job_end_[k] is where
  // they end there.
  job_end_.assign(n, 0);
  auto build = [&](int thread) {
    std::vector<ScoreEdit>& out = thread_edits_[thread];
    out.clear();
    for (size_t k = static_cast<size_t>(thread); k < n; k += t) {
      jobs[k].sampler->AppendScoreEdits(jobs[k].tokens, &out, workspaces_[thread]);
      job_end_[k] = out.size();
    }
  };
  if (n < 2 || t == 1) {  // not worth waking the threads: each thread's share here, in turn
    for (size_t thread = 0; thread < t; ++thread) build(static_cast<int>(thread));
  } else {
    threads_.Run(build);
  }
  // In row order: job k's edits are its thread's list from the end of that thread's previous
  // job (k - t) to job_end_[k].
  edits->clear();
  edit_begin->assign(rows + 1, 0);
  size_t k = 0;
  for (size_t row = 0; row < rows; ++row) {
    if (k < n && jobs[k].row == row) {
      const std::vector<ScoreEdit>& from = thread_edits_[k % t];
      const size_t begin = k < t ? 0 : job_end_[k - t];
      edits->insert(edits->end(), from.begin() + begin, from.begin() + job_end_[k]);
      ++k;
    }
    (*edit_begin)[row + 1] = static_cast<int32_t>(edits->size());
  }
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
