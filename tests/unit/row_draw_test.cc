// DrawRow (common/engine/row_draw.h): the device draw's algorithm, on the host, against the
// Sampler it stands in for.
#include "common/engine/row_draw.h"

#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/engine/sampling.h"

namespace tandem {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Sampler::Sample's token and DrawRow's for `params` (seeded) at output position `position`,
// over `logits`. The prompt is one token.
std::pair<int32_t, int32_t> BothTokens(const std::vector<float>& logits, SamplingParams params,
                                       uint64_t seed, size_t position) {
  params.seed = seed;
  Sampler sampler(params, static_cast<int32_t>(logits.size()), 1);
  const std::vector<int32_t> tokens(1 + position, 0);
  const std::optional<RowDraw> draw = sampler.NextRowDraw(tokens);
  REQUIRE(draw.has_value());
  const int32_t drawn = DrawRow(logits, *draw);
  return {sampler.Sample(logits, tokens).token_id, drawn};
}

std::string Describe(const SamplingParams& p) {
  return "temperature " + std::to_string(p.temperature) + ", top_k " + std::to_string(p.top_k) +
         ", top_p " + std::to_string(p.top_p) + ", min_p " + std::to_string(p.min_p);
}

TEST_CASE("DrawRow picks the Sampler's token for every warper mix", "[sampling]") {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int> small(0, 3);
  int checked = 0, mismatched = 0;
  std::string first_mismatches;
  for (int32_t vocab : {7, 300, 5000}) {
    for (int shape = 0; shape < 3; ++shape) {
      // 0: peaked random (a model's), 1: few distinct values (ties everywhere), 2: random with
      // masked entries (-inf, NaN), as logit_bias or a broken row leaves them.
      std::vector<float> logits(vocab);
      for (float& v : logits) v = shape == 1 ? static_cast<float>(small(rng)) : normal(rng);
      if (shape == 2)
        for (int32_t i = 0; i < vocab; i += 3) logits[i] = i % 2 ? -kInf : std::nanf("");
      for (float temperature : {0.3f, 1.0f, 1.7f})
        for (int32_t top_k : {0, 1, 3, 50, vocab})
          for (float top_p : {1.0f, 0.95f, 0.5f, 0.05f})
            for (float min_p : {0.0f, 0.1f}) {
              SamplingParams p;
              p.temperature = temperature;
              p.top_k = top_k;
              p.top_p = top_p;
              p.min_p = min_p;
              for (uint64_t seed = 1; seed <= 4; ++seed) {
                const auto [sampled, drawn] = BothTokens(logits, p, seed * 977 + vocab, seed);
                ++checked;
                if (sampled != drawn) {
                  if (++mismatched <= 10)
                    first_mismatches += "vocab " + std::to_string(vocab) + ", shape " +
                                        std::to_string(shape) + ", " + Describe(p) + ", seed " +
                                        std::to_string(seed) + ": Sampler " +
                                        std::to_string(sampled) + ", DrawRow " +
                                        std::to_string(drawn) + "\n";
                }
              }
            }
    }
  }
  CHECK(checked == 3 * 3 * 3 * 5 * 4 * 2 * 4);
  INFO(first_mismatches);
  CHECK(mismatched == 0);
}

TEST_CASE("DrawRow's logprobs are the Sampler's raw logprobs", "[sampling]") {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int32_t vocab : {5, 3000}) {
    std::vector<float> logits(vocab);
    for (float& v : logits) v = normal(rng);
    logits[vocab / 2] = -kInf;  // masked: -inf logprob, last in the top list
    logits[1] = logits[2];      // a tie: the lower id first
    for (int32_t top : {0, 1, 5, 20}) {
      SamplingParams p;
      p.temperature = 0.7f;
      p.top_p = 0.9f;
      p.logprobs = true;
      p.top_logprobs = top;
      p.seed = 100 + top;
      Sampler sampler(p, vocab, 1);
      const std::vector<int32_t> tokens = {0};
      const std::optional<RowDraw> draw = sampler.NextRowDraw(tokens);
      REQUIRE(draw.has_value());
      CHECK(draw->top_logprobs == top);
      RowLogprobs got;
      const int32_t token = DrawRow(logits, *draw, &got);
      const SampleResult want = sampler.Sample(logits, tokens);
      const SampleResult drawn = DrawnSample(token, *draw, got);
      INFO("vocab " << vocab << ", top " << top);
      CHECK(drawn.token_id == want.token_id);
      CHECK(drawn.logprob == Approx(want.logprob).margin(1e-6));
      REQUIRE(drawn.num_top_logprobs == want.num_top_logprobs);
      CHECK(drawn.num_top_logprobs == std::min(top, vocab));
      for (int32_t j = 0; j < want.num_top_logprobs; ++j) {
        CHECK(drawn.top_logprobs[j].token_id == want.top_logprobs[j].token_id);
        CHECK(drawn.top_logprobs[j].logprob == Approx(want.top_logprobs[j].logprob).margin(1e-6));
      }
    }
  }
  // Greedy with logprobs: the argmax (ArgmaxRow's tie rule) and the same logprobs.
  std::vector<float> tied = {1.0f, 3.0f, -kInf, 3.0f, std::nanf(""), 2.0f};
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.logprobs = true;
  greedy.top_logprobs = 3;
  Sampler greedy_sampler(greedy, 6, 1);
  const std::vector<int32_t> one = {0};
  const std::optional<RowDraw> argmax = greedy_sampler.NextRowDraw(one);
  REQUIRE(argmax.has_value());
  RowLogprobs got;
  const int32_t token = DrawRow(tied, *argmax, &got);
  CHECK(token == 1);
  const SampleResult want = greedy_sampler.Sample(tied, one);
  const SampleResult drawn = DrawnSample(token, *argmax, got);
  CHECK(drawn.token_id == want.token_id);
  CHECK(drawn.logprob == Approx(want.logprob).margin(1e-6));
  REQUIRE(drawn.num_top_logprobs == 3);
  for (int32_t j = 0; j < 3; ++j)
    CHECK(drawn.top_logprobs[j].token_id == want.top_logprobs[j].token_id);
  std::vector<float> nothing = {-kInf, std::nanf("")};
  CHECK(DrawRow(nothing, *argmax, &got) == -1);

  // The processed distribution's logprobs stay on the host.
  SamplingParams processed;
  processed.logprobs = true;
  processed.logprobs_mode = LogprobsMode::kProcessed;
  CHECK_FALSE(Sampler(processed, 10, 1).NextRowDraw(std::vector<int32_t>{0}).has_value());
}

TEST_CASE("DrawRow's draw follows the distribution, in the Sampler's order", "[sampling]") {
  // Four tokens of probabilities 0.1, 0.2, 0.3, 0.4 (by id): without top-p the walk is by id,
  // so u in [0, 0.1) is token 0 and u in [0.6, 1) token 3; with top-p the walk is most likely
  // first, so u in [0, 0.4) is token 3.
  std::vector<float> logits;
  for (double p : {0.1, 0.2, 0.3, 0.4}) logits.push_back(static_cast<float>(std::log(p)));
  RowDraw draw;
  draw.draw = 1;
  auto at = [&](const std::vector<float>& row, double u) {
    draw.u = u;
    return DrawRow(row, draw);
  };
  CHECK(at(logits, 0.05) == 0);
  CHECK(at(logits, 0.65) == 3);
  draw.top_p = 0.999f;  // cuts nothing, but walks most likely first
  CHECK(at(logits, 0.05) == 3);
  CHECK(at(logits, 0.65) == 2);
  draw.top_p = 0.5f;  // keeps 0.4 and 0.3 (0.4 < 0.5): renormalised 4/7, 3/7
  CHECK(at(logits, 0.56) == 3);
  CHECK(at(logits, 0.58) == 2);
  draw.top_p = 1.0f;
  draw.top_k = 1;  // the argmax whatever u
  CHECK(at(logits, 0.99) == 3);
  draw.top_k = 0;
  draw.min_p = 0.7f;  // keeps p >= 0.28: tokens 2, 3, by id
  CHECK(at(logits, 0.3) == 2);
  CHECK(at(logits, 0.5) == 3);
  // An overflowed row (+inf scores): the +inf tokens share it, the others weigh nothing.
  const std::vector<float> overflowed = {1.0f, kInf, 3.0f, kInf};
  draw = RowDraw{};
  draw.draw = 1;
  CHECK(at(overflowed, 0.2) == 1);
  CHECK(at(overflowed, 0.7) == 3);
  draw.top_p = 0.9f;
  draw.min_p = 0.5f;
  CHECK(at(overflowed, 0.7) == 3);
  // Nothing usable: -1 (the engine's "no finite logit").
  const std::vector<float> masked = {-kInf, std::nanf(""), -kInf};
  CHECK(DrawRow(masked, draw) == -1);
}

TEST_CASE("a tiny temperature samples greedily instead of overflowing", "[sampling]") {
  // logit / 1e-30 is -inf for every negative logit: the Sampler would find nothing to sample
  // (and abort the engine); below 1e-5 it is the argmax, as vLLM does.
  const std::vector<float> negative = {-3.0f, -0.5f, -2.0f, -0.5f};
  SamplingParams p;
  p.temperature = 1e-30f;
  p.seed = 1;
  CHECK(p.greedy());
  Sampler sampler(p, 4, 1);
  const std::vector<int32_t> tokens = {0};
  CHECK(sampler.Sample(negative, tokens).token_id == 1);  // the argmax, lowest id on the tie
  CHECK_FALSE(sampler.NextRowDraw(tokens).has_value());    // the argmax path, not a draw
  CHECK(Sampler::IsPlainArgmax(p, 0));
  p.temperature = 1e-5f;
  CHECK_FALSE(p.greedy());
}

TEST_CASE("NextRowDraw describes only rows that need nothing but the logits", "[sampling]") {
  const std::vector<int32_t> tokens = {5, 6, 7};  // a prompt of 2, one token out
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = 40;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  p.seed = 11;
  const std::optional<RowDraw> draw = Sampler(p, 100, 2).NextRowDraw(tokens);
  REQUIRE(draw.has_value());
  CHECK(draw->draw == 1);
  CHECK(draw->temperature == 0.7f);
  CHECK(draw->top_k == 40);
  CHECK(draw->top_p == 0.9f);
  CHECK(draw->min_p == 0.05f);
  CHECK(draw->u >= 0.0);
  CHECK(draw->u < 1.0);
  // The uniform is the position's: the next position draws another.
  const std::vector<int32_t> longer = {5, 6, 7, 8};
  CHECK(Sampler(p, 100, 2).NextRowDraw(longer)->u != draw->u);
  CHECK(Sampler(p, 100, 2).NextRowDraw(tokens)->u == draw->u);

  auto none = [&](SamplingParams q) { return !Sampler(q, 100, 2).NextRowDraw(tokens); };
  SamplingParams q = p;
  q.temperature = 0;
  CHECK(none(q));  // greedy: the argmax path
  q = p;
  q.logit_bias = {{3, 1.0f}};
  CHECK(none(q));
  q = p;
  q.repetition_penalty = 1.1f;
  CHECK(none(q));
  q = p;
  q.presence_penalty = 0.5f;
  CHECK(none(q));
  q = p;
  q.frequency_penalty = -0.5f;
  CHECK(none(q));
  q = p;
  q.logprobs = true;  // raw logprobs: drawn with them
  CHECK(Sampler(q, 100, 2).NextRowDraw(tokens)->top_logprobs == 0);
  CHECK(draw->top_logprobs == -1);
  q.temperature = 0;  // greedy with raw logprobs: the argmax, with its logprobs
  q.top_logprobs = 4;
  const std::optional<RowDraw> argmax = Sampler(q, 100, 2).NextRowDraw(tokens);
  REQUIRE(argmax.has_value());
  CHECK(argmax->draw == kRowArgmax);
  CHECK(argmax->top_logprobs == 4);
  q.repetition_penalty = 1.1f;  // and edits: the host's (raw logprobs need unedited logits)
  CHECK(none(q));
  // min_tokens masks eos until then: the Sampler's own; after it, a draw again.
  q = p;
  q.min_tokens = 2;
  const std::vector<int32_t> eos = {9};
  CHECK(!Sampler(q, 100, 2, eos).NextRowDraw(tokens));
  CHECK(Sampler(q, 100, 2, eos).NextRowDraw(longer).has_value());
}

}  // namespace
}  // namespace tandem
