// The sampling fields of issue 19: logit_bias, min_tokens (sampler mask and StopChecker) and
// include_stop_str_in_output, and their trip over the control wire.
#include <cmath>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include <catch2/catch.hpp>

#include "common/engine/sampling.h"
#include "common/net/control_wire.h"

namespace tandem {
namespace {

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// Feeds (token, text) pairs until the checker finishes; returns what it emitted.
std::string Feed(StopChecker& checker, const std::vector<std::pair<int32_t, std::string>>& steps) {
  std::string out;
  for (const auto& [id, text] : steps) {
    StopUpdate u = checker.Append(id, text);
    out += u.text;
    if (u.finished()) break;
  }
  return out;
}

TEST_CASE("logit_bias +100 forces a token, -100 bans it, greedy and sampled", "[sampling]") {
  const std::vector<float> logits = {5.0f, 1.0f, 0.5f, 0.0f, -1.0f};
  const std::vector<int32_t> prompt = {0, 1};
  for (float temperature : {0.0f, 1.0f}) {
    SamplingParams p;
    p.temperature = temperature;
    p.logit_bias = {{3, 100.0f}};
    for (uint64_t seed = 1; seed <= 20; ++seed) {
      p.seed = seed;
      Sampler sampler(p, 5, prompt.size());
      CHECK(sampler.Sample(logits, prompt).token_id == 3);
    }
    SamplingParams ban;
    ban.temperature = temperature;
    ban.logit_bias = {{0, -100.0f}};
    ban.seed = 3;
    Sampler banned(ban, 5, prompt.size());
    CHECK(banned.Sample(logits, prompt).token_id != 0);
  }
  // Raw logprobs are the model's, before the bias (as OpenAI and vLLM report them).
  SamplingParams lp;
  lp.temperature = 0;
  lp.logit_bias = {{3, 100.0f}};
  lp.logprobs = true;
  Sampler sampler(lp, 5, 0);
  SampleResult r = sampler.Sample(logits, std::span<const int32_t>());
  CHECK(r.token_id == 3);
  CHECK(r.logprob < -4.0f);
}

TEST_CASE("logit_bias validation names the field", "[sampling]") {
  SamplingParams p;
  p.logit_bias = {{1, 100.5f}};
  CHECK_THAT(p.Validate().message(), Catch::StartsWith("logit_bias"));
  p.logit_bias = {{-1, 1.0f}};
  CHECK_THAT(p.Validate().message(), Catch::StartsWith("logit_bias"));
  p.logit_bias = {{4, 1.0f}, {4, 2.0f}};
  CHECK_THAT(p.Validate().message(), Catch::Contains("twice"));
  p.logit_bias = {{4, 1.0f}};
  CHECK(p.Validate().ok());
  CHECK_THAT(p.ValidateForVocab(4).message(), Catch::StartsWith("logit_bias"));
  CHECK(p.ValidateForVocab(5).ok());
  p.logit_bias.assign(kMaxLogitBiasEntries + 1, TokenBias{0, 0.0f});
  CHECK_THAT(p.Validate().message(), Catch::StartsWith("logit_bias"));
}

TEST_CASE("min_tokens masks eos and stop_token_ids until reached", "[sampling]") {
  // eos (2) and stop id (4) are by far the likeliest tokens.
  const std::vector<float> logits = {0.0f, 1.0f, 50.0f, 0.5f, 40.0f};
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 10;
  p.min_tokens = 3;
  p.stop_token_ids = {4};
  const std::vector<int32_t> eos = {2};
  Sampler sampler(p, 5, 1, eos);
  const std::vector<int32_t> prompt = {0};
  std::vector<int32_t> tokens = prompt;
  for (int i = 0; i < 3; ++i) {
    int32_t t = sampler.Sample(logits, tokens).token_id;
    CHECK(t == 1);  // the best token that is not a stop token
    tokens.push_back(t);
  }
  CHECK(sampler.Sample(logits, tokens).token_id == 2);  // min_tokens reached: eos again

  // ignore_eos: only the stop ids are masked (eos is not a stop then).
  p.ignore_eos = true;
  Sampler ignoring(p, 5, 1, eos);
  CHECK(ignoring.Sample(logits, prompt).token_id == 2);

  // Sampled, not greedy: still never a stop token before min_tokens.
  SamplingParams s = p;
  s.ignore_eos = false;
  s.temperature = 1.0f;
  for (uint64_t seed = 0; seed < 30; ++seed) {
    s.seed = seed;
    Sampler seeded(s, 5, 1, eos);
    int32_t t = seeded.Sample(logits, prompt).token_id;
    CHECK(t != 2);
    CHECK(t != 4);
  }

  // Stop ids covering every usable token: the mask yields, the request still gets a token.
  const std::vector<float> only_stops = {-INFINITY, -INFINITY, 1.0f, -INFINITY, 2.0f};
  Sampler cornered(p, 5, 1, eos);
  CHECK(cornered.Sample(only_stops, prompt).token_id == 2);
}

TEST_CASE("min_tokens: no stop token or stop string ends the output before it", "[sampling][stop]") {
  SamplingParams p;
  p.max_tokens = 10;
  p.min_tokens = 3;
  p.stop = {"!"};
  p.stop_token_ids = {9};
  {
    StopChecker checker(p, {2});
    // eos and "!" as tokens 1 and 2 are ordinary text; the third token may stop.
    std::string out = Feed(checker, {{2, ""}, {5, "a!"}, {6, "b!c"}, {7, "d"}});
    CHECK(out == "a!b");
    CHECK(checker.finish_reason() == FinishReason::kStop);
    CHECK(checker.num_tokens() == 3);
  }
  {
    StopChecker checker(p, {2});
    std::string out = Feed(checker, {{9, "x"}, {5, "y"}, {6, "z"}, {9, "<9>"}});
    CHECK(out == "xyz");
    CHECK(checker.num_tokens() == 4);
  }
  {
    p.max_tokens = 3;
    StopChecker checker(p, {2});
    std::string out = Feed(checker, {{5, "a"}, {6, "b"}, {7, "c"}});
    CHECK(out == "abc");
    CHECK(checker.finish_reason() == FinishReason::kLength);
  }
  SamplingParams bad;
  bad.max_tokens = 4;
  bad.min_tokens = 5;
  CHECK_THAT(bad.Validate().message(), Catch::StartsWith("min_tokens"));
  bad.min_tokens = -1;
  CHECK_THAT(bad.Validate().message(), Catch::StartsWith("min_tokens"));
}

TEST_CASE("include_stop_str_in_output keeps the stop string and the stop token's text",
          "[sampling][stop]") {
  SamplingParams p;
  p.max_tokens = 10;
  p.stop = {"END"};
  p.include_stop_str_in_output = true;
  {
    StopChecker checker(p, {2});
    std::string out = Feed(checker, {{5, "abcE"}, {6, "ND and more"}});
    CHECK(out == "abcEND");
    CHECK(checker.matched_stop() == std::optional<std::string>("END"));
  }
  {
    StopChecker checker(p, {2});
    std::string out = Feed(checker, {{5, "hi"}, {2, "</s>"}});
    CHECK(out == "hi</s>");
  }
  p.include_stop_str_in_output = false;
  StopChecker checker(p, {2});
  CHECK(Feed(checker, {{5, "abcE"}, {6, "ND and more"}}) == "abc");
}

TEST_CASE("min_tokens and logit_bias cross the control wire", "[wire]") {
  Submit submit;
  submit.request_id = "r1";
  submit.prompt = {1, 2, 3};
  submit.sampling.max_tokens = 9;
  submit.sampling.min_tokens = 4;
  submit.sampling.logit_bias = {{7, 100.0f}, {3, -2.5f}};
  submit.sampling.include_stop_str_in_output = true;  // router-only: not sent
  std::string frame = EncodeControl(ControlMessage(submit));
  StatusOr<ControlMessage> decoded = DecodeControl(Bytes(frame));
  REQUIRE(decoded.ok());
  const SamplingParams& s = std::get<Submit>(*decoded).sampling;
  CHECK(s.min_tokens == 4);
  REQUIRE(s.logit_bias.size() == 2);
  CHECK(s.logit_bias[0].token_id == 7);
  CHECK(s.logit_bias[0].bias == 100.0f);
  CHECK(s.logit_bias[1].token_id == 3);
  CHECK(s.logit_bias[1].bias == -2.5f);
  CHECK_FALSE(s.include_stop_str_in_output);

  // A logit_bias count past the limit is refused, not allocated. With no bias entries the
  // count is followed only by decode_address (empty: a u32), seq and decode_session (u64s).
  submit.sampling.logit_bias.clear();
  std::string plain = EncodeControl(ControlMessage(submit));
  REQUIRE(DecodeControl(Bytes(plain)).ok());
  const size_t count_at = plain.size() - 24;
  REQUIRE(plain.substr(count_at, 4) == std::string(4, '\0'));
  const uint32_t too_many = kMaxLogitBiasEntries + 1;
  for (int i = 0; i < 4; ++i) plain[count_at + i] = static_cast<char>((too_many >> (8 * i)) & 0xff);
  CHECK_FALSE(DecodeControl(Bytes(plain)).ok());
}

}  // namespace
}  // namespace tandem
