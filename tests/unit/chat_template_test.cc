// Chat template renderers. The hidden [.chat_template_cases] case is driven by
// tests/python/test_chat_template_hf.py, which renders the same conversations with transformers'
// apply_chat_template and the real Jinja templates, writing them to $TANDEM_TEST_DIR.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/text/chat_template.h"

namespace tandem {
namespace {

using json = nlohmann::json;

ChatTemplate Make(std::string_view jinja, std::string_view name, std::string bos = "<s>",
                  std::string eos = "</s>") {
  auto t = ChatTemplate::Create(jinja, name, std::move(bos), std::move(eos));
  INFO((t.ok() ? std::string("ok") : t.status().ToString()));
  REQUIRE(t.ok());
  return *t;
}

TEST_CASE("llama3 template", "[chat_template]") {
  const ChatTemplate t = Make(kLlama3ChatTemplate, "auto", "<|begin_of_text|>", "<|eot_id|>");
  CHECK(t.family() == ChatTemplateFamily::kLlama3);
  auto text = t.Render({{"system", "Be brief."}, {"user", "  Hi!\n"}}, true);
  REQUIRE(text.ok());
  CHECK(*text ==
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST_CASE("chatml template adds the default system prompt", "[chat_template]") {
  const ChatTemplate t = Make(std::string("\n") + kChatmlChatTemplate + "\n", "auto");
  CHECK(t.family() == ChatTemplateFamily::kChatml);
  auto text = t.Render({{"user", "Hi"}}, false);
  REQUIRE(text.ok());
  CHECK(*text ==
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST_CASE("mistral template enforces alternation", "[chat_template]") {
  const ChatTemplate t = Make(kMistralChatTemplate, "auto");
  CHECK(t.family() == ChatTemplateFamily::kMistral);
  auto text = t.Render({{"user", "a"}, {"assistant", "b"}, {"user", "c"}}, true);
  REQUIRE(text.ok());
  CHECK(*text == "<s>[INST] a [/INST]b</s>[INST] c [/INST]");
  auto bad = t.Render({{"user", "a"}, {"user", "b"}}, true);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
  CHECK(bad.status().message().find("alternate") != std::string::npos);
  auto system = t.Render({{"system", "s"}, {"user", "a"}}, true);
  REQUIRE_FALSE(system.ok());
  CHECK(system.status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("chat template selection", "[chat_template]") {
  // An override wins over the checkpoint's template.
  CHECK(Make(kLlama3ChatTemplate, "chatml").family() == ChatTemplateFamily::kChatml);
  CHECK(Make("", "auto").family() == ChatTemplateFamily::kNone);
  auto none = Make(kLlama3ChatTemplate, "none").Render({{"user", "x"}}, true);
  CHECK(none.status().code() == StatusCode::kFailedPrecondition);

  auto unknown = ChatTemplate::Create("{{ messages[0]['content'] }}<|im_start|>", "auto", "", "");
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.status().message().find("model.chat_template") != std::string::npos);
  CHECK(unknown.status().message().find("chatml") != std::string::npos);

  auto bad_name = ChatTemplate::Create("", "vicuna", "", "");
  REQUIRE_FALSE(bad_name.ok());
  CHECK(bad_name.status().message().find("vicuna") != std::string::npos);
}

TEST_CASE("Chat templates match transformers", "[.chat_template_cases]") {
  const char* dir = std::getenv("TANDEM_TEST_DIR");
  if (dir == nullptr) {
    WARN("TANDEM_TEST_DIR is not set; skipping (run through tests/python/test_chat_template_hf.py)");
    return;
  }
  std::ifstream in(std::filesystem::path(dir) / "chat_cases.json");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  const json cases = json::parse(buffer.str());
  size_t compared = 0, failures = 0;
  for (const json& c : cases) {
    const std::string family = c.at("family").get<std::string>();
    const ChatTemplate t = Make(c.at("template").get<std::string>(), "auto",
                                c.at("bos").get<std::string>(), c.at("eos").get<std::string>());
    std::vector<ChatMessage> messages;
    for (const json& m : c.at("messages")) {
      messages.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
    }
    const auto rendered = t.Render(messages, c.at("add_generation_prompt").get<bool>());
    ++compared;
    bool ok;
    if (c.at("expected").is_null()) {
      ok = !rendered.ok() && rendered.status().code() == StatusCode::kInvalidArgument;
    } else {
      ok = rendered.ok() && *rendered == c.at("expected").get<std::string>();
    }
    if (std::string(ChatTemplateFamilyName(t.family())) != family) ok = false;
    if (!ok) {
      ++failures;
      std::printf("MISMATCH %s case %zu\n  ours: %s\n  hf:   %s\n", family.c_str(), compared - 1,
                  rendered.ok() ? json(*rendered).dump().c_str() : rendered.status().ToString().c_str(),
                  c.at("expected").dump().c_str());
    }
  }
  std::printf("chat_template_cases: %zu conversations compared, %zu mismatches\n", compared, failures);
  CHECK(compared > 0);
  CHECK(failures == 0);
}

}  // namespace
}  // namespace tandem
