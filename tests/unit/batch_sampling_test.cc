// BatchSampling: a step's rows sampled on several threads give exactly what one thread gives.
#include "common/engine/batch_sampling.h"

#include <memory>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

namespace tandem {
namespace {

TEST_CASE("BatchSampling on several threads equals one thread, row for row", "[sampling]") {
  constexpr int32_t kVocab = 3000;
  constexpr int kRows = 37;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<std::vector<float>> logits(kRows, std::vector<float>(kVocab));
  for (auto& row : logits)
    for (float& v : row) v = normal(rng);
  std::vector<std::vector<int32_t>> tokens(kRows);
  for (int i = 0; i < kRows; ++i)
    for (int k = 0; k < 5 + i % 7; ++k) tokens[i].push_back((i * 131 + k * 17) % kVocab);
  // A mix of settings, each row its own seeded sampler.
  auto params = [](int i) {
    SamplingParams p;
    p.seed = 1000 + i;
    p.temperature = i % 5 == 0 ? 0.0f : 0.5f + 0.1f * (i % 4);
    p.top_k = i % 3 == 0 ? 40 : 0;
    p.top_p = i % 2 == 0 ? 0.9f : 1.0f;
    p.repetition_penalty = i % 4 == 1 ? 1.2f : 1.0f;
    p.logprobs = i % 6 == 2;
    p.top_logprobs = p.logprobs ? 3 : 0;
    return p;
  };
  auto run = [&](int threads) {
    SamplerWorkspace shared(kVocab);
    std::vector<std::unique_ptr<Sampler>> samplers;
    std::vector<BatchSampling::Job> jobs;
    for (int i = 0; i < kRows; ++i) {
      samplers.push_back(std::make_unique<Sampler>(params(i), &shared, 3));
      jobs.push_back({samplers.back().get(), logits[i], tokens[i]});
    }
    BatchSampling sampling(threads, kVocab);
    CHECK(sampling.threads() == threads);
    std::vector<SampleResult> results(kRows);
    sampling.Run(jobs, results);
    return results;
  };
  const std::vector<SampleResult> one = run(1);
  for (int threads : {2, 4}) {
    const std::vector<SampleResult> many = run(threads);
    for (int i = 0; i < kRows; ++i) {
      INFO("row " << i << ", " << threads << " threads");
      CHECK(many[i].token_id == one[i].token_id);
      CHECK(many[i].logprob == one[i].logprob);
      CHECK(many[i].num_top_logprobs == one[i].num_top_logprobs);
    }
  }
}

TEST_CASE("BatchSampling builds score edits on several threads as one thread does, in row order",
          "[sampling]") {
  const int32_t vocab = 500;
  const size_t rows = 13;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  SamplerWorkspace shared(vocab);
  std::vector<std::unique_ptr<Sampler>> samplers;
  std::vector<std::vector<int32_t>> tokens(rows);
  std::vector<BatchSampling::EditJob> jobs;
  std::vector<ScoreEdit> want;  // row by row, on this thread
  std::vector<int32_t> want_begin = {0};
  for (size_t i = 0; i < rows; ++i) {
    SamplingParams p;
    p.repetition_penalty = 1.0f + 0.05f * (i % 5);
    p.presence_penalty = i % 3 == 0 ? 0.4f : 0.0f;
    p.frequency_penalty = i % 4 == 1 ? -0.3f : 0.0f;
    if (i % 6 == 2) p.logit_bias = {{token(rng), 2.0f}};
    for (size_t k = 0; k < 10 + 40 * (i % 4); ++k) tokens[i].push_back(token(rng));
    samplers.push_back(std::make_unique<Sampler>(p, &shared, 5));
    if (i % 5 != 3) {  // some rows have no job: no edits
      jobs.push_back({samplers.back().get(), tokens[i], i});
      samplers.back()->AppendScoreEdits(tokens[i], &want);
    }
    want_begin.push_back(static_cast<int32_t>(want.size()));
  }
  REQUIRE(want.size() > 100);
  for (int threads : {1, 2, 3}) {
    INFO(threads << " threads");
    BatchSampling sampling(threads, vocab);
    std::vector<ScoreEdit> got = {{.token_id = 7}};  // cleared first
    std::vector<int32_t> begin;
    for (int repeat = 0; repeat < 2; ++repeat) {  // the per-thread lists are reused
      sampling.AppendScoreEdits(jobs, rows, &got, &begin);
      CHECK(begin == want_begin);
      REQUIRE(got.size() == want.size());
      for (size_t e = 0; e < want.size(); ++e) {
        CHECK(got[e].token_id == want[e].token_id);
        CHECK(got[e].flags == want[e].flags);
        CHECK(got[e].subtract == want[e].subtract);
      }
    }
  }
}

}  // namespace
}  // namespace tandem
