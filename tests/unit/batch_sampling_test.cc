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

}  // namespace
}  // namespace tandem
