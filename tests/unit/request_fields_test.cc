// The router's request-field allowlist (router/request_fields.h) and the fields issue 19 added:
// each implemented field parses into what it does, each unsupported or unknown one is a 400
// naming it, null is always "not given".
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "router/errors.h"
#include "router/openai_api.h"
#include "router/request_fields.h"
#include "tests/unit/tiny_model.h"

namespace tandem {
namespace {

using json = nlohmann::json;

constexpr int kMaxModelLen = 64;

const ServedModel& Model() { return test::TinyServedModel(kMaxModelLen); }

struct Parsed {
  StatusOr<ApiRequest> request;
  std::string param;
};

Parsed Parse(ApiKind kind, json extra) {
  json body = {{"model", "tiny"}};
  if (kind == ApiKind::kChatCompletion) {
    body["messages"] = json::array({{{"role", "user"}, {"content", "hi there"}}});
  } else {
    body["prompt"] = "hello world";
  }
  for (auto& [k, v] : extra.items()) body[k] = v;
  std::string param;
  StatusOr<ApiRequest> r = ParseApiRequest(kind, body.dump(), Model(), &param);
  return Parsed{std::move(r), param};
}
Parsed Completion(json extra) { return Parse(ApiKind::kCompletion, std::move(extra)); }
Parsed Chat(json extra) { return Parse(ApiKind::kChatCompletion, std::move(extra)); }

// A 400 whose OpenAI error body names `param`, and whose message contains `says`.
void ExpectRefused(const Parsed& parsed, const std::string& param, const std::string& says = "") {
  INFO("expected a 400 naming " << param);
  REQUIRE_FALSE(parsed.request.ok());
  CHECK(parsed.request.status().code() == StatusCode::kInvalidArgument);
  CHECK(parsed.param == param);
  HttpError error = ErrorResponse(parsed.request.status(), parsed.param);
  CHECK(error.http_status == 400);
  json body = json::parse(error.body);
  CHECK(body["error"]["param"] == param);
  CHECK(body["error"]["type"] == "invalid_request_error");
  if (!says.empty()) {
    CHECK_THAT(body["error"]["message"].get<std::string>(), Catch::Contains(says));
  }
}

void ExpectOk(const Parsed& parsed) {
  INFO(parsed.param << ": " << parsed.request.status().ToString());
  CHECK(parsed.request.ok());
}

TEST_CASE("request fields: unknown fields are 400 Unrecognized request argument", "[router]") {
  ExpectRefused(Completion({{"frobnicate", 1}}), "frobnicate",
                "Unrecognized request argument supplied: frobnicate");
  ExpectRefused(Chat({{"temprature", 0.5}}), "temprature",
                "Unrecognized request argument supplied: temprature");
  // One endpoint's field on the other.
  ExpectRefused(Chat({{"prompt", "x"}}), "prompt", "Unrecognized");
  ExpectRefused(Completion({{"messages", json::array()}}), "messages", "Unrecognized");
  ExpectRefused(Completion({{"max_completion_tokens", 4}}), "max_completion_tokens",
                "Unrecognized");
  ExpectRefused(Completion({{"tools", json::array()}}), "tools", "Unrecognized");
  // Even null: the name itself is unknown.
  ExpectRefused(Completion({{"frobnicate", nullptr}}), "frobnicate");
  ExpectRefused(Chat({{"stream", true}, {"stream_options", {{"verbose", true}}}}),
                "stream_options", "stream_options.verbose");
}

TEST_CASE("request fields: unsupported features are 400 naming the field", "[router]") {
  struct Case {
    ApiKind kind;
    const char* field;
    json value;
  };
  const ApiKind kC = ApiKind::kCompletion, kChat = ApiKind::kChatCompletion;
  const std::vector<Case> cases = {
      {kC, "prompt_logprobs", 1},
      {kChat, "prompt_logprobs", 0},
      {kC, "best_of", 2},
      {kChat, "best_of", 3},
      {kC, "use_beam_search", true},
      {kC, "length_penalty", 0.5},
      {kC, "guided_json", {{"type", "object"}}},
      {kChat, "guided_choice", {"yes", "no"}},
      {kChat, "guided_regex", "[a-z]+"},
      {kC, "guided_grammar", "root ::= x"},
      {kC, "response_format", {{"type", "json_object"}}},
      {kChat, "response_format", {{"type", "json_schema"}, {"json_schema", json::object()}}},
      {kChat, "tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}},
      {kChat, "tool_choice", "auto"},
      {kChat, "tool_choice", {{"type", "function"}}},
      {kChat, "parallel_tool_calls", false},
      {kChat, "functions", {{{"name", "f"}}}},
      {kChat, "function_call", "auto"},
      {kC, "suffix", "tail"},
      {kChat, "echo", true},
      {kC, "allowed_token_ids", {1, 2}},
      {kC, "bad_words", {"x"}},
      {kC, "priority", 1},
      {kC, "request_id", "mine"},
      {kChat, "logits_processors", {"x"}},
      {kChat, "return_tokens_as_token_ids", true},
      {kChat, "modalities", {"text", "audio"}},
      {kC, "spaces_between_special_tokens", true},
  };
  for (const Case& c : cases) {
    INFO(c.field << " = " << c.value.dump());
    ExpectRefused(Parse(c.kind, {{c.field, c.value}}), c.field, c.field);
  }
}

TEST_CASE("request fields: null and neutral values of unsupported features are accepted",
          "[router]") {
  for (const char* field : {"prompt_logprobs", "best_of", "guided_json", "response_format",
                            "suffix", "use_beam_search", "user", "min_tokens", "logit_bias",
                            "echo", "n", "truncate_prompt_tokens", "skip_special_tokens"}) {
    INFO(field);
    ExpectOk(Completion({{field, nullptr}}));
  }
  ExpectOk(Completion({{"best_of", 1}}));
  ExpectOk(Completion({{"n", 2}, {"best_of", 2}}));
  ExpectOk(Completion({{"suffix", ""}}));
  ExpectOk(Completion({{"use_beam_search", false}}));
  ExpectOk(Completion({{"response_format", {{"type", "text"}}}}));
  ExpectOk(Completion({{"spaces_between_special_tokens", false}}));
  ExpectOk(Chat({{"tools", json::array()}, {"tool_choice", "none"}, {"function_call", "none"}}));
  ExpectOk(Chat({{"echo", false}, {"modalities", {"text"}}, {"store", false}}));
}

TEST_CASE("request fields: message keys", "[router]") {
  auto with_message = [](json message) {
    return Chat({{"messages", json::array({{{"role", "user"}, {"content", "q"}}, message})}});
  };
  ExpectRefused(with_message({{"role", "assistant"},
                              {"content", nullptr},
                              {"tool_calls", {{{"id", "1"}, {"type", "function"}}}}}),
                "messages", "messages[1].tool_calls");
  ExpectRefused(with_message({{"role", "user"}, {"content", "x"}, {"name", "bob"}}), "messages",
                "messages[1].name");
  ExpectRefused(with_message({{"role", "user"}, {"content", "x"}, {"colour", "red"}}),
                "messages", "Unrecognized request argument supplied: messages[1].colour");
  // What clients echo back from a response.
  ExpectOk(with_message({{"role", "assistant"},
                         {"content", "a"},
                         {"refusal", nullptr},
                         {"tool_calls", json::array()},
                         {"function_call", nullptr}}));
}

TEST_CASE("request fields: every implemented field is listed and parses", "[router]") {
  std::vector<std::string> chat = ImplementedFields(ApiKind::kChatCompletion);
  std::vector<std::string> completions = ImplementedFields(ApiKind::kCompletion);
  auto has = [](const std::vector<std::string>& v, const char* f) {
    return std::find(v.begin(), v.end(), f) != v.end();
  };
  for (const char* f : {"min_tokens", "logit_bias", "include_stop_str_in_output",
                        "skip_special_tokens", "truncate_prompt_tokens", "add_special_tokens",
                        "n", "user", "seed", "stop_token_ids"}) {
    CHECK(has(chat, f));
    CHECK(has(completions, f));
  }
  CHECK(has(completions, "echo"));
  CHECK_FALSE(has(chat, "echo"));
  CHECK(has(chat, "messages"));
  CHECK_FALSE(has(completions, "messages"));
}

TEST_CASE("request fields: sampling fields reach SamplingParams", "[router]") {
  Parsed p = Completion({{"max_tokens", 10},
                         {"min_tokens", 4},
                         {"logit_bias", {{"7", 100}, {"3", -50.5}}},
                         {"include_stop_str_in_output", true}});
  REQUIRE(p.request.ok());
  const SamplingParams& s = p.request->generate.sampling;
  CHECK(s.min_tokens == 4);
  CHECK(s.include_stop_str_in_output);
  REQUIRE(s.logit_bias.size() == 2);
  std::vector<std::pair<int32_t, float>> bias;
  for (const TokenBias& b : s.logit_bias) bias.emplace_back(b.token_id, b.bias);
  std::sort(bias.begin(), bias.end());
  CHECK(bias[0] == std::pair<int32_t, float>{3, -50.5f});
  CHECK(bias[1] == std::pair<int32_t, float>{7, 100.0f});

  const std::string vocab = std::to_string(Model().tokenizer.vocab_size());
  ExpectRefused(Completion({{"logit_bias", {{vocab, 1}}}}), "logit_bias", vocab);
  ExpectRefused(Completion({{"logit_bias", {{"-1", 1}}}}), "logit_bias");
  ExpectRefused(Completion({{"logit_bias", {{"x", 1}}}}), "logit_bias");
  ExpectRefused(Completion({{"logit_bias", {{"1", -100.5}}}}), "logit_bias");
  ExpectRefused(Completion({{"logit_bias", {{"1", "big"}}}}), "logit_bias");
  ExpectRefused(Completion({{"logit_bias", {{"1", 1}, {"01", 2}}}}), "logit_bias", "twice");
  ExpectRefused(Completion({{"logit_bias", {1, 2}}}), "logit_bias");
  ExpectRefused(Completion({{"min_tokens", 17}}), "min_tokens");  // > the default 16
  ExpectRefused(Completion({{"max_tokens", 3}, {"min_tokens", 4}}), "min_tokens");
  ExpectRefused(Completion({{"min_tokens", -1}}), "min_tokens");
  ExpectRefused(Completion({{"include_stop_str_in_output", "yes"}}),
                "include_stop_str_in_output");
}

TEST_CASE("request fields: prompt and output text options", "[router]") {
  const Tokenizer& tok = Model().tokenizer;
  Parsed plain = Completion({});
  REQUIRE(plain.request.ok());
  CHECK(plain.request->generate.prompt_token_ids == tok.Encode("hello world", true));
  CHECK(plain.request->skip_special_tokens);
  CHECK_FALSE(plain.request->echo.has_value());

  Parsed no_bos = Completion({{"add_special_tokens", false}});
  REQUIRE(no_bos.request.ok());
  CHECK(no_bos.request->generate.prompt_token_ids == tok.Encode("hello world", false));

  Parsed chat = Chat({});
  Parsed chat_bos = Chat({{"add_special_tokens", true}});
  REQUIRE(chat.request.ok());
  REQUIRE(chat_bos.request.ok());
  if (tok.bos_id()) {
    CHECK(chat_bos.request->generate.prompt_token_ids.size() ==
          chat.request->generate.prompt_token_ids.size() + 1);
  }

  std::vector<int32_t> full = tok.Encode("hello world", true);
  Parsed cut = Completion({{"truncate_prompt_tokens", 2}});
  REQUIRE(cut.request.ok());
  CHECK(cut.request->generate.prompt_token_ids ==
        std::vector<int32_t>(full.end() - 2, full.end()));
  Parsed long_cut = Completion({{"truncate_prompt_tokens", 1000}});
  REQUIRE(long_cut.request.ok());
  CHECK(long_cut.request->generate.prompt_token_ids == full);
  ExpectRefused(Completion({{"truncate_prompt_tokens", 0}}), "truncate_prompt_tokens");

  Parsed echo = Completion({{"echo", true}});
  REQUIRE(echo.request.ok());
  CHECK(echo.request->echo == std::optional<std::string>("hello world"));
  Parsed echo_ids = Completion({{"echo", true}, {"prompt", {5, 6, 7}}});
  REQUIRE(echo_ids.request.ok());
  CHECK(echo_ids.request->echo == tok.Decode(std::vector<int32_t>{5, 6, 7}, true));
  ExpectRefused(Completion({{"echo", true}, {"logprobs", 1}}), "echo", "logprobs");

  Parsed special = Chat({{"skip_special_tokens", false}, {"user", "alice"}});
  REQUIRE(special.request.ok());
  CHECK_FALSE(special.request->skip_special_tokens);
  CHECK(special.request->user == "alice");
  ExpectRefused(Chat({{"user", 5}}), "user");
  ExpectRefused(Chat({{"user", std::string(300, 'u')}}), "user");
  ExpectRefused(Chat({{"skip_special_tokens", 0}}), "skip_special_tokens");
}

TEST_CASE("request fields: n choices and stream options", "[router]") {
  Parsed p = Chat({{"n", 3},
                   {"seed", 10},
                   {"stream", true},
                   {"stream_options",
                    {{"include_usage", false}, {"continuous_usage_stats", true}}}});
  REQUIRE(p.request.ok());
  const ApiRequest& r = *p.request;
  CHECK(r.n == 3);
  CHECK(r.continuous_usage_stats);
  CHECK_FALSE(r.include_usage);
  GenerateRequest c0 = ChoiceRequest(r, 0), c2 = ChoiceRequest(r, 2);
  CHECK(c0.request_id == r.generate.request_id + "-0");
  CHECK(c2.request_id == r.generate.request_id + "-2");
  CHECK(*c0.sampling.seed == 10);
  CHECK(*c2.sampling.seed == 12);
  CHECK(c2.prompt_token_ids == r.generate.prompt_token_ids);

  Parsed one = Chat({{"seed", 10}});
  REQUIRE(one.request.ok());
  CHECK(ChoiceRequest(*one.request, 0).request_id == one.request->generate.request_id);
  ExpectRefused(Chat({{"stream", true}, {"stream_options", {{"continuous_usage_stats", 1}}}}),
                "stream_options", "continuous_usage_stats");
}

TEST_CASE("response shapes with several choices and continuous usage", "[router]") {
  Parsed p = Completion({{"n", 2}, {"stream", true},
                         {"stream_options", {{"continuous_usage_stats", true}}}});
  REQUIRE(p.request.ok());
  json out = json::parse(RenderResponse(
      *p.request, {ChoiceOutput{"a", "stop", {}}, ChoiceOutput{"b", "length", {}}}, Usage{3, 5}));
  REQUIRE(out["choices"].size() == 2);
  CHECK(out["choices"][1]["index"] == 1);
  CHECK(out["choices"][1]["text"] == "b");
  CHECK(out["choices"][1]["finish_reason"] == "length");
  CHECK(out["usage"]["total_tokens"] == 8);

  StreamDelta delta;
  delta.index = 1;
  delta.text = "x";
  delta.usage = Usage{3, 2};
  json chunk = json::parse(RenderChunk(*p.request, delta));
  CHECK(chunk["choices"][0]["index"] == 1);
  CHECK(chunk["usage"]["completion_tokens"] == 2);
  CHECK(chunk["usage"]["total_tokens"] == 5);
}

}  // namespace
}  // namespace tandem
