#include "common/engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

namespace tandem {
namespace {

std::set<int32_t> Kept(const Sampler::Distribution& dist) {
  return {dist.token_ids.begin(), dist.token_ids.end()};
}

std::map<int32_t, double> ProbsById(const Sampler::Distribution& dist) {
  std::map<int32_t, double> out;
  for (size_t i = 0; i < dist.token_ids.size(); ++i) out[dist.token_ids[i]] = dist.probs[i];
  return out;
}

std::vector<double> Softmax(const std::vector<float>& logits, double temperature) {
  double max_value = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    p[i] = std::exp((logits[i] - max_value) / temperature);
    sum += p[i];
  }
  for (double& v : p) v /= sum;
  return p;
}

SamplingParams Seeded(uint64_t seed) {
  SamplingParams p;
  p.seed = seed;
  return p;
}

TEST_CASE("SamplingParams::Validate names the bad field", "[sampling]") {
  SamplingParams ok;
  REQUIRE(ok.Validate().ok());

  auto message_of = [](SamplingParams p) {
    Status s = p.Validate();
    REQUIRE(s.code() == StatusCode::kInvalidArgument);
    return s.message();
  };
  SamplingParams p;
  p.temperature = 3.0f;
  CHECK(message_of(p) == "temperature must be in [0, 2], got 3");
  p = {};
  p.temperature = -0.5f;
  CHECK(message_of(p) == "temperature must be in [0, 2], got -0.5");
  p = {};
  p.temperature = std::nanf("");
  CHECK(message_of(p).rfind("temperature must be in [0, 2]", 0) == 0);
  p = {};
  p.top_p = 0.0f;
  CHECK(message_of(p) == "top_p must be in (0, 1], got 0");
  p = {};
  p.top_k = -2;
  CHECK(message_of(p).rfind("top_k must be", 0) == 0);
  p = {};
  p.min_p = 1.5f;
  CHECK(message_of(p) == "min_p must be in [0, 1], got 1.5");
  p = {};
  p.repetition_penalty = 0.0f;
  CHECK(message_of(p) == "repetition_penalty must be in (0, 2], got 0");
  p = {};
  p.presence_penalty = 2.5f;
  CHECK(message_of(p) == "presence_penalty must be in [-2, 2], got 2.5");
  p = {};
  p.frequency_penalty = -3.0f;
  CHECK(message_of(p) == "frequency_penalty must be in [-2, 2], got -3");
  p = {};
  p.max_tokens = 0;
  CHECK(message_of(p) == "max_tokens must be at least 1, got 0");
  p = {};
  p.stop = {"a", "b", "c", "d", "e"};
  CHECK(message_of(p) == "stop may hold at most 4 sequences, got 5");
  p = {};
  p.stop = {""};
  CHECK(message_of(p) == "stop sequences must not be empty");
  p = {};
  p.logprobs = true;
  p.top_logprobs = 21;
  CHECK(message_of(p) == "top_logprobs must be in [0, 20], got 21");
  p = {};
  p.top_logprobs = 2;
  CHECK(message_of(p) == "logprobs must be set to true if top_logprobs is used");
  p = {};
  p.stop_token_ids = {-1};
  CHECK(message_of(p) == "stop_token_ids must be non-negative, got -1");
  p = {};
  p.stop_token_ids = {100};
  CHECK(p.Validate().ok());
  Status s = p.ValidateForVocab(100);
  CHECK(s.message() == "stop_token_ids must be below the vocabulary size 100, got 100");
}

TEST_CASE("Greedy picks the argmax after penalties, lowest id on ties", "[sampling]") {
  SamplingParams p;
  p.temperature = 0.0f;
  Sampler sampler(p, 5, 0);
  std::vector<float> logits = {1.0f, 3.0f, 3.0f, -1.0f, 2.0f};
  CHECK(sampler.Sample(logits, {}).token_id == 1);

  p.repetition_penalty = 2.0f;  // 3 / 2 = 1.5 < 2
  Sampler penalised(p, 5, 0);
  std::vector<int32_t> seen = {1, 2};
  CHECK(penalised.Sample(logits, seen).token_id == 4);
}

TEST_CASE("The same seed gives the same tokens, another seed differs", "[sampling]") {
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const int32_t vocab = 1000;
  std::vector<std::vector<float>> steps(64, std::vector<float>(vocab));
  for (auto& step : steps) {
    for (float& v : step) v = normal(gen);
  }
  auto run = [&](uint64_t seed, bool interleave) {
    SamplingParams p = Seeded(seed);
    p.temperature = 1.3f;
    p.top_p = 0.95f;
    Sampler sampler(p, vocab, 3);
    Sampler other(Seeded(seed + 1), vocab, 0);  // shares nothing with `sampler`
    std::vector<int32_t> tokens = {5, 6, 7};
    for (const auto& logits : steps) {
      if (interleave) (void)other.Sample(logits, tokens);
      tokens.push_back(sampler.Sample(logits, tokens).token_id);
    }
    return tokens;
  };
  auto a = run(42, false);
  CHECK(a == run(42, true));  // batch neighbours do not matter
  CHECK(a != run(43, false));

  // The draw depends only on (seed, position): a fresh sampler resumes the same stream, as
  // a request moving from prefill to decode does.
  SamplingParams p = Seeded(42);
  p.temperature = 1.3f;
  p.top_p = 0.95f;
  Sampler resumed(p, vocab, 3);
  std::vector<int32_t> prefix(a.begin(), a.begin() + 3 + 40);
  CHECK(resumed.Sample(steps[40], prefix).token_id == a[3 + 40]);

  // An unseeded sampler reports the seed it picked; reusing it reproduces the tokens.
  Sampler unseeded(SamplingParams{}, vocab, 0);
  Sampler replay(Seeded(unseeded.seed()), vocab, 0);
  std::vector<int32_t> t1, t2;
  for (const auto& logits : steps) {
    t1.push_back(unseeded.Sample(logits, t1).token_id);
    t2.push_back(replay.Sample(logits, t2).token_id);
  }
  CHECK(t1 == t2);
}

TEST_CASE("Top-k keeps the k largest, ties at the edge included", "[sampling]") {
  std::vector<float> logits = {0.5f, 2.0f, 1.0f, 3.0f, 1.0f, -4.0f};
  SamplingParams p = Seeded(1);
  p.top_k = 2;
  Sampler sampler(p, 6, 0);
  CHECK(Kept(sampler.Process(logits, {})) == std::set<int32_t>{1, 3});
  p.top_k = 3;  // the 3rd largest is 1.0, held by ids 2 and 4
  Sampler ties(p, 6, 0);
  auto dist = ties.Process(logits, {});
  CHECK(Kept(dist) == std::set<int32_t>{1, 2, 3, 4});
  auto probs = ProbsById(dist);
  double z = std::exp(2.0) + 2 * std::exp(1.0) + std::exp(3.0);
  CHECK(probs[3] == Approx(std::exp(3.0) / z).epsilon(1e-12));
  CHECK(probs[2] == Approx(std::exp(1.0) / z).epsilon(1e-12));
  p.top_k = 100;  // larger than the vocabulary: no-op
  Sampler all(p, 6, 0);
  CHECK(all.Process(logits, {}).token_ids.size() == 6);
}

TEST_CASE("Top-p drops the tail whose mass is <= 1 - top_p", "[sampling]") {
  // Probabilities 0.5, 0.25, 0.125, 0.125 exactly (as logs).
  std::vector<float> logits = {std::log(0.5f), std::log(0.25f), std::log(0.125f),
                               std::log(0.125f)};
  SamplingParams p = Seeded(1);
  p.top_p = 0.7f;  // tail 0.125+0.125 = 0.25 <= 0.3 dropped; +0.25 = 0.5 > 0.3 kept
  Sampler sampler(p, 4, 0);
  auto dist = sampler.Process(logits, {});
  CHECK(Kept(dist) == std::set<int32_t>{0, 1});
  auto probs = ProbsById(dist);
  CHECK(probs[0] == Approx(2.0 / 3.0).epsilon(1e-6));
  CHECK(probs[1] == Approx(1.0 / 3.0).epsilon(1e-6));

  p.top_p = 0.1f;  // only the most likely token survives
  Sampler narrow(p, 4, 0);
  CHECK(Kept(narrow.Process(logits, {})) == std::set<int32_t>{0});
  p.top_p = 0.9f;  // 0.125 <= 0.1? no: all kept
  Sampler wide(p, 4, 0);
  CHECK(Kept(wide.Process(logits, {})).size() == 4);
}

TEST_CASE("Min-p keeps tokens with p >= min_p * p_max", "[sampling]") {
  std::vector<float> logits = {std::log(0.6f), std::log(0.2f), std::log(0.15f),
                               std::log(0.05f)};
  SamplingParams p = Seeded(1);
  p.min_p = 0.3f;  // threshold 0.18: keeps 0.6 and 0.2
  Sampler sampler(p, 4, 0);
  auto dist = sampler.Process(logits, {});
  CHECK(Kept(dist) == std::set<int32_t>{0, 1});
  CHECK(ProbsById(dist)[0] == Approx(0.75).epsilon(1e-6));
  p.min_p = 0.2f;  // threshold 0.12: keeps three
  Sampler looser(p, 4, 0);
  CHECK(Kept(looser.Process(logits, {})) == std::set<int32_t>{0, 1, 2});
}

TEST_CASE("Warpers compose in HF order: temperature, top-k, top-p, min-p", "[sampling]") {
  std::vector<float> logits = {4.0f, 3.0f, 2.0f, 1.0f, 0.0f, -1.0f};
  SamplingParams p = Seeded(1);
  p.temperature = 2.0f;  // halves the logits: 2, 1.5, 1, .5, 0, -.5
  p.top_k = 4;           // ids 0..3
  p.top_p = 0.8f;
  Sampler sampler(p, 6, 0);
  // softmax over {2, 1.5, 1, .5}: .455 .276 .167 .102 (tail .102 <= .2 dropped,
  // + .167 = .269 > .2 stays)
  CHECK(Kept(sampler.Process(logits, {})) == std::set<int32_t>{0, 1, 2});
  p.min_p = 0.5f;  // exp(s - s_max) >= .5: 1.5 -> .607 stays, 1 -> .368 goes
  Sampler with_min_p(p, 6, 0);
  CHECK(Kept(with_min_p.Process(logits, {})) == std::set<int32_t>{0, 1});
}

TEST_CASE("Penalties: HF repetition over prompt+output, OpenAI presence/frequency on output",
          "[sampling]") {
  std::vector<float> logits = {2.0f, -2.0f, 1.0f, 0.5f, 0.0f};
  SamplingParams p = Seeded(1);
  p.repetition_penalty = 2.0f;
  Sampler rep(p, 5, 2);
  // Token 0 in the prompt, 1 twice in output: each penalised once.
  std::vector<int32_t> tokens = {0, 3, 1, 1};
  auto probs = ProbsById(rep.Process(logits, tokens));
  // Processed logits: 1, -4, 1, 0.25, 0
  std::vector<float> expect = {1.0f, -4.0f, 1.0f, 0.25f, 0.0f};
  auto want = Softmax(expect, 1.0);
  for (int32_t i = 0; i < 5; ++i) CHECK(probs[i] == Approx(want[i]).epsilon(1e-9));

  SamplingParams q = Seeded(1);
  q.presence_penalty = 0.5f;
  q.frequency_penalty = 0.25f;
  Sampler pf(q, 5, 2);
  probs = ProbsById(pf.Process(logits, tokens));
  // Prompt tokens 0 and 3 untouched; token 1 (count 2): -2 - 0.5 - 0.5 = -3.
  expect = {2.0f, -3.0f, 1.0f, 0.5f, 0.0f};
  want = Softmax(expect, 1.0);
  for (int32_t i = 0; i < 5; ++i) CHECK(probs[i] == Approx(want[i]).epsilon(1e-9));

  // Running again must give the same: the scratch counters were reset.
  auto again = ProbsById(pf.Process(logits, tokens));
  CHECK(again == probs);
}

TEST_CASE("Temperature sampling frequencies match the softmax", "[sampling]") {
  std::vector<float> logits = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, -3.0f};
  for (float temperature : {0.5f, 1.0f, 1.7f}) {
    SamplingParams p = Seeded(1234);
    p.temperature = temperature;
    Sampler sampler(p, 6, 0);
    const int kDraws = 40000;
    std::vector<int32_t> tokens;
    tokens.reserve(kDraws);
    std::vector<int> counts(6, 0);
    for (int i = 0; i < kDraws; ++i) {
      int32_t t = sampler.Sample(logits, tokens).token_id;
      ++counts[t];
      tokens.push_back(t);
    }
    auto want = Softmax(logits, temperature);
    for (int i = 0; i < 6; ++i) {
      double freq = static_cast<double>(counts[i]) / kDraws;
      double sigma = std::sqrt(want[i] * (1 - want[i]) / kDraws);
      INFO("temperature " << temperature << " token " << i << " freq " << freq << " want "
                          << want[i]);
      CHECK(std::abs(freq - want[i]) <= 4 * sigma + 1e-9);
    }
  }
}

TEST_CASE("Logprobs: raw by default, processed on request, top-n sorted", "[sampling]") {
  std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.0f};
  SamplingParams p = Seeded(5);
  p.temperature = 0.0f;
  p.logprobs = true;
  p.top_logprobs = 3;
  Sampler sampler(p, 4, 0);
  SampleResult r = sampler.Sample(logits, {});
  auto raw = Softmax(logits, 1.0);
  CHECK(r.token_id == 1);
  CHECK(r.logprob == Approx(std::log(raw[1])).epsilon(1e-6));
  REQUIRE(r.num_top_logprobs == 3);
  CHECK(r.top()[0].token_id == 1);
  CHECK(r.top()[1].token_id == 2);
  CHECK(r.top()[2].token_id == 0);
  CHECK(r.top()[2].logprob == Approx(std::log(raw[0])).epsilon(1e-6));

  p.temperature = 0.5f;
  p.top_k = 2;
  p.logprobs_mode = LogprobsMode::kProcessed;
  Sampler processed(p, 4, 0);
  r = processed.Sample(logits, {});
  auto warped = Softmax({6.0f, 4.0f}, 1.0);  // ids 1, 2 at temperature 0.5
  CHECK(r.top()[0].logprob == Approx(std::log(warped[0])).epsilon(1e-6));
  CHECK(r.top()[2].logprob == -std::numeric_limits<float>::infinity());

  SamplingParams none = Seeded(5);
  Sampler quiet(none, 4, 0);
  r = quiet.Sample(logits, {});
  CHECK(r.num_top_logprobs == 0);
  CHECK(r.logprob == 0.0f);
}

TEST_CASE("Masked (-inf) logits are never sampled", "[sampling]") {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> logits = {-inf, 0.0f, -inf, 0.0f};
  Sampler sampler(Seeded(3), 4, 0);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 200; ++i) {
    int32_t t = sampler.Sample(logits, tokens).token_id;
    REQUIRE((t == 1 || t == 3));
    tokens.push_back(t);
  }
}

TEST_CASE("Shared workspace gives the same results as an owned one", "[sampling]") {
  std::vector<float> logits = {0.3f, 0.1f, 2.0f, -1.0f, 0.7f};
  SamplerWorkspace workspace(5);
  SamplingParams p = Seeded(9);
  p.repetition_penalty = 1.3f;
  p.frequency_penalty = 0.4f;
  Sampler a(p, &workspace, 1);
  Sampler b(p, &workspace, 1);
  Sampler c(p, 5, 1);
  std::vector<int32_t> ta = {2}, tc = {2};
  for (int i = 0; i < 50; ++i) {
    ta.push_back(a.Sample(logits, ta).token_id);
    (void)b.Sample(logits, ta);
    tc.push_back(c.Sample(logits, tc).token_id);
  }
  CHECK(ta == tc);
}

// ---- StopChecker ---------------------------------------------------------------------------

struct Stream {
  std::string emitted;
  FinishReason reason = FinishReason::kNone;
};

Stream Feed(StopChecker& checker, const std::vector<std::pair<int32_t, std::string>>& steps) {
  Stream out;
  for (const auto& [id, text] : steps) {
    StopUpdate u = checker.Append(id, text);
    out.emitted += u.text;
    if (u.finished()) {
      out.reason = u.finish_reason;
      break;
    }
  }
  return out;
}

TEST_CASE("Stop strings spanning deltas are held back and cut", "[sampling][stop]") {
  SamplingParams p;
  p.max_tokens = 100;
  p.stop = {"</end>", "STOP"};
  StopChecker checker(p, {2});
  StopUpdate u = checker.Append(10, "Hello </e");
  CHECK(u.text == "Hello ");  // "</e" could start "</end>"
  u = checker.Append(11, "n");
  CHECK(u.text.empty());
  u = checker.Append(12, "d> tail");
  CHECK(u.text.empty());
  CHECK(u.finish_reason == FinishReason::kStop);
  CHECK(checker.text() == "Hello ");
  CHECK(checker.matched_stop() == std::optional<std::string>("</end>"));
  CHECK(FinishReasonName(checker.finish_reason()) == "stop");
}

TEST_CASE("Held text that is not a stop string is released", "[sampling][stop]") {
  SamplingParams p;
  p.max_tokens = 100;
  p.stop = {"abc"};
  StopChecker checker(p, {2});
  CHECK(checker.Append(5, "xab").text == "x");
  CHECK(checker.Append(6, "x").text == "abx");
  CHECK(checker.Append(7, "a").text.empty());
  StopUpdate u = checker.Append(2, "</s>");  // eos: held "a" released, eos text dropped
  CHECK(u.text == "a");
  CHECK(u.finish_reason == FinishReason::kStop);
  CHECK(checker.text() == "xabxa");
  CHECK(!checker.matched_stop());
}

TEST_CASE("The earliest of several stop strings wins", "[sampling][stop]") {
  SamplingParams p;
  p.stop = {"world", "o w"};
  StopChecker checker(p, {});
  Stream s = Feed(checker, {{1, "hello world"}});
  CHECK(s.emitted == "hell");
  CHECK(checker.matched_stop() == std::optional<std::string>("o w"));
}

TEST_CASE("Stop string split over single characters", "[sampling][stop]") {
  SamplingParams p;
  p.max_tokens = 100;
  p.stop = {"\n\nUser:"};
  StopChecker checker(p, {});
  std::string text = "Answer: 42\n\nUse it.\n\nUser: next";
  std::vector<std::pair<int32_t, std::string>> steps;
  for (char c : text) steps.push_back({7, std::string(1, c)});
  Stream s = Feed(checker, steps);
  CHECK(s.emitted == "Answer: 42\n\nUse it.");
  CHECK(s.reason == FinishReason::kStop);
}

TEST_CASE("Stop token ids, eos, ignore_eos and max_tokens", "[sampling][stop]") {
  SamplingParams p;
  p.max_tokens = 3;
  p.stop_token_ids = {9};
  {
    StopChecker checker(p, {2});
    Stream s = Feed(checker, {{4, "a"}, {9, "<x>"}});
    CHECK(s.emitted == "a");
    CHECK(s.reason == FinishReason::kStop);
  }
  {
    StopChecker checker(p, {2});
    Stream s = Feed(checker, {{4, "a"}, {5, "b"}, {6, "c"}, {7, "d"}});
    CHECK(s.emitted == "abc");
    CHECK(s.reason == FinishReason::kLength);
    CHECK(FinishReasonName(checker.finish_reason()) == "length");
    CHECK(checker.num_tokens() == 3);
  }
  {
    p.ignore_eos = true;
    StopChecker checker(p, {2});
    Stream s = Feed(checker, {{2, "<eos>"}, {9, "x"}});
    CHECK(s.emitted == "<eos>");
    CHECK(s.reason == FinishReason::kStop);
  }
  {
    // Text held for a possible stop string is released when max_tokens ends the request.
    SamplingParams q;
    q.max_tokens = 2;
    q.stop = {"xyz"};
    StopChecker checker(q, {});
    Stream s = Feed(checker, {{4, "a"}, {5, "bx"}});
    CHECK(s.emitted == "abx");
    CHECK(s.reason == FinishReason::kLength);
  }
}

// ---- Cases for tests/python/test_sampling_hf.py --------------------------------------------

// Hidden: reads $TANDEM_TEST_DIR/hf_cases.json, writes $TANDEM_TEST_DIR/tandem_results.json.
// Each case: {logits, prompt_tokens, output_tokens, temperature, top_k, top_p, min_p,
// repetition_penalty}; each result: {token_ids, probs} of Sampler::Process.
TEST_CASE("HF comparison cases", "[.hf_sampling_cases]") {
  const char* dir = std::getenv("TANDEM_TEST_DIR");
  if (dir == nullptr) {
    WARN("TANDEM_TEST_DIR is not set; run through tests/python/test_sampling_hf.py");
    return;
  }
  std::ifstream in(std::string(dir) + "/hf_cases.json");
  REQUIRE(in.good());
  nlohmann::json cases = nlohmann::json::parse(in);
  nlohmann::json results = nlohmann::json::array();
  for (const auto& c : cases) {
    std::vector<float> logits = c.at("logits").get<std::vector<float>>();
    std::vector<int32_t> tokens = c.at("prompt_tokens").get<std::vector<int32_t>>();
    std::vector<int32_t> output = c.at("output_tokens").get<std::vector<int32_t>>();
    const size_t num_prompt = tokens.size();
    tokens.insert(tokens.end(), output.begin(), output.end());
    SamplingParams p = Seeded(0);
    p.temperature = c.at("temperature").get<float>();
    p.top_k = c.at("top_k").get<int32_t>();
    p.top_p = c.at("top_p").get<float>();
    p.min_p = c.at("min_p").get<float>();
    p.repetition_penalty = c.at("repetition_penalty").get<float>();
    REQUIRE(p.Validate().ok());
    Sampler sampler(p, static_cast<int32_t>(logits.size()), num_prompt);
    Sampler::Distribution dist = sampler.Process(logits, tokens);
    nlohmann::json r;
    r["token_ids"] = std::vector<int32_t>(dist.token_ids.begin(), dist.token_ids.end());
    r["probs"] = std::vector<double>(dist.probs.begin(), dist.probs.end());
    results.push_back(std::move(r));
  }
  std::ofstream out(std::string(dir) + "/tandem_results.json");
  out << results.dump();
  REQUIRE(out.good());
}

}  // namespace
}  // namespace tandem
