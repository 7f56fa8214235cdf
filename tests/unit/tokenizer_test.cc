// Tokenizer, streaming detokenizer and BPE trainer tests. The hidden [.hf_tokenizer_cases] and
// [.write_trained_tokenizer] cases are driven by tests/python/test_tokenizer_hf.py, which compares
// us against Hugging Face `tokenizers` / transformers on files it writes to $TANDEM_TEST_DIR.
#include <catch2/catch.hpp>

#include <chrono>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/text/bpe.h"
#include "common/text/bpe_trainer.h"
#include "common/text/gguf_vocab.h"
#include "common/text/pretokenizer.h"
#include "common/text/tokenizer.h"
#include "common/text/unicode.h"

namespace tandem {
namespace {

using json = nlohmann::json;

// A byte-level tokenizer.json with the 256 byte tokens, the given merges and added tokens.
std::string TinyTokenizerJson(const std::vector<std::string>& merges, const json& added_tokens,
                              const json& pre_tokenizer) {
  json vocab = json::object();
  int32_t next = 0;
  for (int b = 0; b < 256; ++b) vocab[ByteLevelChar(static_cast<uint8_t>(b))] = next++;
  for (const std::string& m : merges) {
    const size_t space = m.find(' ');
    const std::string merged = m.substr(0, space) + m.substr(space + 1);
    if (!vocab.contains(merged)) vocab[merged] = next++;
  }
  json root = {{"version", "1.0"},
               {"added_tokens", added_tokens},
               {"normalizer", nullptr},
               {"pre_tokenizer", pre_tokenizer},
               {"post_processor", nullptr},
               {"decoder", {{"type", "ByteLevel"}}},
               {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
  return root.dump();
}

json ByteLevelPreTokenizer() {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
}

json Special(int id, const std::string& content) {
  return {{"id", id},         {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", true}};
}

Tokenizer MustLoad(const std::string& tokenizer_json, const std::string& config = "") {
  auto tokenizer = Tokenizer::FromJson(tokenizer_json, config, "test");
  INFO((tokenizer.ok() ? std::string("ok") : tokenizer.status().ToString()));
  REQUIRE(tokenizer.ok());
  return *tokenizer;
}

std::vector<std::string> Pieces(const Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(tokenizer.IdToToken(id).value_or("?"));
  return out;
}

std::string StreamDecode(const Tokenizer& tokenizer, const std::vector<int32_t>& ids, bool skip,
                         bool* broken_utf8 = nullptr) {
  IncrementalDecoder decoder(tokenizer, skip);
  std::string out;
  for (int32_t id : ids) {
    const std::string delta = decoder.Add(id);
    if (broken_utf8 != nullptr && !unicode::IsValidUtf8(delta)) *broken_utf8 = true;
    out += delta;
  }
  out += decoder.Finish();
  return out;
}

TEST_CASE("BPE applies merges by rank", "[tokenizer]") {
  const Tokenizer tok = MustLoad(
      TinyTokenizerJson({"e l", "l l", "h el", "hel l", "hell o", "Ġ w", "Ġw o"}, json::array(),
                        ByteLevelPreTokenizer()));
  // "e l" outranks "l l", so "ell" is el + l, and the chain builds "hello".
  CHECK(Pieces(tok, tok.Encode("hello", false)) == std::vector<std::string>{"hello"});
  CHECK(Pieces(tok, tok.Encode("ell", false)) == std::vector<std::string>{"el", "l"});
  CHECK(Pieces(tok, tok.Encode("hello wo", false)) == std::vector<std::string>{"hello", "Ġwo"});
  CHECK(Pieces(tok, tok.Encode("llo", false)) == std::vector<std::string>{"ll", "o"});
  CHECK(tok.Decode(tok.Encode("hello wo", false), false) == "hello wo");
  // Bytes that are not valid UTF-8 still round-trip through byte-level tokens as U+FFFD.
  CHECK(tok.Decode(tok.Encode("a\xff" "b", false), false) == "a\xEF\xBF\xBD" "b");
  CHECK(tok.TokenToId("hello").has_value());
  CHECK_FALSE(tok.TokenToId("nope").has_value());
  CHECK(tok.vocab_size() == 256 + 7);
}

TEST_CASE("Merges may be given as pairs", "[tokenizer]") {
  json root = json::parse(TinyTokenizerJson({"a b"}, json::array(), ByteLevelPreTokenizer()));
  root["model"]["merges"] = json::array({json::array({"a", "b"})});
  const Tokenizer tok = MustLoad(root.dump());
  CHECK(Pieces(tok, tok.Encode("ab", false)) == std::vector<std::string>{"ab"});
}

TEST_CASE("Special tokens are matched first, longest first", "[tokenizer]") {
  const json added = json::array({Special(300, "<|eot|>"), Special(301, "<|eot|>x"),
                                  Special(302, "<s>")});
  const Tokenizer tok = MustLoad(TinyTokenizerJson({"h i"}, added, ByteLevelPreTokenizer()));
  const auto ids = tok.Encode("hi<|eot|>there<|eot|>x<s>", false);
  CHECK(Pieces(tok, ids) ==
        std::vector<std::string>{"hi", "<|eot|>", "t", "h", "e", "r", "e", "<|eot|>x", "<s>"});
  CHECK(tok.IsSpecial(300));
  CHECK(tok.Decode(ids, false) == "hi<|eot|>there<|eot|>x<s>");
  CHECK(tok.Decode(ids, true) == "hithere");
  CHECK(StreamDecode(tok, ids, true) == "hithere");
  CHECK(tok.vocab_size() == 303);
}

TEST_CASE("Streaming decoder holds back incomplete UTF-8", "[tokenizer]") {
  const Tokenizer tok = MustLoad(TinyTokenizerJson({}, json::array(), ByteLevelPreTokenizer()));
  const std::string text = "é😀x";  // 2-byte, 4-byte and 1-byte characters, one token per byte
  const auto ids = tok.Encode(text, false);
  REQUIRE(ids.size() == 7);
  IncrementalDecoder decoder(tok, false);
  CHECK(decoder.Add(ids[0]).empty());
  CHECK(decoder.Add(ids[1]) == "é");
  CHECK(decoder.Add(ids[2]).empty());
  CHECK(decoder.Add(ids[3]).empty());
  CHECK(decoder.Add(ids[4]).empty());
  CHECK(decoder.Add(ids[5]) == "😀");
  CHECK(decoder.Add(ids[6]) == "x");
  CHECK(decoder.Finish().empty());

  // A sequence that is cut off ends as one U+FFFD, exactly like one-shot Decode.
  const std::vector<int32_t> cut = {ids[2], ids[3], ids[6]};
  CHECK(tok.Decode(cut, false) == "\xEF\xBF\xBDx");
  bool broken = false;
  CHECK(StreamDecode(tok, cut, false, &broken) == "\xEF\xBF\xBDx");
  CHECK_FALSE(broken);
  const std::vector<int32_t> dangling = {ids[6], ids[2]};
  CHECK(StreamDecode(tok, dangling, false, &broken) == "x\xEF\xBF\xBD");
  CHECK_FALSE(broken);
}

TEST_CASE("Pre-tokenizer patterns split like the regexes", "[tokenizer]") {
  auto split = [](std::string_view text, SplitPattern p) {
    std::vector<std::string> out;
    for (const auto& [b, e] : SplitText(text, p)) out.emplace_back(text.substr(b, e - b));
    return out;
  };
  CHECK(split("Hello world's 12345  x\n\n", SplitPattern::kGpt2) ==
        std::vector<std::string>{"Hello", " world", "'s", " 12345", " ", " x", "\n\n"});
  CHECK(split("I'LL pay 12345!!\n\n  ok", SplitPattern::kLlama3) ==
        std::vector<std::string>{"I", "'LL", " pay", " ", "123", "45", "!!\n\n", " ", " ok"});
  CHECK(split("a 12", SplitPattern::kQwen2) == std::vector<std::string>{"a", " ", "1", "2"});
  CHECK(split("x  \n y", SplitPattern::kLlama3) == std::vector<std::string>{"x", "  \n", " y"});
}

TEST_CASE("SentencePiece-style BPE with byte fallback", "[tokenizer]") {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  int next = 259;
  for (const char* t : {"▁", "h", "i", "▁h", "▁hi", "t", "e", "r", "▁t", "er"}) vocab[t] = next++;
  json root = {
      {"added_tokens", json::array({Special(0, "<unk>"), Special(1, "<s>"), Special(2, "</s>")})},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", "▁"}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}}}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                    {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
      {"model",
       {{"type", "BPE"},
        {"unk_token", "<unk>"},
        {"byte_fallback", true},
        {"fuse_unk", true},
        {"vocab", vocab},
        {"merges", {"▁ h", "▁h i", "▁ t", "e r"}}}}};
  const Tokenizer tok = MustLoad(root.dump());
  const auto ids = tok.Encode("hi ter é", true);
  CHECK(Pieces(tok, ids) == std::vector<std::string>{"<s>", "▁hi", "▁t", "er", "▁", "<0xC3>",
                                                    "<0xA9>"});
  CHECK(tok.Decode(ids, true) == "hi ter é");
  CHECK(tok.Decode(ids, false) == "<s> hi ter é");
  CHECK(StreamDecode(tok, ids, true) == "hi ter é");
  CHECK(StreamDecode(tok, ids, false) == "<s> hi ter é");
  // An invalid byte run is one U+FFFD per byte (ByteFallback), in both decoders.
  const std::vector<int32_t> bad = {ids[1], ids[5]};
  CHECK(tok.Decode(bad, false) == "hi\xEF\xBF\xBD");
  CHECK(StreamDecode(tok, bad, false) == "hi\xEF\xBF\xBD");
}

TEST_CASE("Malformed tokenizer.json gives a clear error", "[tokenizer]") {
  const auto dir = std::filesystem::temp_directory_path() / ("tandem_tok_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& text) {
    std::ofstream(dir / "tokenizer.json") << text;
  };
  auto load_error = [&]() {
    auto tok = Tokenizer::Load(dir.string());
    REQUIRE_FALSE(tok.ok());
    return tok.status().message();
  };
  const std::string path = (dir / "tokenizer.json").string();

  write("{ not json");
  std::string message = load_error();
  CHECK(message.find(path) != std::string::npos);
  CHECK(message.find("not valid JSON") != std::string::npos);

  write(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})");
  message = load_error();
  CHECK(message.find(path) != std::string::npos);
  CHECK(message.find("merge #0 'a b'") != std::string::npos);

  write(R"({"model": {"type": "BPE", "vocab": {"a": "zero"}}})");
  CHECK(load_error().find("model.vocab['a']") != std::string::npos);

  write(R"({"model": {"type": "Unigram", "vocab": []}})");
  CHECK(load_error().find("Unigram") != std::string::npos);

  json root = json::parse(TinyTokenizerJson({}, json::array(), ByteLevelPreTokenizer()));
  root["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "\\w+("}}}, {"behavior", "Isolated"}};
  write(root.dump());
  message = load_error();
  CHECK(message.find("regex '\\w+(' does not compile") != std::string::npos);
  CHECK(message.find("pre_tokenizer") != std::string::npos);

  root = json::parse(TinyTokenizerJson({}, json::array(), ByteLevelPreTokenizer()));
  root["added_tokens"] = json::array({{{"id", "x"}}});
  write(root.dump());
  CHECK(load_error().find("added_tokens[0]") != std::string::npos);

  root = json::parse(TinyTokenizerJson({}, json::array(), ByteLevelPreTokenizer()));
  root["model"]["merges"] = 7;  // wrong type deep inside: no exception may escape
  write(root.dump());
  CHECK(load_error().find("merges") != std::string::npos);

  write(TinyTokenizerJson({}, json::array(), ByteLevelPreTokenizer()));
  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "<|missing|>"})";
  CHECK(load_error().find("eos_token '<|missing|>'") != std::string::npos);

  std::filesystem::remove_all(dir);
  auto missing = Tokenizer::Load(dir.string());
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == StatusCode::kNotFound);
}

TEST_CASE("TrainTokenizer is deterministic and loads", "[tokenizer][trainer]") {
  for (TokenizerFamily family : {TokenizerFamily::kLlama3, TokenizerFamily::kQwen2}) {
    const auto start = std::chrono::steady_clock::now();
    auto a = TrainTokenizer(family, 2000, 42);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    auto b = TrainTokenizer(family, 2000, 42);
    auto c = TrainTokenizer(family, 2000, 43);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    REQUIRE(c.ok());
    CHECK(a->tokenizer_json == b->tokenizer_json);
    CHECK(a->tokenizer_config_json == b->tokenizer_config_json);
    CHECK(a->tokenizer_json != c->tokenizer_json);
    INFO("trained in " << seconds << " s");  // reported, never asserted (shared machine)

    const Tokenizer tok = MustLoad(a->tokenizer_json, a->tokenizer_config_json);
    CHECK(tok.vocab_size() == 2000);
    const std::string text = "The quick brown fox's 12345 jumps — naïve café 😀\n\n  def f(x):";
    const auto with_special = tok.Encode(text, true);
    const auto plain = tok.Encode(text, false);
    CHECK(tok.Decode(plain, false) == text);
    CHECK(plain.size() < text.size());  // merges were learned and used
    if (family == TokenizerFamily::kLlama3) {
      REQUIRE(tok.bos_id().has_value());
      CHECK(with_special.front() == *tok.bos_id());
      CHECK(with_special.size() == plain.size() + 1);
      CHECK(tok.eos_token() == "<|eot_id|>");
      CHECK(tok.chat_template().find("<|start_header_id|>") != std::string::npos);
    } else {
      CHECK_FALSE(tok.bos_id().has_value());
      CHECK(with_special == plain);
      CHECK(tok.eos_token() == "<|im_end|>");
    }
  }
  CHECK_FALSE(TrainTokenizer(TokenizerFamily::kQwen2, 100, 1).ok());
}

// ---- driven by tests/python/test_tokenizer_hf.py -------------------------------------------

const char* TestDir() { return std::getenv("TANDEM_TEST_DIR"); }

std::string ReadAll(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

TEST_CASE("Trained tokenizers written for transformers", "[.write_trained_tokenizer]") {
  if (TestDir() == nullptr) {
    WARN("TANDEM_TEST_DIR is not set; skipping (run through tests/python/test_tokenizer_hf.py)");
    return;
  }
  const std::filesystem::path root = TestDir();
  for (const auto& [name, family] : {std::pair{"trained_llama3", TokenizerFamily::kLlama3},
                                     std::pair{"trained_qwen2", TokenizerFamily::kQwen2}}) {
    const auto start = std::chrono::steady_clock::now();
    auto files = TrainTokenizer(family, 4000, 1234);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    REQUIRE(files.ok());
    std::printf("TrainTokenizer %s vocab 4000: %.2f s\n", name, seconds);
    std::filesystem::create_directories(root / name);
    std::ofstream(root / name / "tokenizer.json") << files->tokenizer_json;
    std::ofstream(root / name / "tokenizer_config.json") << files->tokenizer_config_json;
  }
}

// A GgufVocab written as JSON by tests/python/test_tokenizer_gguf_hf.py from a GGUF file's
// metadata (the GGUF reader is not needed to test the tokenizer built from it).
StatusOr<Tokenizer> TokenizerFromGgufJson(const std::string& path) {
  const json v = json::parse(ReadAll(path));
  GgufVocab vocab;
  vocab.model = v.at("model").get<std::string>();
  vocab.pre = v.at("pre").get<std::string>();
  vocab.tokens = v.at("tokens").get<std::vector<std::string>>();
  for (const json& type : v.at("token_types")) {
    vocab.token_types.push_back(static_cast<GgufTokenType>(type.get<int32_t>()));
  }
  vocab.merges = v.at("merges").get<std::vector<std::string>>();
  auto id = [&](const char* key) -> std::optional<int32_t> {
    if (!v.contains(key) || v.at(key).is_null()) return std::nullopt;
    return v.at(key).get<int32_t>();
  };
  auto flag = [&](const char* key) -> std::optional<bool> {
    if (!v.contains(key) || v.at(key).is_null()) return std::nullopt;
    return v.at(key).get<bool>();
  };
  vocab.bos_id = id("bos_id");
  vocab.eos_id = id("eos_id");
  vocab.unk_id = id("unk_id");
  vocab.pad_id = id("pad_id");
  vocab.add_bos = flag("add_bos");
  vocab.add_eos = flag("add_eos");
  vocab.chat_template = v.value("chat_template", "");
  return TokenizerFromGguf(vocab, path);
}

TEST_CASE("Encodings match Hugging Face tokenizers", "[.hf_tokenizer_cases]") {
  if (TestDir() == nullptr) {
    WARN("TANDEM_TEST_DIR is not set; skipping (run through tests/python/test_tokenizer_hf.py)");
    return;
  }
  const std::filesystem::path root = TestDir();
  const json cases = json::parse(ReadAll(root / "cases.json"));
  size_t compared = 0, failures = 0;
  for (const json& entry : cases.at("tokenizers")) {
    // "dir": a tokenizer.json directory; "gguf": a GgufVocab as JSON.
    const bool gguf = entry.contains("gguf");
    const std::string dir = entry.at(gguf ? "gguf" : "dir").get<std::string>();
    auto loaded = gguf ? TokenizerFromGgufJson(dir) : Tokenizer::Load(dir);
    INFO(dir << ": " << (loaded.ok() ? "ok" : loaded.status().ToString()));
    REQUIRE(loaded.ok());
    const Tokenizer& tok = *loaded;
    size_t bytes = 0;
    double encode_seconds = 0;
    size_t local_failures = 0;
    const json& texts = entry.at("texts");
    for (size_t i = 0; i < texts.size(); ++i) {
      const std::string text = texts[i].get<std::string>();
      const auto start = std::chrono::steady_clock::now();
      const auto plain = tok.Encode(text, false);
      encode_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      bytes += text.size();
      const auto special = tok.Encode(text, true);
      const auto expected_plain = entry.at("ids_plain")[i].get<std::vector<int32_t>>();
      const auto expected_special = entry.at("ids_special")[i].get<std::vector<int32_t>>();
      const std::string decoded = tok.Decode(plain, false);
      const std::string decoded_skip = tok.Decode(plain, true);
      const std::string streamed = StreamDecode(tok, plain, false);
      const std::string streamed_skip = StreamDecode(tok, plain, true);
      std::vector<std::string> problems;
      if (plain != expected_plain) problems.push_back("encode");
      if (special != expected_special) problems.push_back("encode(add_special_tokens)");
      if (decoded != entry.at("decoded")[i].get<std::string>()) problems.push_back("decode");
      if (decoded_skip != entry.at("decoded_skip")[i].get<std::string>()) problems.push_back("decode(skip_special)");
      if (entry.at("roundtrip")[i].get<bool>() && decoded != text) problems.push_back("round trip");
      if (streamed != decoded || streamed_skip != decoded_skip) problems.push_back("streaming");
      ++compared;
      if (!problems.empty()) {
        ++local_failures;
        if (local_failures <= 5) {
          std::string what;
          for (const auto& p : problems) what += p + " ";
          std::printf("MISMATCH %s case %zu [%s]: %s\n  ours: %s\n  hf:   %s\n", dir.c_str(), i,
                      what.c_str(), json(text).dump().c_str(), json(plain).dump().c_str(),
                      json(expected_plain).dump().c_str());
        }
      }
    }
    failures += local_failures;
    std::printf("%s: %zu strings, %zu mismatches, encode %.1f MB/s\n", dir.c_str(), texts.size(),
                local_failures, bytes / 1e6 / std::max(encode_seconds, 1e-9));
  }
  std::printf("hf_tokenizer_cases: %zu strings compared, %zu mismatches\n", compared, failures);
  CHECK(compared > 0);
  CHECK(failures == 0);
}

}  // namespace
}  // namespace tandem
