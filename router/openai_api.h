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

// A validated request, ready for the backend, with what the renderer needs.
struct ApiRequest {
  ApiKind kind = ApiKind::kCompletion;
  GenerateRequest generate;  // request_id, model, prompt_token_ids, sampling filled
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  int64_t created = 0;         // unix seconds, the same in every chunk of one response
};

// Parses and validates a request body. On error returns InvalidArgument (400), NotFound (404,
// unknown model) and sets *error_param to the offending field ("" when the body as a whole is
// bad); `error_param` must not be null.
StatusOr<ApiRequest> ParseApiRequest(ApiKind kind, std::string_view body,
                                     const ServedModel& model, std::string* error_param);

// A new request id: "cmpl-<32 hex>" or "chatcmpl-<32 hex>". Thread-safe.
std::string NewRequestId(ApiKind kind);

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

// The non-streaming response: a "text_completion" or "chat.completion" object.
// `logprobs` is ignored unless the request asked for logprobs.
std::string RenderResponse(const ApiRequest& request, const std::string& text,
                           const std::string& finish_reason,
                           const std::vector<LogprobToken>& logprobs, Usage usage);

// One streaming chunk ("chat.completion.chunk" or "text_completion"), as JSON (wrap it with
// SseEvent). For chat, `role_chunk` gives the first chunk: delta {"role":"assistant",
// "content":""}. A chunk with `finish_reason` carries it with an empty delta/text unless
// `text` is given. With include_usage every chunk has "usage": null.
struct StreamDelta {
  bool role_chunk = false;
  std::string text;
  std::vector<LogprobToken> logprobs;
  std::optional<std::string> finish_reason;
};
std::string RenderChunk(const ApiRequest& request, const StreamDelta& delta);
// The usage chunk sent last when stream_options.include_usage: "choices": [].
std::string RenderUsageChunk(const ApiRequest& request, Usage usage);

// The /v1/models list.
std::string RenderModels(const ServedModel& model);

}  // namespace tandem
