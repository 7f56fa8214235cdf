// Chat templates: a checkpoint's own Jinja chat template, rendered by our interpreter
// (common/text/jinja/template.h) exactly as transformers' apply_chat_template(messages,
// tokenize=False, add_generation_prompt=..., **kwargs) renders it: the template sees
// `messages`, `tools` and `documents` (None when absent), `add_generation_prompt`, the special
// tokens that are set (bos_token, eos_token, unk_token, pad_token) and the extra kwargs, which
// override the special tokens.
//
// The rendered text contains whatever bos token the template writes: encode it with
// add_special_tokens=false.
//
// Thread-safety: a ChatTemplate is immutable; Render may run concurrently.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/base/status.h"
#include "common/text/jinja/template.h"
#include "common/text/jinja/value.h"

namespace tandem {

// The templates make-model writes into its random-weight checkpoints' tokenizer_config.json:
// Meta-Llama-3-Instruct's, and Qwen2-Instruct's (ChatML with a default system prompt).
extern const char kLlama3ChatTemplate[];
extern const char kChatmlChatTemplate[];

struct ChatMessage {
  std::string role;
  std::string content;
};

// The special tokens a template sees ("" = not set, so the variable is undefined, as in
// transformers' special_tokens_map).
struct ChatSpecialTokens {
  std::string bos;
  std::string eos;
  std::string unk;
  std::string pad;
};

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  // Leaves the last message open (its text is the end of the prompt) instead of closed, for the
  // model to continue it, as transformers >= 4.45 does. Incompatible with add_generation_prompt.
  bool continue_final_message = false;
  // chat_template_kwargs: extra template variables. May not name messages, tools, documents or
  // add_generation_prompt.
  std::vector<std::pair<std::string, jinja::Value>> kwargs;
  jinja::Value tools = jinja::Value::None();
  jinja::Limits limits;
};

class ChatTemplate {
 public:
  // No template: Render fails with FailedPrecondition (completions still work).
  ChatTemplate() = default;

  // Parses `jinja_source`; `origin` says where it came from, for messages ("the checkpoint's
  // tokenizer_config.json", a file path, "the request's chat_template"). InvalidArgument names
  // the origin and the line of a syntax error.
  static StatusOr<ChatTemplate> Create(std::string_view jinja_source, std::string origin,
                                       ChatSpecialTokens tokens);

  // Selects the template for model.chat_template `setting`: "auto" = `checkpoint_template` (the
  // checkpoint's own: tokenizer_config.json's chat_template or GGUF's tokenizer.chat_template;
  // none when it has none), "none" = no template, anything else = the path of a Jinja file
  // (already resolved against the config file's folder). NotFound for an unreadable file.
  static StatusOr<ChatTemplate> Select(std::string_view setting, std::string_view checkpoint_template,
                                       ChatSpecialTokens tokens);

  bool available() const { return template_ != nullptr; }
  const std::string& origin() const { return origin_; }
  const ChatSpecialTokens& special_tokens() const { return tokens_; }

  // Renders `messages` (a list of dicts: role, content as a string or a list of parts, and
  // whatever else the caller passes through). InvalidArgument for a conversation the template
  // rejects (raise_exception's message as it is) or a template error ("line N: ...");
  // FailedPrecondition when there is no template.
  StatusOr<std::string> Render(const jinja::Value& messages, const ChatRenderOptions& options) const;
  StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                               bool add_generation_prompt) const;

  // Messages as the template sees them: [{"role": ..., "content": ...}, ...].
  static jinja::Value MessagesValue(const std::vector<ChatMessage>& messages);

 private:
  std::shared_ptr<const jinja::Template> template_;
  std::string origin_;
  ChatSpecialTokens tokens_;
};

}  // namespace tandem
