#include "router/openai_api.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <random>

#include <nlohmann/json.hpp>

#include "common/model/checkpoint.h"
#include "common/model/model_config.h"
#include "router/request_fields.h"

namespace tandem {

using json = nlohmann::json;

namespace {

constexpr size_t kMaxUserBytes = 256;

// Tracks which field a parse error is about, so that the caller can name it in the 400 body.
struct Parser {
  const json& body;
  std::string* param;

  Status Fail(std::string field, std::string message) {
    *param = field;
    return InvalidArgument(std::move(message));
  }

  // nullptr when the field is absent or null (OpenAI clients send null for "unset").
  const json* Find(const char* field) {
    auto it = body.find(field);
    if (it == body.end() || it->is_null()) return nullptr;
    return &*it;
  }

  Status GetBool(const char* field, bool* out) {
    const json* v = Find(field);
    if (!v) return Status::Ok();
    if (!v->is_boolean()) return Fail(field, std::string("'") + field + "' must be a boolean");
    *out = v->get<bool>();
    return Status::Ok();
  }

  Status GetFloat(const char* field, float* out) {
    const json* v = Find(field);
    if (!v) return Status::Ok();
    if (!v->is_number()) return Fail(field, std::string("'") + field + "' must be a number");
    double d = v->get<double>();
    if (!std::isfinite(d) || std::fabs(d) > 1e30) {
      return Fail(field, std::string("'") + field + "' is out of range");
    }
    *out = static_cast<float>(d);
    return Status::Ok();
  }

  Status GetInt(const char* field, std::optional<int64_t>* out) {
    const json* v = Find(field);
    if (!v) return Status::Ok();
    if (v->is_number_unsigned()) {
      uint64_t u = v->get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Fail(field, std::string("'") + field + "' is out of range");
      }
      *out = static_cast<int64_t>(u);
      return Status::Ok();
    }
    if (!v->is_number_integer()) {
      return Fail(field, std::string("'") + field + "' must be an integer");
    }
    *out = v->get<int64_t>();
    return Status::Ok();
  }

  Status GetInt32(const char* field, int64_t min, int64_t max, std::optional<int32_t>* out) {
    std::optional<int64_t> value;
    TANDEM_RETURN_IF_ERROR(GetInt(field, &value));
    if (!value) return Status::Ok();
    if (*value < min || *value > max) {
      return Fail(field, std::string("'") + field + "' must be in [" + std::to_string(min) +
                             ", " + std::to_string(max) + "], got " + std::to_string(*value));
    }
    *out = static_cast<int32_t>(*value);
    return Status::Ok();
  }
};

// The field named by a SamplingParams::Validate() message ("temperature must be ...").
std::string FieldOfSamplingError(const Status& status) {
  const std::string& message = status.message();
  size_t end = message.find_first_of(" :");
  return message.substr(0, end);
}

Status ParseStop(Parser& p, std::vector<std::string>* stop) {
  const json* v = p.Find("stop");
  if (!v) return Status::Ok();
  if (v->is_string()) {
    stop->push_back(v->get<std::string>());
  } else if (v->is_array()) {
    for (const json& item : *v) {
      if (!item.is_string()) return p.Fail("stop", "'stop' must be a string or a list of strings");
      stop->push_back(item.get<std::string>());
    }
  } else {
    return p.Fail("stop", "'stop' must be a string or a list of strings");
  }
  if (stop->size() > kMaxStopStrings) {
    return p.Fail("stop", "'stop' may hold at most " + std::to_string(kMaxStopStrings) +
                              " sequences, got " + std::to_string(stop->size()));
  }
  for (const std::string& s : *stop) {
    if (s.empty()) return p.Fail("stop", "'stop' sequences must not be empty");
  }
  return Status::Ok();
}

Status CheckTokenIds(Parser& p, const char* field, const json& ids, int32_t vocab_size,
                     std::vector<int32_t>* out) {
  for (const json& id : ids) {
    if (!id.is_number_integer()) {
      return p.Fail(field, std::string("'") + field + "' token ids must be integers");
    }
    int64_t value = id.get<int64_t>();
    if (value < 0 || value >= vocab_size) {
      return p.Fail(field, std::string("'") + field + "' token id " + std::to_string(value) +
                               " is outside the vocabulary [0, " + std::to_string(vocab_size) +
                               ")");
    }
    out->push_back(static_cast<int32_t>(value));
  }
  return Status::Ok();
}

// The completions prompt: a string, a list with one string, a list of token ids, or a list
// with one list of token ids. Several prompts (batch) are not supported. A text prompt is
// encoded with the tokenizer's special tokens (bos) when add_special_tokens, and copied to
// *text; token ids are taken as they are.
Status ParsePrompt(Parser& p, const ServedModel& model, bool add_special_tokens,
                   std::vector<int32_t>* ids, std::optional<std::string>* text) {
  const json* v = p.Find("prompt");
  if (!v) return p.Fail("prompt", "'prompt' is required");
  const json* prompt = v;
  if (v->is_array() && v->size() == 1 && ((*v)[0].is_string() || (*v)[0].is_array())) {
    prompt = &(*v)[0];
  }
  if (prompt->is_string()) {
    *text = prompt->get<std::string>();
    *ids = model.tokenizer.Encode(**text, add_special_tokens);
  } else if (prompt->is_array()) {
    if (!prompt->empty() && (*prompt)[0].is_string()) {
      return p.Fail("prompt", "'prompt' with several prompts is not supported; send one");
    }
    TANDEM_RETURN_IF_ERROR(
        CheckTokenIds(p, "prompt", *prompt, model.tokenizer.vocab_size(), ids));
  } else {
    return p.Fail("prompt", "'prompt' must be a string, a list of token ids, or a list of one");
  }
  if (ids->empty()) return p.Fail("prompt", "'prompt' must not be empty");
  return Status::Ok();
}

Status ParseMessages(Parser& p, std::vector<ChatMessage>* messages) {
  const json* v = p.Find("messages");
  if (!v) return p.Fail("messages", "'messages' is required");
  if (!v->is_array() || v->empty()) {
    return p.Fail("messages", "'messages' must be a non-empty list of messages");
  }
  for (size_t i = 0; i < v->size(); ++i) {
    const json& m = (*v)[i];
    std::string where = "'messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return p.Fail("messages", where + "' must be an object");
    TANDEM_RETURN_IF_ERROR(CheckMessageFields(m, i, p.param));
    auto role_it = m.find("role");
    if (role_it == m.end() || !role_it->is_string()) {
      return p.Fail("messages", where + ".role' must be a string");
    }
    std::string role = role_it->get<std::string>();
    if (role == "developer") role = "system";  // OpenAI's newer name for the system role
    if (role != "system" && role != "user" && role != "assistant") {
      return p.Fail("messages", where + ".role' must be system, user or assistant, got '" +
                                    role + "'");
    }
    std::string content;
    auto content_it = m.find("content");
    if (content_it == m.end() || content_it->is_null()) {
      if (role != "assistant") return p.Fail("messages", where + ".content' is required");
    } else if (content_it->is_string()) {
      content = content_it->get<std::string>();
    } else if (content_it->is_array()) {
      // Content parts: only text is supported; parts are joined with newlines (as vLLM does).
      bool first = true;
      for (const json& part : *content_it) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          return p.Fail("messages", where + ".content' parts must be {\"type\":\"text\",\"text\":...}");
        }
        if (!first) content += "\n";
        content += part["text"].get<std::string>();
        first = false;
      }
    } else {
      return p.Fail("messages", where + ".content' must be a string or a list of parts");
    }
    messages->push_back(ChatMessage{std::move(role), std::move(content)});
  }
  return Status::Ok();
}

// n: choices from the one prompt. best_of other than n is refused by the allowlist.
Status ParseChoices(Parser& p, ApiRequest* request) {
  std::optional<int32_t> n;
  TANDEM_RETURN_IF_ERROR(p.GetInt32("n", 1, kMaxChoices, &n));
  if (n) request->n = *n;
  return Status::Ok();
}

// How output tokens become text, and who the end user is.
Status ParseOutputText(Parser& p, ApiRequest* request) {
  TANDEM_RETURN_IF_ERROR(p.GetBool("skip_special_tokens", &request->skip_special_tokens));
  // The decoder writes special tokens' text as it is, with no spaces around it (as Hugging
  // Face's fast tokenizers, and vLLM with them, do): true cannot be honoured.
  bool spaces = false;
  TANDEM_RETURN_IF_ERROR(p.GetBool("spaces_between_special_tokens", &spaces));
  if (spaces) {
    return p.Fail("spaces_between_special_tokens",
                  "'spaces_between_special_tokens' true is not supported: special tokens are "
                  "decoded without added spaces (as a fast tokenizer does); send false or omit it");
  }
  if (const json* user = p.Find("user")) {
    if (!user->is_string()) return p.Fail("user", "'user' must be a string");
    if (user->get<std::string>().size() > kMaxUserBytes) {
      return p.Fail("user", "'user' may be at most " + std::to_string(kMaxUserBytes) + " bytes");
    }
    request->user = user->get<std::string>();
  }
  return Status::Ok();
}

// model: required; an unknown one is a 404, as OpenAI answers.
Status ParseModel(Parser& p, const ServedModel& model, std::string* param) {
  const json* model_field = p.Find("model");
  if (!model_field) return p.Fail("model", "'model' is required");
  if (!model_field->is_string()) return p.Fail("model", "'model' must be a string");
  std::string model_name = model_field->get<std::string>();
  if (model_name != model.name) {
    *param = "model";
    return NotFound("The model '" + model_name + "' does not exist");
  }
  return Status::Ok();
}

// stream and stream_options.
Status ParseStreaming(Parser& p, ApiRequest* request) {
  TANDEM_RETURN_IF_ERROR(p.GetBool("stream", &request->stream));
  const json* options = p.Find("stream_options");
  if (!options) return Status::Ok();
  if (!request->stream) {
    return p.Fail("stream_options", "'stream_options' is only allowed when 'stream' is true");
  }
  if (!options->is_object()) return p.Fail("stream_options", "'stream_options' must be an object");
  for (const auto& [key, value] : options->items()) {
    bool* out = key == "include_usage"            ? &request->include_usage
                : key == "continuous_usage_stats" ? &request->continuous_usage_stats
                                                  : nullptr;
    if (out == nullptr) {
      return p.Fail("stream_options",
                    "Unrecognized request argument supplied: stream_options." + key);
    }
    if (value.is_null()) continue;
    if (!value.is_boolean()) {
      return p.Fail("stream_options", "'stream_options." + key + "' must be a boolean");
    }
    *out = value.get<bool>();
  }
  return Status::Ok();
}

// logit_bias: {"<token id>": bias in [-100, 100]}, as OpenAI's (keys are decimal strings).
Status ParseLogitBias(Parser& p, const ServedModel& model, std::vector<TokenBias>* out) {
  const json* v = p.Find("logit_bias");
  if (!v) return Status::Ok();
  if (!v->is_object()) {
    return p.Fail("logit_bias", "'logit_bias' must be an object of token id -> bias");
  }
  if (v->size() > kMaxLogitBiasEntries) {
    return p.Fail("logit_bias", "'logit_bias' may hold at most " +
                                    std::to_string(kMaxLogitBiasEntries) + " entries, got " +
                                    std::to_string(v->size()));
  }
  const int32_t vocab_size = model.tokenizer.vocab_size();
  for (const auto& [key, bias] : v->items()) {
    const bool digits = !key.empty() && key.size() <= 10 &&
                        key.find_first_not_of("0123456789") == std::string::npos;
    const int64_t id = digits ? std::stoll(key) : -1;
    if (!digits || id >= vocab_size) {
      return p.Fail("logit_bias", "'logit_bias' key '" + key +
                                      "' is not a token id in the vocabulary [0, " +
                                      std::to_string(vocab_size) + ")");
    }
    if (!bias.is_number() || !(bias.get<double>() >= -kMaxLogitBias &&
                               bias.get<double>() <= kMaxLogitBias)) {
      return p.Fail("logit_bias", "'logit_bias' for token " + key +
                                      " must be a number in [-100, 100]");
    }
    for (const TokenBias& seen : *out) {
      if (seen.token_id == id) {
        return p.Fail("logit_bias", "'logit_bias' lists token " + std::to_string(id) + " twice");
      }
    }
    out->push_back(TokenBias{static_cast<int32_t>(id), static_cast<float>(bias.get<double>())});
  }
  return Status::Ok();
}

// Sampling fields; ranges are checked once, by SamplingParams::Validate (after the prompt).
Status ParseSampling(Parser& p, const ServedModel& model, SamplingParams* sp) {
  TANDEM_RETURN_IF_ERROR(p.GetFloat("temperature", &sp->temperature));
  TANDEM_RETURN_IF_ERROR(p.GetFloat("top_p", &sp->top_p));
  TANDEM_RETURN_IF_ERROR(p.GetFloat("min_p", &sp->min_p));
  TANDEM_RETURN_IF_ERROR(p.GetFloat("repetition_penalty", &sp->repetition_penalty));
  TANDEM_RETURN_IF_ERROR(p.GetFloat("presence_penalty", &sp->presence_penalty));
  TANDEM_RETURN_IF_ERROR(p.GetFloat("frequency_penalty", &sp->frequency_penalty));
  std::optional<int32_t> top_k;
  TANDEM_RETURN_IF_ERROR(p.GetInt32("top_k", -1, std::numeric_limits<int32_t>::max(), &top_k));
  if (top_k) sp->top_k = *top_k;
  std::optional<int64_t> seed;
  TANDEM_RETURN_IF_ERROR(p.GetInt("seed", &seed));
  if (seed) sp->seed = static_cast<uint64_t>(*seed);
  TANDEM_RETURN_IF_ERROR(p.GetBool("ignore_eos", &sp->ignore_eos));
  TANDEM_RETURN_IF_ERROR(
      p.GetBool("include_stop_str_in_output", &sp->include_stop_str_in_output));
  std::optional<int32_t> min_tokens;
  TANDEM_RETURN_IF_ERROR(
      p.GetInt32("min_tokens", 0, std::numeric_limits<int32_t>::max(), &min_tokens));
  if (min_tokens) sp->min_tokens = *min_tokens;
  TANDEM_RETURN_IF_ERROR(ParseLogitBias(p, model, &sp->logit_bias));
  TANDEM_RETURN_IF_ERROR(ParseStop(p, &sp->stop));
  if (const json* ids = p.Find("stop_token_ids")) {
    if (!ids->is_array()) return p.Fail("stop_token_ids", "'stop_token_ids' must be a list");
    TANDEM_RETURN_IF_ERROR(CheckTokenIds(p, "stop_token_ids", *ids,
                                         model.tokenizer.vocab_size(), &sp->stop_token_ids));
  }
  return Status::Ok();
}

// logprobs: completions take an int (top alternatives; 0 = the sampled token only), chat a bool
// and top_logprobs.
Status ParseLogprobs(Parser& p, ApiKind kind, SamplingParams* sp) {
  if (kind == ApiKind::kCompletion) {
    std::optional<int32_t> logprobs;
    TANDEM_RETURN_IF_ERROR(p.GetInt32("logprobs", 0, kMaxTopLogprobs, &logprobs));
    if (logprobs) {
      sp->logprobs = true;
      sp->top_logprobs = *logprobs;
    }
    return Status::Ok();
  }
  TANDEM_RETURN_IF_ERROR(p.GetBool("logprobs", &sp->logprobs));
  std::optional<int32_t> top_logprobs;
  TANDEM_RETURN_IF_ERROR(p.GetInt32("top_logprobs", 0, kMaxTopLogprobs, &top_logprobs));
  if (top_logprobs) {
    if (!sp->logprobs) {
      return p.Fail("top_logprobs", "'logprobs' must be true when 'top_logprobs' is used");
    }
    sp->top_logprobs = *top_logprobs;
  }
  return Status::Ok();
}

// The chat template fields (as vLLM): add_generation_prompt (default true),
// continue_final_message, chat_template (a Jinja source for this request only) and
// chat_template_kwargs (extra template variables). Returns the template to render with.
StatusOr<const ChatTemplate*> ParseChatTemplateFields(Parser& p, const ServedModel& model,
                                                      ChatRenderOptions* options,
                                                      ChatTemplate* request_template) {
  TANDEM_RETURN_IF_ERROR(p.GetBool("add_generation_prompt", &options->add_generation_prompt));
  TANDEM_RETURN_IF_ERROR(p.GetBool("continue_final_message", &options->continue_final_message));
  if (options->add_generation_prompt && options->continue_final_message) {
    return p.Fail("continue_final_message",
                  "Cannot set both `continue_final_message` and `add_generation_prompt` to True.");
  }
  if (const json* kwargs = p.Find("chat_template_kwargs")) {
    if (!kwargs->is_object()) {
      return p.Fail("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    }
    for (auto it = kwargs->begin(); it != kwargs->end(); ++it) {
      StatusOr<jinja::Value> value = jinja::Value::FromJson(it.value());
      if (!value.ok()) {
        return p.Fail("chat_template_kwargs",
                      "'chat_template_kwargs." + it.key() + "': " + value.status().message());
      }
      options->kwargs.emplace_back(it.key(), std::move(value).value());
    }
  }
  const json* source = p.Find("chat_template");
  if (source == nullptr) return &model.chat_template;
  if (!source->is_string()) return p.Fail("chat_template", "'chat_template' must be a string");
  StatusOr<ChatTemplate> parsed = ChatTemplate::Create(
      source->get<std::string>(), "the request's chat_template", model.chat_template.special_tokens());
  if (!parsed.ok()) return p.Fail("chat_template", parsed.status().message());
  *request_template = std::move(parsed).value();
  return request_template;
}

// The prompt, templated and tokenized here: the router knows every prompt's length.
Status ParsePromptTokens(Parser& p, ApiKind kind, const ServedModel& model,
                         bool add_special_tokens, std::vector<int32_t>* ids,
                         std::optional<std::string>* prompt_text) {
  if (kind != ApiKind::kChatCompletion) {
    return ParsePrompt(p, model, add_special_tokens, ids, prompt_text);
  }
  ChatTemplate request_template;
  std::vector<ChatMessage> messages;
  TANDEM_RETURN_IF_ERROR(ParseMessages(p, &messages));
  ChatRenderOptions options;
  TANDEM_ASSIGN_OR_RETURN(const ChatTemplate* chat_template,
                          ParseChatTemplateFields(p, model, &options, &request_template));
  StatusOr<std::string> text =
      chat_template->Render(ChatTemplate::MessagesValue(messages), options);
  if (!text.ok()) {
    const char* field = text.status().message().find("chat_template_kwargs") != std::string::npos
                            ? "chat_template_kwargs"
                            : "messages";
    return p.Fail(field, text.status().message());
  }
  // The templates write their own bos token: add_special_tokens is false unless asked.
  *ids = model.tokenizer.Encode(*text, add_special_tokens);
  if (ids->empty()) return p.Fail("messages", "the rendered prompt is empty");
  return Status::Ok();
}

// max_tokens (already read from `field`: chat may say max_completion_tokens) within what
// model.max_model_len leaves after the prompt; absent, OpenAI's defaults: 16 for completions,
// "as many as fit" for chat.
Status FitMaxTokens(Parser& p, ApiKind kind, const ServedModel& model, int64_t prompt_len,
                    std::optional<int32_t> max_tokens, const char* field, SamplingParams* sp) {
  const char* prompt_field = kind == ApiKind::kChatCompletion ? "messages" : "prompt";
  if (prompt_len >= model.max_model_len) {
    return p.Fail(prompt_field, "This model's maximum context length is " +
                                    std::to_string(model.max_model_len) +
                                    " tokens. However, your prompt has " +
                                    std::to_string(prompt_len) + " tokens.");
  }
  const int32_t room = static_cast<int32_t>(model.max_model_len - prompt_len);
  if (!max_tokens) {
    sp->max_tokens = kind == ApiKind::kCompletion ? std::min<int32_t>(16, room) : room;
    return Status::Ok();
  }
  if (*max_tokens > room) {
    return p.Fail(field, "This model's maximum context length is " +
                             std::to_string(model.max_model_len) + " tokens. However, you requested " +
                             std::to_string(prompt_len + *max_tokens) + " tokens (" +
                             std::to_string(prompt_len) + " in the " + prompt_field + ", " +
                             std::to_string(*max_tokens) + " in the completion).");
  }
  sp->max_tokens = *max_tokens;
  return Status::Ok();
}

StatusOr<ApiRequest> Parse(ApiKind kind, const json& body, const ServedModel& model,
                           std::string* param) {
  Parser p{body, param};
  if (!body.is_object()) return p.Fail("", "the request body must be a JSON object");
  TANDEM_RETURN_IF_ERROR(CheckRequestFields(kind, body, param));

  ApiRequest request;
  request.kind = kind;
  request.created = std::chrono::duration_cast<std::chrono::seconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  GenerateRequest& gen = request.generate;
  SamplingParams& sp = gen.sampling;
  TANDEM_RETURN_IF_ERROR(ParseModel(p, model, param));
  gen.model = model.name;
  TANDEM_RETURN_IF_ERROR(ParseChoices(p, &request));
  TANDEM_RETURN_IF_ERROR(ParseStreaming(p, &request));
  TANDEM_RETURN_IF_ERROR(ParseOutputText(p, &request));
  TANDEM_RETURN_IF_ERROR(ParseSampling(p, model, &sp));
  // max_tokens is read before the prompt, so that a wrongly typed one is named before any
  // prompt error; its bound needs the prompt's length, checked after.
  const char* max_tokens_field =
      kind == ApiKind::kChatCompletion && p.Find("max_completion_tokens") ? "max_completion_tokens"
                                                                          : "max_tokens";
  std::optional<int32_t> max_tokens;
  TANDEM_RETURN_IF_ERROR(
      p.GetInt32(max_tokens_field, 1, std::numeric_limits<int32_t>::max(), &max_tokens));
  TANDEM_RETURN_IF_ERROR(ParseLogprobs(p, kind, &sp));
  bool echo = false;
  if (kind == ApiKind::kCompletion) {
    TANDEM_RETURN_IF_ERROR(p.GetBool("echo", &echo));
    if (echo && sp.logprobs) {
      return p.Fail("echo", "'echo' with 'logprobs' needs prompt logprobs, which this server "
                            "does not compute");
    }
  }
  // Chat templates write their own bos token; a text prompt gets the tokenizer's.
  bool add_special_tokens = kind == ApiKind::kCompletion;
  TANDEM_RETURN_IF_ERROR(p.GetBool("add_special_tokens", &add_special_tokens));
  std::optional<int32_t> truncate;
  TANDEM_RETURN_IF_ERROR(p.GetInt32("truncate_prompt_tokens", 1,
                                    std::numeric_limits<int32_t>::max(), &truncate));
  std::optional<std::string> prompt_text;
  TANDEM_RETURN_IF_ERROR(ParsePromptTokens(p, kind, model, add_special_tokens,
                                           &gen.prompt_token_ids, &prompt_text));
  std::vector<int32_t>& prompt_ids = gen.prompt_token_ids;
  if (truncate && prompt_ids.size() > static_cast<size_t>(*truncate)) {
    // Keeps the last k tokens, as vLLM does (the end of a prompt matters most).
    prompt_ids.erase(prompt_ids.begin(), prompt_ids.end() - *truncate);
    prompt_text.reset();
  }
  if (echo) {
    request.echo = prompt_text ? *prompt_text
                               : model.tokenizer.Decode(prompt_ids, request.skip_special_tokens);
  }
  TANDEM_RETURN_IF_ERROR(FitMaxTokens(p, kind, model,
                                      static_cast<int64_t>(gen.prompt_token_ids.size()),
                                      max_tokens, max_tokens_field, &sp));

  Status valid = sp.Validate();
  if (!valid.ok()) {
    std::string field = FieldOfSamplingError(valid);
    if (field == "max_tokens") field = max_tokens_field;
    if (kind == ApiKind::kCompletion && field == "top_logprobs") field = "logprobs";
    *param = field;
    return valid;
  }
  gen.request_id = NewRequestId(kind);
  gen.arrival_time = std::chrono::steady_clock::now();
  return request;
}

json LogprobsJson(const ApiRequest& request, const std::vector<LogprobToken>& tokens) {
  if (!request.generate.sampling.logprobs) return nullptr;
  if (request.kind == ApiKind::kChatCompletion) {
    auto bytes = [](const std::string& s) {
      json out = json::array();
      for (unsigned char c : s) out.push_back(static_cast<int>(c));
      return out;
    };
    json content = json::array();
    for (const LogprobToken& t : tokens) {
      json top = json::array();
      for (const auto& [text, lp] : t.top) {
        top.push_back({{"token", text}, {"logprob", lp}, {"bytes", bytes(text)}});
      }
      content.push_back(
          {{"token", t.token}, {"logprob", t.logprob}, {"bytes", bytes(t.token)}, {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  json token_texts = json::array(), token_logprobs = json::array(), top = json::array(),
       offsets = json::array();
  for (const LogprobToken& t : tokens) {
    token_texts.push_back(t.token);
    token_logprobs.push_back(t.logprob);
    json alternatives = json::object();
    for (const auto& [text, lp] : t.top) {
      if (!alternatives.contains(text)) alternatives[text] = lp;
    }
    top.push_back(request.generate.sampling.top_logprobs > 0 ? alternatives : json(nullptr));
    offsets.push_back(t.text_offset);
  }
  return {{"tokens", token_texts},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top},
          {"text_offset", offsets}};
}

json UsageJson(Usage usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

json Envelope(const ApiRequest& request, const char* object) {
  return {{"id", request.generate.request_id},
          {"object", object},
          {"created", request.created},
          {"model", request.generate.model},
          {"system_fingerprint", nullptr}};
}

// Output text may end in U+FFFD replacements but is valid UTF-8; replace just in case.
std::string Dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

StatusOr<ServedModel> LoadServedModel(const std::string& model_dir, std::string name,
                                      const std::string& chat_template_setting, int max_model_len) {
  TANDEM_ASSIGN_OR_RETURN(Tokenizer tokenizer, LoadCheckpointTokenizer(model_dir));
  ChatSpecialTokens tokens;
  tokens.bos = tokenizer.bos_token();
  tokens.eos = tokenizer.eos_token();
  TANDEM_ASSIGN_OR_RETURN(ChatTemplate chat_template,
                          ChatTemplate::Select(chat_template_setting, tokenizer.chat_template(), tokens));
  std::vector<int32_t> eos;
  StatusOr<ModelConfig> config = LoadModelConfig(model_dir);
  if (config.ok()) {
    for (int id : config->eos_token_ids) eos.push_back(id);
  }
  if (eos.empty() && tokenizer.eos_id()) eos.push_back(*tokenizer.eos_id());
  if (name.empty()) {
    name = std::filesystem::path(model_dir).lexically_normal().filename().string();
    if (name.empty()) name = std::filesystem::path(model_dir).parent_path().filename().string();
  }
  if (max_model_len < 2) return InvalidArgument("max_model_len must be at least 2");
  int64_t created = std::chrono::duration_cast<std::chrono::seconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  return ServedModel{std::move(name), std::move(tokenizer), std::move(chat_template),
                     max_model_len, std::move(eos), created};
}

StatusOr<ApiRequest> ParseApiRequest(ApiKind kind, std::string_view body,
                                     const ServedModel& model, std::string* error_param) {
  error_param->clear();
  json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    return InvalidArgument("the request body is not valid JSON");
  }
  try {
    return Parse(kind, parsed, model, error_param);
  } catch (const json::exception& e) {
    // A type mismatch this parser did not anticipate: still the client's fault.
    return InvalidArgument(std::string("invalid request: ") + e.what());
  }
}

std::string NewRequestId(ApiKind kind) {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(counter.fetch_add(1)));
  return std::string(kind == ApiKind::kChatCompletion ? "chatcmpl-" : "cmpl-") + hex;
}

std::vector<LogprobToken> MakeLogprobTokens(const Tokenizer& tokenizer,
                                            std::span<const GeneratedToken> tokens,
                                            size_t first_text_offset) {
  std::vector<LogprobToken> out;
  out.reserve(tokens.size());
  size_t offset = first_text_offset;
  for (const GeneratedToken& t : tokens) {
    LogprobToken entry;
    int32_t id = t.token_id;
    entry.token = tokenizer.Decode(std::span<const int32_t>(&id, 1), false);
    entry.logprob = t.logprob;
    entry.text_offset = offset;
    offset += entry.token.size();
    for (const auto& [alt_id, lp] : t.top_logprobs) {
      int32_t a = alt_id;
      entry.top.emplace_back(tokenizer.Decode(std::span<const int32_t>(&a, 1), false), lp);
    }
    out.push_back(std::move(entry));
  }
  return out;
}

GenerateRequest ChoiceRequest(const ApiRequest& request, int index) {
  GenerateRequest choice = request.generate;
  if (request.n == 1) return choice;
  choice.request_id += "-" + std::to_string(index);
  if (choice.sampling.seed) *choice.sampling.seed += static_cast<uint64_t>(index);
  // Every choice goes where the first went: the instances compute the prompt's KV once.
  if (index > 0) choice.place_with = request.generate.request_id + "-0";
  return choice;
}

std::string RenderResponse(const ApiRequest& request, const std::vector<ChoiceOutput>& choices,
                           Usage usage) {
  bool chat = request.kind == ApiKind::kChatCompletion;
  json out = Envelope(request, chat ? "chat.completion" : "text_completion");
  out["choices"] = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceOutput& c = choices[i];
    json choice;
    choice["index"] = i;
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}, {"refusal", nullptr}};
    } else {
      choice["text"] = c.text;
    }
    choice["logprobs"] = LogprobsJson(request, c.logprobs);
    choice["finish_reason"] = c.finish_reason;
    out["choices"].push_back(std::move(choice));
  }
  out["usage"] = UsageJson(usage);
  return Dump(out);
}

std::string RenderResponse(const ApiRequest& request, const std::string& text,
                           const std::string& finish_reason,
                           const std::vector<LogprobToken>& logprobs, Usage usage) {
  return RenderResponse(request, {ChoiceOutput{text, finish_reason, logprobs}}, usage);
}

std::string RenderChunk(const ApiRequest& request, const StreamDelta& delta) {
  bool chat = request.kind == ApiKind::kChatCompletion;
  json out = Envelope(request, chat ? "chat.completion.chunk" : "text_completion");
  json choice;
  choice["index"] = delta.index;
  if (chat) {
    json d = json::object();
    if (delta.role_chunk) {
      d["role"] = "assistant";
      d["content"] = delta.text;
    } else if (!delta.text.empty() || !delta.finish_reason) {
      d["content"] = delta.text;
    }
    choice["delta"] = d;
  } else {
    choice["text"] = delta.text;
  }
  choice["logprobs"] = delta.logprobs.empty() ? json(nullptr) : LogprobsJson(request, delta.logprobs);
  choice["finish_reason"] = delta.finish_reason ? json(*delta.finish_reason) : json(nullptr);
  out["choices"] = json::array({choice});
  if (delta.usage) {
    out["usage"] = UsageJson(*delta.usage);
  } else if (request.include_usage) {
    out["usage"] = nullptr;
  }
  return Dump(out);
}

std::string RenderUsageChunk(const ApiRequest& request, Usage usage) {
  bool chat = request.kind == ApiKind::kChatCompletion;
  json out = Envelope(request, chat ? "chat.completion.chunk" : "text_completion");
  out["choices"] = json::array();
  out["usage"] = UsageJson(usage);
  return Dump(out);
}

std::string RenderModels(const ServedModel& model) {
  json entry = {{"id", model.name},
                {"object", "model"},
                {"created", model.created},
                {"owned_by", "tandem"},
                {"max_model_len", model.max_model_len}};
  return Dump(json{{"object", "list"}, {"data", json::array({entry})}});
}

}  // namespace tandem
