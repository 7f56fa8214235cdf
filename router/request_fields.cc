#include "router/request_fields.h"

#include <algorithm>
#include <string_view>

#include <nlohmann/json.hpp>

namespace tandem {

using json = nlohmann::json;

namespace {

enum Endpoints : int { kCompletions = 1, kChat = 2, kBoth = kCompletions | kChat };

enum class Handling {
  kImplemented,   // router/openai_api.cc reads it and gives it its effect
  kChatTemplate,  // read by the chat-template code of ParseApiRequest (the jinja part)
  kRefused,       // a feature Tandem lacks: only null or the value that asks for nothing
};

// True when a refused field's value asks for nothing (the neutral value). `body` is the whole
// request, for fields whose neutral value depends on another (best_of on n).
using AsksNothing = bool (*)(const json& value, const json& body);

bool Never(const json&, const json&) { return false; }
bool IsFalse(const json& v, const json&) { return v.is_boolean() && !v.get<bool>(); }
bool IsEmptyString(const json& v, const json&) {
  return v.is_string() && v.get<std::string>().empty();
}
bool IsEmptyList(const json& v, const json&) { return v.is_array() && v.empty(); }
bool IsNone(const json& v, const json&) { return v.is_string() && v.get<std::string>() == "none"; }
bool IsZero(const json& v, const json&) { return v.is_number() && v.get<double>() == 0.0; }
bool IsOne(const json& v, const json&) { return v.is_number() && v.get<double>() == 1.0; }
bool IsTextFormat(const json& v, const json&) {
  return v.is_object() && v.size() == 1 && v.contains("type") && v["type"] == "text";
}
bool IsTextModality(const json& v, const json&) {
  return v.is_array() && v.size() == 1 && v[0] == "text";
}
// best_of == n asks for n candidates and returns them all: what n alone does.
bool IsBestOfN(const json& v, const json& body) {
  if (!v.is_number_integer()) return false;
  auto n = body.find("n");
  const int64_t want = n == body.end() || n->is_null() || !n->is_number_integer()
                           ? 1
                           : n->get<int64_t>();
  return v.get<int64_t>() == want;
}

struct FieldRule {
  const char* name;
  int endpoints;
  Handling handling;
  AsksNothing asks_nothing = nullptr;  // kRefused only
  const char* why = nullptr;           // kRefused only: what is not supported
};

// clang-format off
constexpr FieldRule kRules[] = {
    // Both endpoints, implemented.
    {"model", kBoth, Handling::kImplemented},
    {"stream", kBoth, Handling::kImplemented},
    {"stream_options", kBoth, Handling::kImplemented},
    {"max_tokens", kBoth, Handling::kImplemented},
    {"min_tokens", kBoth, Handling::kImplemented},
    {"temperature", kBoth, Handling::kImplemented},
    {"top_p", kBoth, Handling::kImplemented},
    {"top_k", kBoth, Handling::kImplemented},
    {"min_p", kBoth, Handling::kImplemented},
    {"repetition_penalty", kBoth, Handling::kImplemented},
    {"presence_penalty", kBoth, Handling::kImplemented},
    {"frequency_penalty", kBoth, Handling::kImplemented},
    {"logit_bias", kBoth, Handling::kImplemented},
    {"seed", kBoth, Handling::kImplemented},
    {"stop", kBoth, Handling::kImplemented},
    {"stop_token_ids", kBoth, Handling::kImplemented},
    {"ignore_eos", kBoth, Handling::kImplemented},
    {"include_stop_str_in_output", kBoth, Handling::kImplemented},
    {"skip_special_tokens", kBoth, Handling::kImplemented},
    {"spaces_between_special_tokens", kBoth, Handling::kImplemented},  // false only
    {"add_special_tokens", kBoth, Handling::kImplemented},
    {"truncate_prompt_tokens", kBoth, Handling::kImplemented},
    {"logprobs", kBoth, Handling::kImplemented},
    {"n", kBoth, Handling::kImplemented},
    {"user", kBoth, Handling::kImplemented},
    // Completions only, implemented.
    {"prompt", kCompletions, Handling::kImplemented},
    {"echo", kCompletions, Handling::kImplemented},
    // Chat only, implemented.
    {"messages", kChat, Handling::kImplemented},
    {"max_completion_tokens", kChat, Handling::kImplemented},
    {"top_logprobs", kChat, Handling::kImplemented},
    // Chat template fields: parsed with the template (the jinja helper's part of issue 19).
    {"add_generation_prompt", kChat, Handling::kChatTemplate},
    {"continue_final_message", kChat, Handling::kChatTemplate},
    {"chat_template", kChat, Handling::kChatTemplate},
    {"chat_template_kwargs", kChat, Handling::kChatTemplate},
    // Refused on both: features Tandem does not have.
    {"best_of", kBoth, Handling::kRefused, IsBestOfN, "'best_of' other than n (ranking candidates) is not supported"},
    {"use_beam_search", kBoth, Handling::kRefused, IsFalse, "'use_beam_search' is not supported"},
    {"length_penalty", kBoth, Handling::kRefused, IsOne, "'length_penalty' (beam search) is not supported"},
    {"prompt_logprobs", kBoth, Handling::kRefused, Never, "'prompt_logprobs' is not supported"},
    {"allowed_token_ids", kBoth, Handling::kRefused, Never, "'allowed_token_ids' is not supported"},
    {"bad_words", kBoth, Handling::kRefused, IsEmptyList, "'bad_words' is not supported"},
    {"response_format", kBoth, Handling::kRefused, IsTextFormat, "'response_format' must be {\"type\": \"text\"}: JSON and schema output are not supported"},
    {"guided_json", kBoth, Handling::kRefused, Never, "'guided_json' (guided decoding) is not supported"},
    {"guided_regex", kBoth, Handling::kRefused, Never, "'guided_regex' (guided decoding) is not supported"},
    {"guided_choice", kBoth, Handling::kRefused, Never, "'guided_choice' (guided decoding) is not supported"},
    {"guided_grammar", kBoth, Handling::kRefused, Never, "'guided_grammar' (guided decoding) is not supported"},
    {"guided_decoding_backend", kBoth, Handling::kRefused, Never, "'guided_decoding_backend' (guided decoding) is not supported"},
    {"guided_whitespace_pattern", kBoth, Handling::kRefused, Never, "'guided_whitespace_pattern' (guided decoding) is not supported"},
    {"structural_tag", kBoth, Handling::kRefused, Never, "'structural_tag' (guided decoding) is not supported"},
    {"logits_processors", kBoth, Handling::kRefused, IsEmptyList, "'logits_processors' is not supported"},
    {"return_tokens_as_token_ids", kBoth, Handling::kRefused, IsFalse, "'return_tokens_as_token_ids' is not supported"},
    {"priority", kBoth, Handling::kRefused, IsZero, "'priority' is not supported (use the x-tandem-slo-class header)"},
    {"request_id", kBoth, Handling::kRefused, Never, "'request_id' is not supported: the server assigns ids"},
    {"store", kBoth, Handling::kRefused, IsFalse, "'store' is not supported"},
    {"metadata", kBoth, Handling::kRefused, Never, "'metadata' is not supported"},
    {"service_tier", kBoth, Handling::kRefused, Never, "'service_tier' is not supported"},
    // Completions only, refused.
    {"suffix", kCompletions, Handling::kRefused, IsEmptyString, "'suffix' (insertion) is not supported"},
    // Chat only, refused.
    {"echo", kChat, Handling::kRefused, IsFalse, "'echo' is not supported on /v1/chat/completions"},
    {"tools", kChat, Handling::kRefused, IsEmptyList, "'tools' (tool calling) is not supported"},
    {"tool_choice", kChat, Handling::kRefused, IsNone, "'tool_choice' must be \"none\": tool calling is not supported"},
    {"parallel_tool_calls", kChat, Handling::kRefused, Never, "'parallel_tool_calls' (tool calling) is not supported"},
    {"functions", kChat, Handling::kRefused, IsEmptyList, "'functions' (function calling) is not supported"},
    {"function_call", kChat, Handling::kRefused, IsNone, "'function_call' must be \"none\": function calling is not supported"},
    {"documents", kChat, Handling::kRefused, Never, "'documents' is not supported"},
    {"mm_processor_kwargs", kChat, Handling::kRefused, Never, "'mm_processor_kwargs' (multimodal input) is not supported"},
    {"modalities", kChat, Handling::kRefused, IsTextModality, "'modalities' other than [\"text\"] is not supported"},
    {"audio", kChat, Handling::kRefused, Never, "'audio' output is not supported"},
    {"prediction", kChat, Handling::kRefused, Never, "'prediction' (predicted outputs) is not supported"},
    {"reasoning_effort", kChat, Handling::kRefused, Never, "'reasoning_effort' is not supported"},
    {"web_search_options", kChat, Handling::kRefused, Never, "'web_search_options' is not supported"},
};
// clang-format on

int EndpointOf(ApiKind kind) { return kind == ApiKind::kChatCompletion ? kChat : kCompletions; }

const FieldRule* FindRule(int endpoint, std::string_view name) {
  for (const FieldRule& rule : kRules) {
    if ((rule.endpoints & endpoint) && name == rule.name) return &rule;
  }
  return nullptr;
}

Status Unrecognized(const std::string& field, std::string* param) {
  *param = field;
  return InvalidArgument("Unrecognized request argument supplied: " + field);
}

}  // namespace

Status CheckRequestFields(ApiKind kind, const json& body, std::string* param) {
  const int endpoint = EndpointOf(kind);
  for (const auto& [name, value] : body.items()) {
    const FieldRule* rule = FindRule(endpoint, name);
    if (rule == nullptr) return Unrecognized(name, param);
    if (rule->handling != Handling::kRefused || value.is_null()) continue;
    if (!rule->asks_nothing(value, body)) {
      *param = name;
      return InvalidArgument(rule->why);
    }
  }
  return Status::Ok();
}

Status CheckMessageFields(const json& message, size_t index, std::string* param) {
  const std::string where = "messages[" + std::to_string(index) + "].";
  for (const auto& [key, value] : message.items()) {
    // null is "not given", whatever the key (clients echo back e.g. "refusal": null).
    if (key == "role" || key == "content" || value.is_null()) continue;
    if (key == "tool_calls" && value.is_array() && value.empty()) continue;
    *param = "messages";
    if (key == "tool_calls" || key == "tool_call_id" || key == "function_call" || key == "name") {
      return InvalidArgument("'" + where + key + "' is not supported");
    }
    return InvalidArgument("Unrecognized request argument supplied: " + where + key);
  }
  return Status::Ok();
}

std::vector<std::string> ImplementedFields(ApiKind kind) {
  std::vector<std::string> out;
  for (const FieldRule& rule : kRules) {
    if ((rule.endpoints & EndpointOf(kind)) && rule.handling == Handling::kImplemented) {
      out.emplace_back(rule.name);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace tandem
