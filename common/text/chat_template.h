// Chat templates rendered in C++: llama3, chatml (Qwen2) and mistral, each producing exactly what
// transformers' apply_chat_template(messages, tokenize=False, add_generation_prompt=...) renders
// with that family's real Jinja template (kept below: make-model writes them into
// tokenizer_config.json, and auto-detection compares a checkpoint's template against them).
//
// The rendered text already contains the family's bos token where its template adds one
// (llama3, mistral): encode it with add_special_tokens=false.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"

namespace tandem {

enum class ChatTemplateFamily { kNone, kLlama3, kChatml, kMistral };

// Meta-Llama-3-*-Instruct.
extern const char kLlama3ChatTemplate[];
// Qwen2-*-Instruct (ChatML with a default system prompt).
extern const char kChatmlChatTemplate[];
// Mistral-7B-Instruct-v0.1 (user/assistant alternation, no system role).
extern const char kMistralChatTemplate[];

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// "auto" | "llama3" | "chatml" | "mistral" | "none"; InvalidArgument otherwise. "auto" (or "")
// returns kNone and sets *is_auto.
StatusOr<ChatTemplateFamily> ParseChatTemplateName(std::string_view name, bool* is_auto);
std::string_view ChatTemplateFamilyName(ChatTemplateFamily family);
// The Jinja source of a family ("" for kNone).
std::string_view ChatTemplateSource(ChatTemplateFamily family);

class ChatTemplate {
 public:
  // Chooses the renderer. `override_name` is model.chat_template: a family name forces it;
  // "auto" recognises `jinja_template` (tokenizer_config.json's chat_template) as one of the known
  // templates, and fails with a message naming model.chat_template when it is not one; "none"
  // (or auto with no template at all) gives a template whose Render fails. bos/eos are the
  // tokenizer's bos_token / eos_token strings, as the Jinja templates see them.
  static StatusOr<ChatTemplate> Create(std::string_view jinja_template,
                                       std::string_view override_name, std::string bos_token,
                                       std::string eos_token);

  // Renders `messages`. InvalidArgument for a conversation the Jinja template rejects (mistral:
  // roles must alternate user/assistant starting with user); FailedPrecondition for kNone.
  StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                               bool add_generation_prompt) const;

  ChatTemplateFamily family() const { return family_; }

 private:
  ChatTemplate(ChatTemplateFamily family, std::string bos, std::string eos)
      : family_(family), bos_(std::move(bos)), eos_(std::move(eos)) {}

  ChatTemplateFamily family_;
  std::string bos_;
  std::string eos_;
};

}  // namespace tandem
