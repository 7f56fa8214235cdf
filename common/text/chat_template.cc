#include "common/text/chat_template.h"

#include <fstream>
#include <sstream>

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

namespace {

// Python's str.strip().
std::string PythonStrip(const std::string& s) {
  std::u32string cps = jinja::DecodeUtf8(s);
  size_t b = 0, e = cps.size();
  while (b < e && jinja::IsPythonSpace(cps[b])) ++b;
  while (e > b && jinja::IsPythonSpace(cps[e - 1])) --e;
  return jinja::EncodeUtf8(std::u32string_view(cps).substr(b, e - b));
}

}  // namespace

StatusOr<ChatTemplate> ChatTemplate::Create(std::string_view jinja_source, std::string origin,
                                            ChatSpecialTokens tokens) {
  StatusOr<jinja::Template> parsed = jinja::Template::Parse(jinja_source);
  if (!parsed.ok()) {
    return InvalidArgument("chat template (" + origin + "): " + parsed.status().message());
  }
  ChatTemplate t;
  t.template_ = std::make_shared<const jinja::Template>(std::move(parsed).value());
  t.origin_ = std::move(origin);
  t.tokens_ = std::move(tokens);
  return t;
}

StatusOr<ChatTemplate> ChatTemplate::Select(std::string_view setting,
                                            std::string_view checkpoint_template,
                                            ChatSpecialTokens tokens) {
  if (setting == "none") return ChatTemplate();
  if (setting == "auto" || setting.empty()) {
    if (checkpoint_template.empty()) return ChatTemplate();
    return Create(checkpoint_template, "the checkpoint's chat_template", std::move(tokens));
  }
  const std::string path(setting);
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return NotFound("model.chat_template: cannot read '" + path +
                    "' (expected auto, none or the path of a Jinja template file)");
  }
  std::ostringstream text;
  text << in.rdbuf();
  return Create(text.str(), path, std::move(tokens));
}

jinja::Value ChatTemplate::MessagesValue(const std::vector<ChatMessage>& messages) {
  std::vector<jinja::Value> list;
  for (const ChatMessage& m : messages) {
    list.push_back(jinja::Value::Dict({{jinja::Value::String("role"), jinja::Value::String(m.role)},
                                       {jinja::Value::String("content"), jinja::Value::String(m.content)}}));
  }
  return jinja::Value::List(std::move(list));
}

StatusOr<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                           bool add_generation_prompt) const {
  ChatRenderOptions options;
  options.add_generation_prompt = add_generation_prompt;
  return Render(MessagesValue(messages), options);
}

StatusOr<std::string> ChatTemplate::Render(const jinja::Value& messages,
                                           const ChatRenderOptions& options) const {
  if (!template_) {
    return FailedPrecondition(
        "this model has no chat template; set model.chat_template, send chat_template, or use "
        "/v1/completions");
  }
  if (options.continue_final_message && options.add_generation_prompt) {
    return InvalidArgument(
        "Cannot set both `continue_final_message` and `add_generation_prompt` to True.");
  }
  std::vector<std::pair<std::string, jinja::Value>> globals;
  auto add_token = [&globals](const char* name, const std::string& value) {
    if (!value.empty()) globals.emplace_back(name, jinja::Value::String(value));
  };
  add_token("bos_token", tokens_.bos);
  add_token("eos_token", tokens_.eos);
  add_token("unk_token", tokens_.unk);
  add_token("pad_token", tokens_.pad);
  for (const auto& [name, value] : options.kwargs) {
    if (name == "messages" || name == "tools" || name == "documents" ||
        name == "add_generation_prompt") {
      return InvalidArgument("chat_template_kwargs may not set '" + name + "'");
    }
    globals.emplace_back(name, value);  // later entries win: kwargs override the tokens
  }
  globals.emplace_back("messages", messages);
  globals.emplace_back("tools", options.tools);
  globals.emplace_back("documents", jinja::Value::None());
  globals.emplace_back("add_generation_prompt", jinja::Value::Bool(options.add_generation_prompt));
  StatusOr<std::string> text = template_->Render(globals, options.limits);
  if (!text.ok()) return text.status();
  if (!options.continue_final_message) return text;

  // As transformers: the prompt ends where the final message's (stripped) text last appears.
  if (!messages.is_sequence() || messages.items().empty() || !messages.items().back().is_dict()) {
    return InvalidArgument("continue_final_message needs a final message");
  }
  const jinja::Value* content = messages.items().back().dict().Find(jinja::Value::String("content"));
  std::string final_text;
  if (content != nullptr && content->is_string()) {
    final_text = content->str();
  } else if (content != nullptr && content->is_sequence() && !content->items().empty() &&
             content->items().back().is_dict()) {
    const jinja::Value* part = content->items().back().dict().Find(jinja::Value::String("text"));
    if (part != nullptr && part->is_string()) final_text = part->str();
  }
  final_text = PythonStrip(final_text);
  const size_t at = text->rfind(final_text);
  if (at == std::string::npos) {
    return InvalidArgument(
        "continue_final_message is set but the final message does not appear in the chat after "
        "applying the chat template");
  }
  return text->substr(0, at + final_text.size());
}

}  // namespace tandem
