// The Jinja interpreter (common/text/jinja) and ChatTemplate: errors with line numbers, limits,
// the chat template options. The hidden [.jinja_cases] case is driven by
// tests/python/test_jinja_templates.py and test_chat_template_hf.py, which render templates with
// jinja2 as transformers does and compare: it reads $TANDEM_TEST_DIR/jinja_cases.json
// ([{template, context, bos, eos, add_generation_prompt?}]) and writes jinja_results.json
// ([{out} or {error}]).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/text/chat_template.h"
#include "common/text/jinja/template.h"
#include "router/openai_api.h"
#include "tests/unit/tiny_model.h"

namespace tandem {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

StatusOr<std::string> RenderJinja(std::string_view source,
                                  std::vector<std::pair<std::string, jinja::Value>> globals = {},
                                  jinja::Limits limits = jinja::Limits()) {
  TANDEM_ASSIGN_OR_RETURN(jinja::Template t, jinja::Template::Parse(source));
  return t.Render(globals, limits);
}

std::string Rendered(std::string_view source) {
  StatusOr<std::string> out = RenderJinja(source);
  INFO((out.ok() ? std::string("ok") : out.status().ToString()));
  REQUIRE(out.ok());
  return *out;
}

std::string ErrorOf(std::string_view source, jinja::Limits limits = jinja::Limits()) {
  StatusOr<std::string> out = RenderJinja(source, {}, limits);
  REQUIRE_FALSE(out.ok());
  CHECK(out.status().code() == StatusCode::kInvalidArgument);
  return out.status().message();
}

TEST_CASE("jinja: whitespace control as transformers sets it", "[jinja]") {
  CHECK(Rendered("  {% if true %}\n  x\n  {% endif %}\n  {{ 1 }}  {% if true %}y{% endif %}\n") ==
        "  x\n  1  y");
  CHECK(Rendered("a  {%- if true -%}  b  {%- endif %}\n") == "ab");
  CHECK(Rendered("{%+ if true %}x{% endif +%}\ny") == "x\ny");
  CHECK(Rendered("a\n{# note #}\nb") == "a\nb");
  CHECK(Rendered("{% raw %}{{ x }}{% endraw %}") == "{{ x }}");
  CHECK(Rendered("a\r\nb\r\n") == "a\nb");
}

TEST_CASE("jinja: scoping, loops and namespaces", "[jinja]") {
  CHECK(Rendered("{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + 10 %}{{ x }}{% endfor %}{{ x }}") ==
        "11111");
  CHECK(Rendered("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}"
                 "{% endfor %}{{ ns.n }}") == "6");
  CHECK(Rendered("{% for x in 'ab' %}{{ loop.index }}{{ loop.revindex0 }}{{ loop.first }}"
                 "{{ loop.last }}{{ loop.length }}{% endfor %}") == "11TrueFalse220FalseTrue2");
  CHECK(Rendered("{% for k, v in {'a': 1, 'b': 2}.items() if v > 1 %}{{ k }}={{ v }}{% else %}"
                 "none{% endfor %}") == "b=2");
  CHECK(Rendered("{% for x in [] %}x{% else %}empty{% endfor %}") == "empty");
  CHECK(Rendered("{% macro m(a, b='B') %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}{{ m(2, b=3) }}") ==
        "1B23");
}

TEST_CASE("jinja: Python values print as Python prints them", "[jinja]") {
  CHECK(Rendered("{{ [1, 'a', None, True, 1.5, {'k': (1,)}] }}") ==
        "[1, 'a', None, True, 1.5, {'k': (1,)}]");
  CHECK(Rendered("{{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 1e-05 }} {{ 0.1 + 0.2 }}") ==
        "1e+16 1000000000000000.0 0.0001 1e-05 0.30000000000000004");
  CHECK(Rendered("{{ {'a': 'é\\n', 'b': [1, none]}|tojson }}") ==
        "{\"a\": \"é\\n\", \"b\": [1, null]}");
  CHECK(Rendered("{{ [1]|tojson(indent=2) }}") == "[\n  1\n]");
  CHECK(Rendered("{{ 'x'|tojson(ensure_ascii=true) }}{{ 'é'|tojson(ensure_ascii=true) }}") ==
        "\"x\"\"\\u00e9\"");
  CHECK(Rendered("{{ 7 // -2 }} {{ -7 % 3 }} {{ 2 ** 3 ** 2 }} {{ 'héllo'[1:3] }}") == "-4 2 64 él");
  // Case mapping of ill-formed UTF-8 (a fuzz find: the length query under-counted and the
  // conversion read past its buffer): each bad byte becomes U+FFFD, the same on every render.
  const std::string bad = "{{ '\xce\xa3\xce\x91\xce\xe3'.lower() }}{{ 'a\xff" "B'|upper }}";
  CHECK(Rendered(bad) == "\xcf\x83\xce\xb1\xef\xbf\xbd\xef\xbf\xbd" "A\xef\xbf\xbd" "B");
  CHECK(Rendered(bad) == Rendered(bad));
}

TEST_CASE("jinja: undefined values behave as jinja2's Undefined", "[jinja]") {
  CHECK(Rendered("[{{ nothing }}]{{ nothing is defined }}{{ nothing|length }}{{ 'a' in nothing }}") ==
        "[]False0False");
  CHECK(Rendered("{{ {}.missing is defined }}") == "False");
  CHECK(ErrorOf("{{ nothing.attr }}") == "line 1: 'nothing' is undefined");
  CHECK(ErrorOf("x\n{{ {}.a.b }}") == "line 2: 'dict object' has no attribute 'a'");
  CHECK(ErrorOf("{{ nothing + 1 }}").find("'nothing' is undefined") != std::string::npos);
}

TEST_CASE("jinja: syntax and runtime errors name the line", "[jinja]") {
  auto parse_error = [](std::string_view source) {
    StatusOr<jinja::Template> t = jinja::Template::Parse(source);
    REQUIRE_FALSE(t.ok());
    CHECK(t.status().code() == StatusCode::kInvalidArgument);
    return t.status().message();
  };
  CHECK(parse_error("a\n{{ 1 + }}").rfind("line 2: ", 0) == 0);
  CHECK(parse_error("{% if x %}\n\nno end") ==
        "line 3: unexpected end of template: the 'if' block opened on line 1 needs 'elif', "
        "'else' or 'endif'");
  CHECK(parse_error("\n\n{% endfor %}") == "line 3: encountered unknown tag 'endfor'");
  CHECK(parse_error("{% include 'x' %}") == "line 1: the 'include' tag is not supported");
  CHECK(parse_error("{{ 'abc }}") == "line 1: unterminated string");
  CHECK(parse_error("{# open") == "line 1: missing end of comment tag");
  CHECK(parse_error("{{ (1 }}").find("expected ')'") != std::string::npos);
  CHECK(parse_error("{{ " + std::string(1000, '(') + "1" + std::string(1000, ')') + " }}")
            .find("nests deeper") != std::string::npos);
  CHECK(parse_error("{{ 1" + std::string(5000, '+') + "}}").find("line 1") == 0);
  std::string long_chain = "{{ 1";
  for (int i = 0; i < 5000; ++i) long_chain += " + 1";
  CHECK(parse_error(long_chain + " }}").find("nests deeper") != std::string::npos);

  CHECK(ErrorOf("\n\n{{ 'a' + 1 }}") == "line 3: can only concatenate str (not \"int\") to str");
  CHECK(ErrorOf("{{ 1 / 0 }}") == "line 1: division by zero");
  CHECK(ErrorOf("{{ [1] | nosuchfilter }}") == "line 1: no filter named 'nosuchfilter'");
  CHECK(ErrorOf("{{ 1 is nosuchtest }}") == "line 1: no test named 'nosuchtest'");
  CHECK(ErrorOf("{{ [].append(1) }}").find("unsafe") != std::string::npos);
  CHECK(ErrorOf("{% set x = 1 %}{% set x.a = 2 %}").find("non-namespace") != std::string::npos);
  // raise_exception's message is the whole error, as transformers shows it.
  CHECK(ErrorOf("{% if true %}\n{{ raise_exception('Roles must alternate') }}{% endif %}") ==
        "Roles must alternate");
}

TEST_CASE("jinja: limits are errors, never hangs or crashes", "[jinja]") {
  CHECK(ErrorOf("{{ range(100001)|length }}").find("Range too big") != std::string::npos);
  jinja::Limits small;
  small.max_steps = 10000;
  CHECK(ErrorOf("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", small)
            .find("steps") != std::string::npos);
  small = jinja::Limits();
  small.max_output_bytes = 1000;
  CHECK(ErrorOf("{{ 'x' * 2000 }}", small).find("size limit") != std::string::npos);
  CHECK(ErrorOf("{% for i in range(100) %}{{ 'xxxxxxxxxxxxxxxxxxxx' }}{% endfor %}", small)
            .find("size limit") != std::string::npos);
  CHECK(ErrorOf("{% set ns = namespace(s='xx') %}{% for i in range(100) %}{% set ns.s = ns.s + ns.s %}"
                "{% endfor %}")
            .find("size limit") != std::string::npos);
  CHECK(ErrorOf("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("deeper") !=
        std::string::npos);
  CHECK(ErrorOf("{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = [ns.l] %}"
                "{% endfor %}")
            .find("nests deeper") != std::string::npos);
  CHECK(ErrorOf("{{ 9223372036854775807 + 1 }}").find("overflow") != std::string::npos);
  // A namespace that holds itself is freed (ASan's leak check in the fuzz build).
  CHECK(Rendered("{% set ns = namespace() %}{% set ns.me = ns %}ok") == "ok");
  CHECK(ErrorOf("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}").find("nests too deeply") !=
        std::string::npos);
}

TEST_CASE("chat template: options and selection", "[chat_template]") {
  ChatSpecialTokens tokens{"<s>", "</s>", "", ""};
  StatusOr<ChatTemplate> t = ChatTemplate::Create(kChatmlChatTemplate, "test", tokens);
  REQUIRE(t.ok());
  auto text = t->Render({{"user", "Hi"}}, false);
  REQUIRE(text.ok());
  CHECK(*text ==
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");

  ChatRenderOptions cont;
  cont.add_generation_prompt = false;
  cont.continue_final_message = true;
  auto open = t->Render(ChatTemplate::MessagesValue({{"user", "Hi"}, {"assistant", "Once upon "}}), cont);
  REQUIRE(open.ok());
  CHECK(open->size() >= 9);
  CHECK(open->substr(open->size() - 9) == "Once upon");
  cont.add_generation_prompt = true;
  CHECK(t->Render(ChatTemplate::MessagesValue({{"user", "Hi"}}), cont).status().code() ==
        StatusCode::kInvalidArgument);

  StatusOr<ChatTemplate> kw = ChatTemplate::Create(
      "{{ bos_token }}{{ greeting }}{% if enable_thinking is defined %}T{% endif %}{{ tools }}", "kw", tokens);
  REQUIRE(kw.ok());
  ChatRenderOptions options;
  options.kwargs.emplace_back("greeting", jinja::Value::String("hello"));
  options.kwargs.emplace_back("bos_token", jinja::Value::String("[B]"));
  auto with_kwargs = kw->Render(ChatTemplate::MessagesValue({}), options);
  REQUIRE(with_kwargs.ok());
  CHECK(*with_kwargs == "[B]helloNone");  // kwargs override the special tokens; tools is None
  options.kwargs.emplace_back("messages", jinja::Value::None());
  CHECK(kw->Render(ChatTemplate::MessagesValue({}), options).status().message().find("messages") !=
        std::string::npos);

  StatusOr<ChatTemplate> none = ChatTemplate::Select("auto", "", tokens);
  REQUIRE(none.ok());
  CHECK_FALSE(none->available());
  CHECK(none->Render({{"user", "x"}}, true).status().code() == StatusCode::kFailedPrecondition);
  CHECK_FALSE(ChatTemplate::Select("none", kChatmlChatTemplate, tokens)->available());
  CHECK(ChatTemplate::Select("auto", kChatmlChatTemplate, tokens)->available());
  StatusOr<ChatTemplate> missing = ChatTemplate::Select("/nonexistent/t.jinja", "", tokens);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message().find("/nonexistent/t.jinja") != std::string::npos);
  StatusOr<ChatTemplate> bad = ChatTemplate::Create("{% for %}", "my.jinja", tokens);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("my.jinja") != std::string::npos);
  CHECK(bad.status().message().find("line 1") != std::string::npos);
}

TEST_CASE("chat template: the router's request fields", "[chat_template]") {
  const ServedModel& model = test::TinyServedModel();
  auto parse = [&](json extra, std::string* param) {
    json body = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 1}};
    for (auto it = extra.begin(); it != extra.end(); ++it) body[it.key()] = it.value();
    return ParseApiRequest(ApiKind::kChatCompletion, body.dump(), model, param);
  };
  auto prompt_of = [&](std::vector<ChatMessage> messages, bool gen) {
    StatusOr<std::string> text = model.chat_template.Render(messages, gen);
    REQUIRE(text.ok());
    return model.tokenizer.Encode(*text, false);
  };
  std::string param;
  StatusOr<ApiRequest> plain = parse(json::object(), &param);
  REQUIRE(plain.ok());
  CHECK(plain->generate.prompt_token_ids == prompt_of({{"user", "Hi"}}, true));
  StatusOr<ApiRequest> no_gen = parse({{"add_generation_prompt", false}}, &param);
  REQUIRE(no_gen.ok());
  CHECK(no_gen->generate.prompt_token_ids == prompt_of({{"user", "Hi"}}, false));

  StatusOr<ApiRequest> both = parse({{"continue_final_message", true}}, &param);
  REQUIRE_FALSE(both.ok());
  CHECK(param == "continue_final_message");
  CHECK(both.status().message().find("add_generation_prompt") != std::string::npos);

  StatusOr<ApiRequest> own = parse({{"chat_template", "{% for m in messages %}<{{ m.content }}>{% endfor %}{{ x }}"},
                                    {"chat_template_kwargs", {{"x", "!"}}}},
                                   &param);
  REQUIRE(own.ok());
  CHECK(own->generate.prompt_token_ids == model.tokenizer.Encode("<Hi>!", false));

  CHECK_FALSE(parse({{"chat_template", "{% if %}"}}, &param).ok());
  CHECK(param == "chat_template");
  CHECK_FALSE(parse({{"chat_template", 3}}, &param).ok());
  CHECK(param == "chat_template");
  CHECK_FALSE(parse({{"chat_template_kwargs", json::array()}}, &param).ok());
  CHECK(param == "chat_template_kwargs");
  CHECK_FALSE(parse({{"chat_template_kwargs", {{"messages", 1}}}}, &param).ok());
  CHECK(param == "chat_template_kwargs");
  StatusOr<ApiRequest> raised = parse({{"chat_template", "{{ raise_exception('no users here') }}"}}, &param);
  REQUIRE_FALSE(raised.ok());
  CHECK(param == "messages");
  CHECK(raised.status().message() == "no users here");
}

TEST_CASE("Jinja templates match jinja2", "[.jinja_cases]") {
  const char* dir = std::getenv("TANDEM_TEST_DIR");
  if (dir == nullptr) {
    WARN("TANDEM_TEST_DIR is not set; skipping (run through tests/python/test_jinja_templates.py)");
    return;
  }
  std::ifstream in(std::filesystem::path(dir) / "jinja_cases.json");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  const ordered_json cases = ordered_json::parse(buffer.str());  // keeps the dicts' key order
  json results = json::array();
  for (const ordered_json& c : cases) {
    ChatSpecialTokens tokens;
    tokens.bos = c.value("bos", "");
    tokens.eos = c.value("eos", "");
    StatusOr<ChatTemplate> t = ChatTemplate::Create(c.at("template").get<std::string>(), "case", tokens);
    if (!t.ok()) {
      results.push_back({{"error", t.status().message()}});
      continue;
    }
    ChatRenderOptions options;
    options.add_generation_prompt = c.value("add_generation_prompt", false);
    options.continue_final_message = c.value("continue_final_message", false);
    jinja::Value messages = jinja::Value::List({});
    if (c.contains("tools")) options.tools = *jinja::Value::FromJson(c.at("tools"));
    for (auto it = c.at("context").begin(); it != c.at("context").end(); ++it) {
      jinja::Value v = *jinja::Value::FromJson(it.value());
      if (it.key() == "messages") messages = v;
      else options.kwargs.emplace_back(it.key(), v);
    }
    StatusOr<std::string> out = t->Render(messages, options);
    if (out.ok()) results.push_back({{"out", *out}});
    else results.push_back({{"error", out.status().message()}});
  }
  std::ofstream(std::filesystem::path(dir) / "jinja_results.json")
      << results.dump(-1, ' ', false, json::error_handler_t::replace);
  std::printf("jinja_cases: %zu rendered\n", results.size());
}

}  // namespace
}  // namespace tandem
