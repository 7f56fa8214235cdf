// The OpenAI wire format of the router: parsing and validating `/v1/completions` and
// `/v1/chat/completions` bodies into a GenerateRequest (templated and tokenized), and rendering
// responses, stream chunks and `/v1/models` exactly in OpenAI's shapes.
//
// Every function here is pure apart from reading the ServedModel (immutable, shareable by
// threads); none throws (nlohmann::json exceptions are caught inside).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/text/chat_template.h"
#include "common/base/status.h"
#include "common/text/tokenizer.h"
#include "router/backend.h"

namespace tandem {

// The model a router serves: what it needs to validate, template and tokenize requests.
struct ServedModel {
  std::string name;  // the "model" clients must send, and /v1/models lists
  Tokenizer tokenizer;
  ChatTemplate chat_template;
  int max_model_len = 4096;  // prompt + output tokens per request
  std::vector<int32_t> eos_token_ids;
  int64_t created = 0;  // unix seconds, shown by /v1/models
};

// Loads the tokenizer, chat template (`chat_template_setting`: model.chat_template as
// ChatTemplateSetting resolves it: auto, none or a file path; see ChatTemplate::Select) and eos
// ids of a Hugging Face checkpoint directory. `name` "" = the directory's base name.
StatusOr<ServedModel> LoadServedModel(const std::string& model_dir, std::string name,
                                      const std::string& chat_template_setting, int max_model_len);

enum class ApiKind { kCompletion, kChatCompletion };

// The most choices (`n`) one request may ask for.
inline constexpr int kMaxChoices = 32;

// A validated request, ready for the backend, with what the renderer needs.
struct ApiRequest {
  ApiKind kind = ApiKind::kCompletion;
  GenerateRequest generate;  // request_id, model, prompt_token_ids, sampling filled
  // Choices generated from the one prompt, [1, kMaxChoices]. The router runs choice i as its
  // own backend request (ChoiceRequest), so each choice's prompt is prefilled on its own.
  int n = 1;
  bool stream = false;
  bool include_usage = false;           // stream_options.include_usage: a last usage chunk
  bool continuous_usage_stats = false;  // stream_options.continuous_usage_stats: usage per chunk
  bool skip_special_tokens = true;      // special tokens' text left out of the output text
  std::optional<std::string> echo;      // completions "echo": the prompt's text, before each choice
  std::string user;                     // the client's end-user id; logged, not interpreted
  int64_t created = 0;                  // unix seconds, the same in every chunk of one response
};

// Parses and validates a request body. On error returns InvalidArgument (400), NotFound (404,
// unknown model) and sets *error_param to the offending field ("" when the body as a whole is
// bad); `error_param` must not be null.
StatusOr<ApiRequest> ParseApiRequest(ApiKind kind, std::string_view body,
                                     const ServedModel& model, std::string* error_param);

// A new request id: "cmpl-<32 hex>" or "chatcmpl-<32 hex>". Thread-safe.
std::string NewRequestId(ApiKind kind);

// Choice `index` of `request` as a backend request: with n == 1 the request itself; else the id
// "<request_id>-<index>" and, when the request is seeded, the seed plus index (so that seeded
// choices differ from each other and are reproducible).
GenerateRequest ChoiceRequest(const ApiRequest& request, int index);

// One output token as the logprobs formats show it.
struct LogprobToken {
  std::string token;  // the token's text
  float logprob = 0.0f;
  std::vector<std::pair<std::string, float>> top;  // top alternatives, best first
  size_t text_offset = 0;  // completions: offset of this token in the whole output text
};

// Token texts for the logprobs formats (one entry per event, in order).
std::vector<LogprobToken> MakeLogprobTokens(const Tokenizer& tokenizer,
                                            std::span<const GeneratedToken> tokens,
                                            size_t first_text_offset);

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
};

// One finished choice of a non-streaming response. `text` is the whole text (echo included).
struct ChoiceOutput {
  std::string text;
  std::string finish_reason;
  std::vector<LogprobToken> logprobs;  // ignored unless the request asked for logprobs
};

// The non-streaming response: a "text_completion" or "chat.completion" object whose choices
// are `choices` with indexes 0, 1, ...
std::string RenderResponse(const ApiRequest& request, const std::vector<ChoiceOutput>& choices,
                           Usage usage);
// The same with one choice.
std::string RenderResponse(const ApiRequest& request, const std::string& text,
                           const std::string& finish_reason,
                           const std::vector<LogprobToken>& logprobs, Usage usage);

// One streaming chunk ("chat.completion.chunk" or "text_completion") of choice `index`, as
// JSON (wrap it with SseEvent). For chat, `role_chunk` gives a choice's first chunk: delta
// {"role":"assistant", "content":""}. A chunk with `finish_reason` carries it with an empty
// delta/text unless `text` is given. "usage" is `usage` when set (continuous_usage_stats), else
// null with include_usage, else absent.
struct StreamDelta {
  int index = 0;
  bool role_chunk = false;
  std::string text;
  std::vector<LogprobToken> logprobs;
  std::optional<std::string> finish_reason;
  std::optional<Usage> usage;
};
std::string RenderChunk(const ApiRequest& request, const StreamDelta& delta);
// The usage chunk sent last when stream_options.include_usage: "choices": [].
std::string RenderUsageChunk(const ApiRequest& request, Usage usage);

// The /v1/models list.
std::string RenderModels(const ServedModel& model);

}  // namespace tandem
