// Score edits (common/engine/score_edits.h): the Sampler's logit_bias, min_tokens mask and
// penalties as a per-token list that a backend applies where the logits are, so that rows with
// them are picked there too (Sampler::NextPickedByBackend).
#include "common/engine/score_edits.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/engine/row_draw.h"
#include "common/engine/sampling.h"

namespace tandem {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST_CASE("score edits apply bias, mask, repetition and subtraction in the Sampler's order",
          "[sampling]") {
  std::vector<float> row = {2.0f, -1.0f, 3.0f, 0.5f, -kInf};
  const std::vector<ScoreEdit> edits = {
      // 2 + 2 = 4, / 2 = 2, - 0.5 = 1.5
      {.token_id = 0, .flags = kEditBias | kEditRepetition | kEditSubtract, .bias = 2.0f,
       .repetition = 2.0f, .subtract = 0.5f},
      // negative: times the penalty
      {.token_id = 1, .flags = kEditRepetition, .repetition = 2.0f},
      // masked: another token stays usable, so -inf, and the penalties keep it there
      {.token_id = 2, .flags = kEditMask | kEditSubtract, .subtract = -1.0f},
  };
  REQUIRE(ApplyScoreEdits(row, edits).ok());
  CHECK(row[0] == 1.5f);
  CHECK(row[1] == -2.0f);
  CHECK(row[2] == -kInf);
  CHECK(row[3] == 0.5f);   // untouched
  CHECK(row[4] == -kInf);  // untouched

  // The mask holds only while a token outside it stays usable, counted after the biases.
  std::vector<float> lone = {1.0f, -kInf, std::nanf("")};
  const std::vector<ScoreEdit> mask_only = {{.token_id = 0, .flags = kEditMask}};
  REQUIRE(ApplyScoreEdits(lone, mask_only).ok());
  CHECK(lone[0] == 1.0f);  // the only usable token: not masked
  std::vector<float> two = {1.0f, 0.0f};
  REQUIRE(ApplyScoreEdits(two, mask_only).ok());
  CHECK(two[0] == -kInf);
  CHECK(two[1] == 0.0f);

  // An id outside the row changes nothing and names the token.
  std::vector<float> kept = {1.0f, 2.0f};
  const std::vector<ScoreEdit> outside = {{.token_id = 0, .flags = kEditBias, .bias = 1.0f},
                                          {.token_id = 2, .flags = kEditBias, .bias = 1.0f}};
  const Status refused = ApplyScoreEdits(kept, outside);
  CHECK(refused.message() == "score edit for token 2 outside a row of 2");
  CHECK(kept[0] == 1.0f);
}

TEST_CASE("score edit offsets are checked against the batch and the vocabulary", "[sampling]") {
  const std::vector<ScoreEdit> edits = {{.token_id = 3}, {.token_id = 9}};
  const std::vector<int32_t> good = {0, 1, 1, 2};
  CHECK(ValidateScoreEdits(edits, good, 3, 10).ok());
  CHECK(ValidateScoreEdits({}, {}, 3, 10).ok());
  CHECK(ValidateScoreEdits(edits, {}, 3, 10).message() ==
        "score edits without their rows' offsets");
  CHECK(ValidateScoreEdits(edits, good, 2, 10).message() ==
        "score edit offsets do not match the batch");
  const std::vector<int32_t> past_end = {0, 1, 1, 3};
  CHECK(ValidateScoreEdits(edits, past_end, 3, 10).message() ==
        "score edit offsets do not match the batch");
  const std::vector<int32_t> decreasing = {0, 2, 1, 2};
  CHECK(ValidateScoreEdits(edits, decreasing, 3, 10).message() == "score edit offsets decrease");
  CHECK(ValidateScoreEdits(edits, good, 3, 9).message() ==
        "score edit for token 9 outside the vocabulary of 9");
}

// A random request with edits: some logit_bias, penalties, a min_tokens mask, greedy or
// warped, never logprobs.
SamplingParams RandomEditedParams(std::mt19937& rng, int32_t vocab) {
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  SamplingParams p;
  p.temperature = unit(rng) < 0.3f ? 0.0f : 0.3f + 1.4f * unit(rng);
  p.top_k = unit(rng) < 0.5f ? 0 : 1 + static_cast<int32_t>(unit(rng) * 60);
  p.top_p = unit(rng) < 0.5f ? 1.0f : 0.05f + 0.95f * unit(rng);
  p.min_p = unit(rng) < 0.7f ? 0.0f : 0.2f * unit(rng);
  if (unit(rng) < 0.5f) p.repetition_penalty = 0.5f + 1.4f * unit(rng);
  if (unit(rng) < 0.5f) p.presence_penalty = -2.0f + 4.0f * unit(rng);
  if (unit(rng) < 0.5f) p.frequency_penalty = -2.0f + 4.0f * unit(rng);
  if (unit(rng) < 0.4f) {
    for (int32_t n = 1 + static_cast<int32_t>(unit(rng) * 5); n > 0; --n) {
      const int32_t t = token(rng);
      bool listed = false;
      for (const TokenBias& b : p.logit_bias) listed = listed || b.token_id == t;
      if (!listed) p.logit_bias.push_back({t, -100.0f + 200.0f * unit(rng)});
    }
  }
  if (unit(rng) < 0.4f) {
    p.min_tokens = 1 + static_cast<int32_t>(unit(rng) * 8);
    p.stop_token_ids = {token(rng), token(rng)};  // a repeat too, sometimes: listed once
  }
  return p;
}

TEST_CASE("a backend that applies score edits picks the Sampler's token", "[sampling]") {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int> small(0, 3);
  int checked = 0, edited_rows = 0, drawn_rows = 0, mismatched = 0;
  std::string first_mismatches;
  for (int32_t vocab : {7, 300, 5000}) {
    std::uniform_int_distribution<int32_t> token(0, vocab - 1);
    const std::vector<int32_t> eos = {vocab - 1};
    for (int round = 0; round < 150; ++round) {
      const int shape = round % 3;  // peaked; ties; masked entries (-inf, NaN)
      std::vector<float> logits(vocab);
      for (float& v : logits) v = shape == 1 ? static_cast<float>(small(rng)) : normal(rng);
      if (shape == 2)
        for (int32_t i = 0; i < vocab; i += 3) logits[i] = i % 2 ? -kInf : std::nanf("");
      SamplingParams params = RandomEditedParams(rng, vocab);
      params.seed = 1000 + round;
      const size_t num_prompt = 1 + rng() % 12, num_output = rng() % 10;
      std::vector<int32_t> tokens(num_prompt + num_output);
      for (int32_t& t : tokens) t = rng() % 4 == 0 ? tokens[0] : token(rng);  // repeats

      Sampler sampler(params, vocab, num_prompt, eos);
      RowDraw draw;
      std::vector<ScoreEdit> edits = {{.token_id = 0}};  // another row's: appended after
      const bool picked = sampler.NextPickedByBackend(tokens, true, &draw, &edits);
      REQUIRE(picked);  // no logprobs: every such row is the backend's
      REQUIRE(edits[0].token_id == 0);
      const std::span<const ScoreEdit> own = std::span(edits).subspan(1);
      std::vector<float> row = logits;
      REQUIRE(ApplyScoreEdits(row, own).ok());
      const int32_t picked_token = draw.draw ? DrawRow(row, draw) : ArgmaxRow(row);
      const int32_t sampled = sampler.Sample(logits, tokens).token_id;
      ++checked;
      edited_rows += !own.empty();
      drawn_rows += draw.draw;
      if (picked_token != sampled && ++mismatched <= 10)
        first_mismatches += "vocab " + std::to_string(vocab) + ", round " +
                            std::to_string(round) + ": Sampler " + std::to_string(sampled) +
                            ", backend " + std::to_string(picked_token) + "\n";
    }
  }
  CHECK(checked == 450);
  CHECK(edited_rows > 300);  // most rows carry edits; a few draw or argmax plainly
  CHECK(drawn_rows > 200);
  INFO(first_mismatches);
  CHECK(mismatched == 0);
}

TEST_CASE("the Sampler's scores are the logits with its score edits applied", "[sampling]") {
  // The edits the Sampler builds hold the request's numbers, and applying them gives each
  // step's float, bit for bit.
  const int32_t vocab = 50;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(vocab);
  for (float& v : logits) v = normal(rng);
  SamplingParams p;
  p.temperature = 0.0f;
  p.repetition_penalty = 1.3f;
  p.presence_penalty = 0.7f;
  p.frequency_penalty = -0.4f;
  p.logit_bias = {{7, 3.5f}, {9, -100.0f}};
  const std::vector<int32_t> tokens = {7, 3, 3, 12, 7, 7, 40};  // prompt: 3
  Sampler sampler(p, vocab, 3);
  std::vector<ScoreEdit> edits;
  sampler.AppendScoreEdits(tokens, &edits);
  // The prompt's tokens first, in id order: 3 (repetition), 7 (bias, repetition, subtract);
  // then the others as first touched: 9 (bias), 12, 40 (repetition, subtract).
  REQUIRE(edits.size() == 5);
  std::vector<int32_t> ids;
  for (const ScoreEdit& e : edits) ids.push_back(e.token_id);
  CHECK(ids == std::vector<int32_t>{3, 7, 9, 12, 40});
  std::vector<float> row = logits;
  REQUIRE(ApplyScoreEdits(row, edits).ok());
  CHECK(edits[1].flags == (kEditBias | kEditRepetition | kEditSubtract));
  CHECK(edits[1].subtract == Approx(-0.4f * 2 + 0.7f));  // twice in the output
  const float expect7 = [&] {
    float s = logits[7] + 3.5f;
    s = s < 0.0f ? s * 1.3f : s / 1.3f;
    return s - edits[1].subtract;
  }();
  CHECK(SameBits(row[7], expect7));
  CHECK(SameBits(row[9], logits[9] - 100.0f));
  const float expect3 = logits[3] < 0.0f ? logits[3] * 1.3f : logits[3] / 1.3f;
  CHECK(SameBits(row[3], expect3));  // prompt only: no presence or frequency
  CHECK(sampler.Sample(logits, tokens).token_id == ArgmaxRow(row));
}

TEST_CASE("a TokenIdSet lists its members in id order and finds their index", "[sampling]") {
  const int32_t vocab = 130;  // three words, the last one partly used
  const std::vector<int32_t> tokens = {64, 0, 129, 63, 64, 5, 127, 0};
  const TokenIdSet set(tokens, vocab);
  const std::vector<int32_t> want = {0, 5, 63, 64, 127, 129};
  CHECK(set.size() == want.size());
  std::vector<int32_t> listed;
  set.ForEach([&](int32_t t) { listed.push_back(t); });
  CHECK(listed == want);
  for (int32_t t = -1; t <= vocab; ++t) {
    const auto found = std::find(want.begin(), want.end(), t);
    CHECK(set.Contains(t) == (found != want.end()));
    if (found != want.end()) CHECK(set.IndexOf(t) == static_cast<size_t>(found - want.begin()));
  }
  CHECK(TokenIdSet({}, vocab).size() == 0);
  CHECK_FALSE(TokenIdSet().Contains(0));
}

// Steps 0-2 written out over the whole row, as sampling.h states them: the reference the
// edits are checked against (not through AppendScoreEdits, which Sample() uses too).
std::vector<float> ReferenceScores(std::span<const float> logits, const SamplingParams& p,
                                   std::span<const int32_t> tokens, size_t num_prompt,
                                   std::span<const int32_t> masked) {
  std::vector<float> row(logits.begin(), logits.end());
  for (const TokenBias& b : p.logit_bias) row[b.token_id] = row[b.token_id] + b.bias;
  if (tokens.size() - num_prompt < static_cast<size_t>(p.min_tokens)) {
    std::vector<bool> is_masked(row.size());
    for (int32_t t : masked) is_masked[t] = true;
    bool other_usable = false;
    for (size_t t = 0; t < row.size(); ++t) other_usable |= !is_masked[t] && row[t] > -kInf;
    if (other_usable)
      for (int32_t t : masked) row[t] = -kInf;
  }
  std::vector<int> seen(row.size()), count(row.size());
  for (int32_t t : tokens) seen[t] = 1;
  for (int32_t t : tokens.subspan(num_prompt)) ++count[t];
  for (size_t t = 0; t < row.size(); ++t) {
    float s = row[t];
    if (p.repetition_penalty != 1.0f && seen[t])
      s = s < 0.0f ? s * p.repetition_penalty : s / p.repetition_penalty;
    if ((p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) && count[t] > 0)
      s = s - (p.frequency_penalty * static_cast<float>(count[t]) + p.presence_penalty);
    row[t] = s;
  }
  return row;
}

TEST_CASE("one Sampler's edits over many steps equal the scores written out", "[sampling]") {
  // The prompt's token set is kept from the first call: every later step (one more output
  // token each) must still give the written-out scores, bit for bit, with each token listed
  // once.
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const int32_t vocab = 300;
  const std::vector<int32_t> eos = {299};
  int rounds_with_mask = 0;
  for (int round = 0; round < 40; ++round) {
    SamplingParams p;
    p.repetition_penalty = round % 4 == 3 ? 1.0f : 0.5f + static_cast<float>(rng() % 100) / 66;
    p.presence_penalty = round % 3 == 0 ? 0.0f : static_cast<float>(rng() % 40) / 10 - 2.0f;
    p.frequency_penalty = round % 5 == 0 ? 0.0f : static_cast<float>(rng() % 40) / 10 - 2.0f;
    const int num_biases = static_cast<int>(rng() % 4);
    for (int b = 0; b < num_biases; ++b)  // one id in each of [0, 70), [70, 140), [140, 210)
      p.logit_bias.push_back({static_cast<int32_t>(b * 70 + rng() % 70),
                              std::clamp(normal(rng) * 10, -100.0f, 100.0f)});
    if (round % 2 == 0) {
      p.min_tokens = 1 + static_cast<int>(rng() % 8);
      p.stop_token_ids = {static_cast<int32_t>(rng() % vocab)};
    }
    std::vector<int32_t> masked = p.stop_token_ids;
    masked.insert(masked.end(), eos.begin(), eos.end());
    const size_t num_prompt = rng() % 200;  // 0 too: an empty prompt
    std::vector<int32_t> tokens(num_prompt);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 120);  // repeats, a dense part
    Sampler sampler(p, vocab, num_prompt, eos);
    for (int step = 0; step < 12; ++step) {
      std::vector<float> logits(vocab);
      for (float& v : logits) v = normal(rng);
      std::vector<ScoreEdit> edits;
      sampler.AppendScoreEdits(tokens, &edits);
      std::vector<bool> listed(vocab);
      for (const ScoreEdit& e : edits) {
        REQUIRE_FALSE(listed[e.token_id]);
        listed[e.token_id] = true;
      }
      std::vector<float> row = logits;
      REQUIRE(ApplyScoreEdits(row, edits).ok());
      const std::vector<float> want = ReferenceScores(logits, p, tokens, num_prompt, masked);
      for (int32_t t = 0; t < vocab; ++t) {
        INFO("round " << round << ", step " << step << ", token " << t);
        REQUIRE(SameBits(row[t], want[t]));
      }
      rounds_with_mask +=
          step == 0 && tokens.size() - num_prompt < static_cast<size_t>(p.min_tokens);
      tokens.push_back(static_cast<int32_t>(rng() % 2 ? rng() % 120 : rng() % vocab));
    }
  }
  CHECK(rounds_with_mask == 20);
}

TEST_CASE("rows with edits and logprobs stay on the host", "[sampling]") {
  const std::vector<int32_t> tokens = {1, 2, 3};
  SamplingParams p;
  p.repetition_penalty = 1.2f;
  RowDraw draw;
  std::vector<ScoreEdit> edits;
  {
    Sampler sampler(p, 10, 2);
    CHECK_FALSE(sampler.NextPickedByBackend(tokens, false, &draw, &edits));  // a CPU backend
    CHECK(edits.empty());
    CHECK(sampler.NextPickedByBackend(tokens, true, &draw, &edits));
    CHECK(draw.draw == 1);
    CHECK(edits.size() == 3);
  }
  p.logprobs = true;
  {
    Sampler sampler(p, 10, 2);
    edits.clear();
    CHECK_FALSE(sampler.NextPickedByBackend(tokens, true, &draw, &edits));
    CHECK(edits.empty());
  }
  p.logprobs = false;
  p.temperature = 0.0f;  // greedy with edits: the argmax of the edited row
  {
    Sampler sampler(p, 10, 2);
    draw = RowDraw{};
    CHECK(sampler.NextPickedByBackend(tokens, true, &draw, &edits));
    CHECK(draw.draw == 0);
    CHECK(edits.size() == 3);
  }
  // A min_tokens mask alone (no penalties): edits only while it applies.
  SamplingParams masked;
  masked.min_tokens = 2;
  masked.stop_token_ids = {4};
  Sampler sampler(masked, 10, 2, std::vector<int32_t>{9});
  edits.clear();
  CHECK(sampler.NextPickedByBackend(tokens, true, &draw, &edits));  // one output token so far
  REQUIRE(edits.size() == 2);
  CHECK(edits[0].flags == kEditMask);
  edits.clear();
  const std::vector<int32_t> later = {1, 2, 3, 5};
  CHECK(sampler.NextPickedByBackend(later, true, &draw, &edits));
  CHECK(edits.empty());  // a plain draw now
}

}  // namespace
}  // namespace tandem
