// Fuzzes the Jinja interpreter (common/text/jinja/template.h) on template sources: parse, then
// render with a fixed chat context (messages with string and list contents, tools, special
// tokens) under small limits. Properties: nothing crashes, hangs or leaks; every refusal is
// InvalidArgument with a message; an output respects the size limit; rendering twice gives the
// same result (no state leaks between renders).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/text/jinja/template.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using namespace tandem;

const std::vector<std::pair<std::string, jinja::Value>>& Globals() {
  static const auto* globals = [] {
    const auto messages = nlohmann::json::parse(R"([
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi 😀"}, {"type": "image"}]},
      {"role": "assistant", "content": null,
       "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
      {"role": "tool", "content": "{\"ok\": true}"},
      {"role": "user", "content": "  And 2+2?\n"}])");
    const auto tools = nlohmann::json::parse(
        R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])");
    auto* g = new std::vector<std::pair<std::string, jinja::Value>>{
        {"messages", *jinja::Value::FromJson(messages)},
        {"tools", *jinja::Value::FromJson(tools)},
        {"add_generation_prompt", jinja::Value::Bool(true)},
        {"bos_token", jinja::Value::String("<s>")},
        {"eos_token", jinja::Value::String("</s>")}};
    return g;
  }();
  return *globals;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 16 << 10) return 0;
  std::string_view source(reinterpret_cast<const char*>(data), size);
  StatusOr<jinja::Template> t = jinja::Template::Parse(source);
  if (!t.ok()) {
    FUZZ_CHECK(t.status().code() == StatusCode::kInvalidArgument, t.status().ToString().c_str());
    FUZZ_CHECK(!t.status().message().empty(), "a parse error without a message");
    return 0;
  }
  jinja::Limits limits;
  limits.max_steps = 100'000;
  limits.max_output_bytes = 1 << 20;
  limits.max_range = 10'000;
  StatusOr<std::string> out = t->Render(Globals(), limits);
  if (!out.ok()) {
    FUZZ_CHECK(out.status().code() == StatusCode::kInvalidArgument, out.status().ToString().c_str());
    return 0;
  }
  FUZZ_CHECK(out->size() <= limits.max_output_bytes, "an output beyond the size limit");
  if (source.find("strftime_now") == std::string_view::npos &&
      source.find("changed") == std::string_view::npos) {
    StatusOr<std::string> again = t->Render(Globals(), limits);
    FUZZ_CHECK(again.ok() && *again == *out, "a second render differs");
  }
  return 0;
}
