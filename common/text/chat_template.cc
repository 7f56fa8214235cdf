#include "common/text/chat_template.h"

#include "common/text/unicode.h"

namespace tandem {

// The templates exactly as the checkpoints ship them.
const char kLlama3ChatTemplate[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim "
    "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

const char kChatmlChatTemplate[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' "
    "+ message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if "
    "add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

const char kMistralChatTemplate[] =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] "
    "' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ "
    "message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles "
    "are supported!') }}{% endif %}{% endfor %}";

namespace {

// Checkpoints differ in surrounding whitespace only; inside the template every byte counts.
std::string_view TrimOuter(std::string_view text) {
  const size_t begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string_view::npos) return {};
  const size_t end = text.find_last_not_of(" \t\r\n");
  return text.substr(begin, end - begin + 1);
}

}  // namespace

StatusOr<ChatTemplateFamily> ParseChatTemplateName(std::string_view name, bool* is_auto) {
  *is_auto = false;
  if (name == "auto" || name.empty()) {
    *is_auto = true;
    return ChatTemplateFamily::kNone;
  }
  if (name == "llama3") return ChatTemplateFamily::kLlama3;
  if (name == "chatml") return ChatTemplateFamily::kChatml;
  if (name == "mistral") return ChatTemplateFamily::kMistral;
  if (name == "none") return ChatTemplateFamily::kNone;
  return InvalidArgument("unknown chat template '" + std::string(name) +
                         "' (expected auto, llama3, chatml, mistral or none)");
}

std::string_view ChatTemplateFamilyName(ChatTemplateFamily family) {
  switch (family) {
    case ChatTemplateFamily::kLlama3: return "llama3";
    case ChatTemplateFamily::kChatml: return "chatml";
    case ChatTemplateFamily::kMistral: return "mistral";
    case ChatTemplateFamily::kNone: return "none";
  }
  return "none";
}

std::string_view ChatTemplateSource(ChatTemplateFamily family) {
  switch (family) {
    case ChatTemplateFamily::kLlama3: return kLlama3ChatTemplate;
    case ChatTemplateFamily::kChatml: return kChatmlChatTemplate;
    case ChatTemplateFamily::kMistral: return kMistralChatTemplate;
    case ChatTemplateFamily::kNone: return "";
  }
  return "";
}

StatusOr<ChatTemplate> ChatTemplate::Create(std::string_view jinja_template,
                                            std::string_view override_name, std::string bos_token,
                                            std::string eos_token) {
  bool is_auto = false;
  TANDEM_ASSIGN_OR_RETURN(ChatTemplateFamily family, ParseChatTemplateName(override_name, &is_auto));
  if (is_auto && !jinja_template.empty()) {
    const std::string_view trimmed = TrimOuter(jinja_template);
    for (ChatTemplateFamily known : {ChatTemplateFamily::kLlama3, ChatTemplateFamily::kChatml,
                                     ChatTemplateFamily::kMistral}) {
      if (trimmed == ChatTemplateSource(known)) family = known;
    }
    if (family == ChatTemplateFamily::kNone) {
      // Say what it resembles, but do not guess: a near-miss renders different text.
      std::string hint;
      if (jinja_template.find("<|start_header_id|>") != std::string_view::npos) hint = "llama3";
      else if (jinja_template.find("<|im_start|>") != std::string_view::npos) hint = "chatml";
      else if (jinja_template.find("[INST]") != std::string_view::npos) hint = "mistral";
      std::string message =
          "the checkpoint's chat_template (tokenizer_config.json) is not one Tandem knows; set "
          "model.chat_template to llama3, chatml, mistral or none";
      if (!hint.empty()) message += " (it looks like " + hint + ", but differs from the known template)";
      return InvalidArgument(message);
    }
  }
  return ChatTemplate(family, std::move(bos_token), std::move(eos_token));
}

StatusOr<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                           bool add_generation_prompt) const {
  std::string out;
  switch (family_) {
    case ChatTemplateFamily::kNone:
      return FailedPrecondition(
          "this model has no chat template; set model.chat_template or use /v1/completions");
    case ChatTemplateFamily::kLlama3:
      for (size_t i = 0; i < messages.size(); ++i) {
        if (i == 0) out += bos_;
        out += "<|start_header_id|>" + messages[i].role + "<|end_header_id|>\n\n" +
               unicode::PythonStrip(messages[i].content) + "<|eot_id|>";
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;
    case ChatTemplateFamily::kChatml:
      for (size_t i = 0; i < messages.size(); ++i) {
        if (i == 0 && messages[0].role != "system") {
          out += "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n";
        }
        out += "<|im_start|>" + messages[i].role + "\n" + messages[i].content + "<|im_end|>\n";
      }
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      return out;
    case ChatTemplateFamily::kMistral:
      // The template has no generation prompt: "[/INST]" already asks for the answer.
      out += bos_;
      for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if ((m.role == "user") != (i % 2 == 0)) {
          return InvalidArgument(
              "Conversation roles must alternate user/assistant/user/assistant/... (mistral "
              "template; message " + std::to_string(i) + " has role '" + m.role + "')");
        }
        if (m.role == "user") {
          out += "[INST] " + m.content + " [/INST]";
        } else if (m.role == "assistant") {
          out += m.content + eos_;
        } else {
          return InvalidArgument("Only user and assistant roles are supported! (mistral template; message " +
                                 std::to_string(i) + " has role '" + m.role + "')");
        }
      }
      return out;
  }
  return Internal("unknown chat template family");
}

}  // namespace tandem
