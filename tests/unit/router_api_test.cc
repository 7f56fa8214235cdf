// Router API: request parsing and validation (every bad field is a 400 naming it), the status
// to HTTP error mapping, and the OpenAI response shapes.
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "cluster/make_model_cli.h"
#include "common/model/make_model.h"
#include "router/errors.h"
#include "router/openai_api.h"
#include "tests/unit/test_util.h"
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

Parsed ParseCompletion(const json& body) {
  std::string param;
  StatusOr<ApiRequest> r = ParseApiRequest(ApiKind::kCompletion, body.dump(), Model(), &param);
  return Parsed{std::move(r), param};
}

Parsed ParseChat(const json& body) {
  std::string param;
  StatusOr<ApiRequest> r =
      ParseApiRequest(ApiKind::kChatCompletion, body.dump(), Model(), &param);
  return Parsed{std::move(r), param};
}

json Completion(json extra) {
  json body = {{"model", "tiny"}, {"prompt", "hello world"}};
  for (auto& [k, v] : extra.items()) body[k] = v;
  return body;
}

json Chat(json extra) {
  json body = {{"model", "tiny"},
               {"messages", json::array({{{"role", "user"}, {"content", "hi there"}}})}};
  for (auto& [k, v] : extra.items()) body[k] = v;
  return body;
}

// Expects a 400 naming `param`, with the OpenAI error body.
void ExpectBadField(const Parsed& parsed, const std::string& param) {
  INFO("expected a 400 naming " << param);
  REQUIRE_FALSE(parsed.request.ok());
  CHECK(parsed.request.status().code() == StatusCode::kInvalidArgument);
  CHECK(parsed.param == param);
  HttpError error = ErrorResponse(parsed.request.status(), parsed.param);
  CHECK(error.http_status == 400);
  json body = json::parse(error.body);
  CHECK(body["error"]["type"] == "invalid_request_error");
  CHECK(body["error"]["code"].is_null());
  CHECK_FALSE(body["error"]["message"].get<std::string>().empty());
  if (param.empty()) {
    CHECK(body["error"]["param"].is_null());
  } else {
    CHECK(body["error"]["param"] == param);
  }
}

TEST_CASE("completions body parses into a GenerateRequest", "[router]") {
  Parsed p = ParseCompletion(Completion({{"max_tokens", 5},
                                         {"temperature", 0},
                                         {"top_p", 0.9},
                                         {"top_k", 40},
                                         {"min_p", 0.05},
                                         {"repetition_penalty", 1.1},
                                         {"presence_penalty", 0.5},
                                         {"frequency_penalty", -0.5},
                                         {"seed", 42},
                                         {"stop", "\n"},
                                         {"logprobs", 3},
                                         {"ignore_eos", true},
                                         {"n", 1},
                                         {"stream", true},
                                         {"stream_options", {{"include_usage", true}}}}));
  REQUIRE(p.request.ok());
  const ApiRequest& r = *p.request;
  CHECK(r.kind == ApiKind::kCompletion);
  CHECK(r.generate.request_id.rfind("cmpl-", 0) == 0);
  CHECK(r.generate.model == "tiny");
  CHECK(r.generate.prompt_token_ids == Model().tokenizer.Encode("hello world", true));
  const SamplingParams& s = r.generate.sampling;
  CHECK(s.max_tokens == 5);
  CHECK(s.greedy());
  CHECK(s.top_p == Approx(0.9));
  CHECK(s.top_k == 40);
  CHECK(s.min_p == Approx(0.05));
  CHECK(s.repetition_penalty == Approx(1.1));
  CHECK(s.presence_penalty == Approx(0.5));
  CHECK(s.frequency_penalty == Approx(-0.5));
  REQUIRE(s.seed.has_value());
  CHECK(*s.seed == 42);
  CHECK(s.stop == std::vector<std::string>{"\n"});
  CHECK(s.logprobs);
  CHECK(s.top_logprobs == 3);
  CHECK(s.ignore_eos);
  CHECK(r.stream);
  CHECK(r.include_usage);
}

TEST_CASE("completions defaults and prompt forms", "[router]") {
  Parsed p = ParseCompletion(Completion({}));
  REQUIRE(p.request.ok());
  CHECK(p.request->generate.sampling.max_tokens == 16);  // OpenAI's default
  CHECK_FALSE(p.request->stream);
  CHECK_FALSE(p.request->generate.sampling.logprobs);

  Parsed ids = ParseCompletion(Completion({{"prompt", {1, 2, 3}}}));
  REQUIRE(ids.request.ok());
  CHECK(ids.request->generate.prompt_token_ids == std::vector<int32_t>{1, 2, 3});
  Parsed one = ParseCompletion(Completion({{"prompt", {"hello world"}}}));
  REQUIRE(one.request.ok());
  CHECK(one.request->generate.prompt_token_ids == Model().tokenizer.Encode("hello world", true));
  // Two ids differ.
  CHECK(ParseCompletion(Completion({})).request->generate.request_id !=
        ParseCompletion(Completion({})).request->generate.request_id);
}

TEST_CASE("chat body is templated and tokenized without extra specials", "[router]") {
  json messages = json::array({{{"role", "system"}, {"content", "be brief"}},
                               {{"role", "user"},
                                {"content", json::array({{{"type", "text"}, {"text", "hi"}}})}}});
  Parsed p = ParseChat(Chat({{"messages", messages},
                             {"max_completion_tokens", 7},
                             {"max_tokens", 3},
                             {"logprobs", true},
                             {"top_logprobs", 2}}));
  REQUIRE(p.request.ok());
  const ApiRequest& r = *p.request;
  CHECK(r.generate.request_id.rfind("chatcmpl-", 0) == 0);
  StatusOr<std::string> text =
      Model().chat_template.Render({{"system", "be brief"}, {"user", "hi"}}, true);
  REQUIRE(text.ok());
  CHECK(r.generate.prompt_token_ids == Model().tokenizer.Encode(*text, false));
  CHECK(r.generate.sampling.max_tokens == 7);  // max_completion_tokens wins
  CHECK(r.generate.sampling.logprobs);
  CHECK(r.generate.sampling.top_logprobs == 2);

  // Without a limit, chat may fill the context.
  Parsed d = ParseChat(Chat({}));
  REQUIRE(d.request.ok());
  CHECK(d.request->generate.sampling.max_tokens + d.request->generate.prompt_token_ids.size() ==
        static_cast<size_t>(kMaxModelLen));
}

TEST_CASE("each bad completions field is a 400 naming it", "[router]") {
  std::string long_prompt;
  for (int i = 0; i < 200; ++i) long_prompt += "word ";
  ExpectBadField(ParseCompletion(json{{"model", "tiny"}}), "prompt");
  ExpectBadField(ParseCompletion(json{{"prompt", "x"}}), "model");
  ExpectBadField(ParseCompletion(Completion({{"model", 7}})), "model");
  ExpectBadField(ParseCompletion(Completion({{"prompt", 5}})), "prompt");
  ExpectBadField(ParseCompletion(Completion({{"prompt", json::array()}})), "prompt");
  ExpectBadField(ParseCompletion(Completion({{"prompt", {"a", "b"}}})), "prompt");
  ExpectBadField(ParseCompletion(Completion({{"prompt", {1, -1}}})), "prompt");
  ExpectBadField(ParseCompletion(Completion({{"prompt", {1, 10000000}}})), "prompt");
  ExpectBadField(ParseCompletion(Completion({{"prompt", long_prompt}})), "prompt");
  ExpectBadField(ParseCompletion(Completion({{"max_tokens", 0}})), "max_tokens");
  ExpectBadField(ParseCompletion(Completion({{"max_tokens", 1.5}})), "max_tokens");
  ExpectBadField(ParseCompletion(Completion({{"max_tokens", "ten"}})), "max_tokens");
  ExpectBadField(ParseCompletion(Completion({{"max_tokens", kMaxModelLen}})), "max_tokens");
  ExpectBadField(ParseCompletion(Completion({{"temperature", 3}})), "temperature");
  ExpectBadField(ParseCompletion(Completion({{"temperature", "hot"}})), "temperature");
  ExpectBadField(ParseCompletion(Completion({{"temperature", -0.1}})), "temperature");
  ExpectBadField(ParseCompletion(Completion({{"top_p", 0}})), "top_p");
  ExpectBadField(ParseCompletion(Completion({{"top_p", 1.5}})), "top_p");
  ExpectBadField(ParseCompletion(Completion({{"top_k", -2}})), "top_k");
  ExpectBadField(ParseCompletion(Completion({{"min_p", 2}})), "min_p");
  ExpectBadField(ParseCompletion(Completion({{"repetition_penalty", 0}})), "repetition_penalty");
  ExpectBadField(ParseCompletion(Completion({{"presence_penalty", 3}})), "presence_penalty");
  ExpectBadField(ParseCompletion(Completion({{"frequency_penalty", -3}})), "frequency_penalty");
  ExpectBadField(ParseCompletion(Completion({{"seed", "x"}})), "seed");
  ExpectBadField(ParseCompletion(Completion({{"stop", 3}})), "stop");
  ExpectBadField(ParseCompletion(Completion({{"stop", {""}}})), "stop");
  ExpectBadField(ParseCompletion(Completion({{"stop", {"a", "b", "c", "d", "e"}}})), "stop");
  ExpectBadField(ParseCompletion(Completion({{"logprobs", 21}})), "logprobs");
  ExpectBadField(ParseCompletion(Completion({{"logprobs", true}})), "logprobs");
  ExpectBadField(ParseCompletion(Completion({{"n", 0}})), "n");
  ExpectBadField(ParseCompletion(Completion({{"n", kMaxChoices + 1}})), "n");
  ExpectBadField(ParseCompletion(Completion({{"best_of", 3}})), "best_of");
  ExpectBadField(ParseCompletion(Completion({{"echo", 1}})), "echo");
  ExpectBadField(ParseCompletion(Completion({{"stream", "yes"}})), "stream");
  ExpectBadField(ParseCompletion(Completion({{"ignore_eos", 1}})), "ignore_eos");
  ExpectBadField(ParseCompletion(Completion({{"stream_options", {{"include_usage", true}}}})),
                 "stream_options");
  ExpectBadField(ParseCompletion(Completion({{"stop_token_ids", {-4}}})), "stop_token_ids");
  ExpectBadField(ParseCompletion(Completion({{"logit_bias", {{"5", 101}}}})), "logit_bias");
}

TEST_CASE("each bad chat field is a 400 naming it", "[router]") {
  std::string long_text;
  for (int i = 0; i < 200; ++i) long_text += "word ";
  ExpectBadField(ParseChat(json{{"model", "tiny"}}), "messages");
  ExpectBadField(ParseChat(Chat({{"messages", json::array()}})), "messages");
  ExpectBadField(ParseChat(Chat({{"messages", "hi"}})), "messages");
  ExpectBadField(ParseChat(Chat({{"messages", {{{"role", "tool"}, {"content", "x"}}}}})),
                 "messages");
  ExpectBadField(ParseChat(Chat({{"messages", {{{"role", "user"}}}}})), "messages");
  ExpectBadField(ParseChat(Chat({{"messages", {{{"role", "user"}, {"content", 5}}}}})),
                 "messages");
  ExpectBadField(ParseChat(Chat({{"messages", {{{"role", "user"}, {"content", long_text}}}}})),
                 "messages");
  ExpectBadField(ParseChat(Chat({{"logprobs", 3}})), "logprobs");
  ExpectBadField(ParseChat(Chat({{"top_logprobs", 2}})), "top_logprobs");
  ExpectBadField(ParseChat(Chat({{"logprobs", true}, {"top_logprobs", 21}})), "top_logprobs");
  ExpectBadField(ParseChat(Chat({{"max_completion_tokens", 0}})), "max_completion_tokens");
  ExpectBadField(ParseChat(Chat({{"max_tokens", -1}})), "max_tokens");
  ExpectBadField(ParseChat(Chat({{"n", -1}})), "n");
  ExpectBadField(ParseChat(Chat({{"tools", {{{"type", "function"}}}}})), "tools");
  ExpectBadField(ParseChat(Chat({{"response_format", {{"type", "json_object"}}}})),
                 "response_format");
  ExpectBadField(ParseChat(Chat({{"temperature", 2.5}})), "temperature");
}

TEST_CASE("malformed bodies and unknown models", "[router]") {
  std::string param = "x";
  StatusOr<ApiRequest> r = ParseApiRequest(ApiKind::kCompletion, "{not json", Model(), &param);
  ExpectBadField(Parsed{std::move(r), param}, "");
  r = ParseApiRequest(ApiKind::kCompletion, "[1,2]", Model(), &param);
  ExpectBadField(Parsed{std::move(r), param}, "");

  Parsed unknown = ParseChat(Chat({{"model", "gpt-9"}}));
  REQUIRE_FALSE(unknown.request.ok());
  CHECK(unknown.request.status().code() == StatusCode::kNotFound);
  CHECK(unknown.param == "model");
  HttpError error = ErrorResponse(unknown.request.status(), unknown.param);
  CHECK(error.http_status == 404);
  json body = json::parse(error.body);
  CHECK(body["error"]["param"] == "model");
  CHECK(body["error"]["code"] == "model_not_found");
}

TEST_CASE("status to HTTP error mapping", "[router]") {
  struct Case {
    Status status;
    int http;
    bool retryable;
    bool retry_after;
  };
  std::vector<Case> cases = {
      {InvalidArgument("x"), 400, false, false},    {NotFound("x"), 404, false, false},
      {TooLarge("x"), 413, false, false},           {ResourceExhausted("x"), 429, true, true},
      {Unavailable("x"), 503, true, true},          {DeadlineExceeded("x"), 504, true, false},
      {Internal("x"), 500, true, false},            {FailedPrecondition("x"), 500, false, false},
      {Cancelled("x"), 499, false, false},
  };
  for (const Case& c : cases) {
    INFO(c.status.ToString());
    HttpError e = ErrorResponse(c.status);
    CHECK(e.http_status == c.http);
    CHECK(e.retryable == c.retryable);
    CHECK(IsRetryable(c.status.code()) == c.retryable);
    CHECK(e.retry_after_s.has_value() == c.retry_after);
    json body = json::parse(e.body);
    CHECK(body["error"]["message"] == "x");
    CHECK(body["error"].contains("type"));
    CHECK(body["error"]["param"].is_null());
  }
  CHECK(ErrorResponse(Status::Ok()).http_status == 500);
  // Client bytes that are not UTF-8 do not break the body.
  json body = json::parse(ErrorResponse(InvalidArgument("bad \xff byte"), "stop").body);
  CHECK(body["error"]["param"] == "stop");
}

ApiRequest MakeRequest(ApiKind kind, bool logprobs, int top) {
  ApiRequest r;
  r.kind = kind;
  r.generate.request_id = kind == ApiKind::kChatCompletion ? "chatcmpl-1" : "cmpl-1";
  r.generate.model = "tiny";
  r.generate.sampling.logprobs = logprobs;
  r.generate.sampling.top_logprobs = top;
  r.created = 1700000000;
  return r;
}

TEST_CASE("non-streaming response shapes", "[router]") {
  ApiRequest chat = MakeRequest(ApiKind::kChatCompletion, false, 0);
  json c = json::parse(RenderResponse(chat, "hello", "stop", {}, Usage{5, 2}));
  CHECK(c["id"] == "chatcmpl-1");
  CHECK(c["object"] == "chat.completion");
  CHECK(c["created"] == 1700000000);
  CHECK(c["model"] == "tiny");
  REQUIRE(c["choices"].size() == 1);
  CHECK(c["choices"][0]["index"] == 0);
  CHECK(c["choices"][0]["message"]["role"] == "assistant");
  CHECK(c["choices"][0]["message"]["content"] == "hello");
  CHECK(c["choices"][0]["finish_reason"] == "stop");
  CHECK(c["choices"][0]["logprobs"].is_null());
  CHECK(c["usage"] == json({{"prompt_tokens", 5}, {"completion_tokens", 2}, {"total_tokens", 7}}));

  ApiRequest cmpl = MakeRequest(ApiKind::kCompletion, false, 0);
  json t = json::parse(RenderResponse(cmpl, "abc", "length", {}, Usage{3, 4}));
  CHECK(t["object"] == "text_completion");
  CHECK(t["choices"][0]["text"] == "abc");
  CHECK(t["choices"][0]["finish_reason"] == "length");
  CHECK(t["usage"]["total_tokens"] == 7);
}

TEST_CASE("logprobs in the OpenAI formats", "[router]") {
  const Tokenizer& tok = Model().tokenizer;
  std::vector<int32_t> ids = tok.Encode(" hello world", false);
  REQUIRE(ids.size() >= 2);
  std::vector<GeneratedToken> events;
  for (int32_t id : ids) events.push_back(GeneratedToken{id, -0.5f, {{id, -0.5f}, {0, -2.0f}}});
  std::vector<LogprobToken> lp = MakeLogprobTokens(tok, events, 0);
  REQUIRE(lp.size() == ids.size());
  std::string joined;
  for (const auto& t : lp) {
    CHECK(t.text_offset == joined.size());
    joined += t.token;
  }
  CHECK(joined == " hello world");

  json chat = json::parse(
      RenderResponse(MakeRequest(ApiKind::kChatCompletion, true, 2), joined, "stop", lp, {}));
  json content = chat["choices"][0]["logprobs"]["content"];
  REQUIRE(content.size() == ids.size());
  CHECK(content[0]["token"] == lp[0].token);
  CHECK(content[0]["logprob"].get<double>() == Approx(-0.5));
  CHECK(content[0]["bytes"].is_array());
  CHECK(content[0]["bytes"].size() == lp[0].token.size());
  CHECK(content[0]["top_logprobs"].size() == 2);
  CHECK(content[0]["top_logprobs"][1]["logprob"].get<double>() == Approx(-2.0));

  json cmpl = json::parse(
      RenderResponse(MakeRequest(ApiKind::kCompletion, true, 2), joined, "stop", lp, {}));
  json l = cmpl["choices"][0]["logprobs"];
  CHECK(l["tokens"].size() == ids.size());
  CHECK(l["token_logprobs"].size() == ids.size());
  CHECK(l["text_offset"][1] == lp[1].text_offset);
  CHECK(l["top_logprobs"][0].is_object());
  CHECK(l["top_logprobs"][0].size() == 2);
}

TEST_CASE("streaming chunk shapes", "[router]") {
  ApiRequest chat = MakeRequest(ApiKind::kChatCompletion, false, 0);
  chat.stream = true;
  chat.include_usage = true;
  StreamDelta role;
  role.role_chunk = true;
  json first = json::parse(RenderChunk(chat, role));
  CHECK(first["object"] == "chat.completion.chunk");
  CHECK(first["choices"][0]["delta"] == json({{"role", "assistant"}, {"content", ""}}));
  CHECK(first["choices"][0]["finish_reason"].is_null());
  CHECK(first.contains("usage"));
  CHECK(first["usage"].is_null());

  StreamDelta text;
  text.text = "hi";
  json mid = json::parse(RenderChunk(chat, text));
  CHECK(mid["choices"][0]["delta"] == json({{"content", "hi"}}));

  StreamDelta last;
  last.finish_reason = "length";
  json end = json::parse(RenderChunk(chat, last));
  CHECK(end["choices"][0]["delta"] == json::object());
  CHECK(end["choices"][0]["finish_reason"] == "length");

  json usage = json::parse(RenderUsageChunk(chat, Usage{4, 6}));
  CHECK(usage["choices"] == json::array());
  CHECK(usage["usage"]["total_tokens"] == 10);

  ApiRequest cmpl = MakeRequest(ApiKind::kCompletion, false, 0);
  cmpl.stream = true;
  json c = json::parse(RenderChunk(cmpl, text));
  CHECK(c["object"] == "text_completion");
  CHECK(c["choices"][0]["text"] == "hi");
  CHECK_FALSE(c.contains("usage"));  // only with include_usage

  json models = json::parse(RenderModels(Model()));
  CHECK(models["object"] == "list");
  REQUIRE(models["data"].size() == 1);
  CHECK(models["data"][0]["id"] == "tiny");
  CHECK(models["data"][0]["object"] == "model");
}

}  // namespace
}  // namespace tandem
