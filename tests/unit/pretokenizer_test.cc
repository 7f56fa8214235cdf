// Pre-tokenizers (Split behaviours, Digits, Punctuation, Whitespace, Metaspace, ...), byte-level
// vocabularies without some byte symbols, byte fallback without byte tokens, and the tokenizer
// built from GGUF metadata. The expected pieces are the examples of the Hugging Face `tokenizers`
// documentation; tests/python/test_tokenizer_hf.py and test_tokenizer_gguf_hf.py compare the same
// code with `tokenizers` itself on many strings.
#include "common/text/pretokenizer.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/text/bpe.h"
#include "common/text/gguf_vocab.h"
#include "common/text/tokenizer.h"

namespace tandem {
namespace {

using json = nlohmann::json;
using Words = std::vector<std::string>;

Words Run(const std::vector<PreTokenizerOp>& ops, const std::string& text, bool at_start = true) {
  std::vector<PreTokenizedWord> words{{text, at_start}};
  for (const PreTokenizerOp& op : ops) {
    std::vector<PreTokenizedWord> next;
    ApplyPreTokenizer(op, &words, &next);
    words.swap(next);
  }
  Words out;
  for (const auto& w : words) out.push_back(w.text);
  return out;
}

PreTokenizerOp SplitOp(const std::string& regex, SplitBehavior behavior, bool invert = false) {
  auto compiled = SplitRegex::Compile(regex);
  INFO(regex);
  REQUIRE(compiled.ok());
  return PreTokenizerOp::Split(*compiled, behavior, invert);
}

TEST_CASE("Split behaviours as tokenizers documents them", "[tokenizer][pretokenizer]") {
  const std::string text = "the-final--countdown";
  auto literal = [&](SplitBehavior b) {
    return Run({PreTokenizerOp::Split(SplitRegex::Literal("-"), b, false)}, text);
  };
  CHECK(literal(SplitBehavior::kRemoved) == Words{"the", "final", "countdown"});
  CHECK(literal(SplitBehavior::kIsolated) == Words{"the", "-", "final", "-", "-", "countdown"});
  CHECK(literal(SplitBehavior::kMergedWithPrevious) == Words{"the-", "final-", "-", "countdown"});
  CHECK(literal(SplitBehavior::kMergedWithNext) == Words{"the", "-final", "-", "-countdown"});
  CHECK(literal(SplitBehavior::kContiguous) == Words{"the", "-", "final", "--", "countdown"});
  // The same through ICU, and inverted: the matches become the gaps.
  CHECK(Run({SplitOp("-", SplitBehavior::kContiguous)}, text) ==
        Words{"the", "-", "final", "--", "countdown"});
  CHECK(Run({SplitOp("\\p{L}+", SplitBehavior::kRemoved, /*invert=*/true)}, text) ==
        Words{"the", "final", "countdown"});
  // An empty match right after a match is skipped one character on (the onig crate's rule).
  CHECK(Run({SplitOp("x*", SplitBehavior::kIsolated)}, "abxc") == Words{"a", "b", "x", "c"});
  CHECK(Run({PreTokenizerOp::Split(SplitRegex::Literal(""), SplitBehavior::kIsolated, false)},
            "añb") == Words{"a", "ñ", "b"});
}

TEST_CASE("ICU regexes split as the hand-coded patterns", "[tokenizer][pretokenizer]") {
  auto known = SplitRegex::Compile(kLlama3SplitRegex);
  REQUIRE(known.ok());
  CHECK(known->hand_coded());
  // The same pattern inside a group is not recognised, so ICU runs it.
  const std::string wrapped = std::string("(?:") + kLlama3SplitRegex + ")";
  auto icu = SplitRegex::Compile(wrapped);
  REQUIRE(icu.ok());
  CHECK_FALSE(icu->hand_coded());
  for (const char* text :
       {"I'LL pay 12345!!\n\n  ok", "x  \n y", "ſ'S naïve 😀 ١٢٣٤ \t\r\n", "don't\u00a0stop  ",
        "\xff\xfe"
        "ab 12"}) {
    INFO(text);
    CHECK(Run({SplitOp(wrapped, SplitBehavior::kIsolated)}, text) ==
          Run({SplitOp(kLlama3SplitRegex, SplitBehavior::kIsolated)}, text));
  }
}

TEST_CASE("Digits, Punctuation, Whitespace, WhitespaceSplit", "[tokenizer][pretokenizer]") {
  CHECK(Run({PreTokenizerOp::Digits(true)}, "Call 123 please") ==
        Words{"Call ", "1", "2", "3", " please"});
  CHECK(Run({PreTokenizerOp::Digits(false)}, "Call 123 please") ==
        Words{"Call ", "123", " please"});
  CHECK(Run({PreTokenizerOp::Digits(true)}, "½٣") == Words{"½", "٣"});  // \p{N}, not just 0-9
  const std::string text = "Hey friend!     How are you?!?";
  CHECK(Run({PreTokenizerOp::Punctuation(SplitBehavior::kIsolated)}, text) ==
        Words{"Hey friend", "!", "     How are you", "?", "!", "?"});
  CHECK(Run({PreTokenizerOp::Punctuation(SplitBehavior::kContiguous)}, "a+=b") ==
        Words{"a", "+=", "b"});  // ASCII '+' and '=' count as punctuation, as in tokenizers
  CHECK(Run({PreTokenizerOp::Whitespace()}, text) ==
        Words{"Hey", "friend", "!", "How", "are", "you", "?!?"});
  CHECK(Run({PreTokenizerOp::WhitespaceSplit()}, text) ==
        Words{"Hey", "friend!", "How", "are", "you?!?"});
  CHECK(Run({PreTokenizerOp::WhitespaceSplit()}, "a\u3000b\u00a0c") == Words{"a", "b", "c"});
}

TEST_CASE("Metaspace replaces spaces and prepends by scheme", "[tokenizer][pretokenizer]") {
  using Scheme = PreTokenizerOp::PrependScheme;
  const std::string bar = "\u2581";
  CHECK(Run({PreTokenizerOp::Metaspace(bar, Scheme::kAlways, true)}, "Hey friend") ==
        Words{"▁Hey", "▁friend"});
  CHECK(Run({PreTokenizerOp::Metaspace(bar, Scheme::kNever, false)}, "Hey  friend") ==
        Words{"Hey▁▁friend"});
  CHECK(Run({PreTokenizerOp::Metaspace(bar, Scheme::kFirst, false)}, "Hey", true) == Words{"▁Hey"});
  CHECK(Run({PreTokenizerOp::Metaspace(bar, Scheme::kFirst, false)}, "Hey", false) == Words{"Hey"});
  CHECK(Run({PreTokenizerOp::Metaspace(bar, Scheme::kAlways, true)}, " a  b") ==
        Words{"▁a", "▁", "▁b"});
}

TEST_CASE("ByteLevel maps bytes and later steps see mapped text", "[tokenizer][pretokenizer]") {
  CHECK(Run({PreTokenizerOp::Digits(true), PreTokenizerOp::ByteLevel(false, true)}, "ab 12 c") ==
        Words{"ab", "Ġ", "1", "2", "Ġc"});
  CHECK(Run({PreTokenizerOp::ByteLevel(true, false)}, "x y") == Words{"ĠxĠy"});
  CHECK(Run({PreTokenizerOp::ByteLevel(false, false), PreTokenizerOp::WhitespaceSplit()}, "x y") ==
        Words{"xĠy"});  // Ġ is not whitespace
}

// A byte-level tokenizer.json whose vocabulary has every byte symbol except `missing`.
std::string ByteLevelJson(const std::vector<int>& missing, const json& pre_tokenizer,
                          bool with_unk) {
  json vocab = json::object();
  int32_t next = 0;
  vocab["<unk>"] = next++;
  for (int b = 0; b < 256; ++b) {
    if (std::find(missing.begin(), missing.end(), b) != missing.end()) continue;
    vocab[ByteLevelChar(static_cast<uint8_t>(b))] = next++;
  }
  json model = {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}};
  if (with_unk) model["unk_token"] = "<unk>";
  return json({{"pre_tokenizer", pre_tokenizer},
               {"decoder", {{"type", "ByteLevel"}}},
               {"model", model}})
      .dump();
}

TEST_CASE("A byte without its byte-level symbol becomes the unknown token",
          "[tokenizer][pretokenizer]") {
  const json pre = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  auto tok = Tokenizer::FromJson(ByteLevelJson({4, 0x80}, pre, true), "", "test");
  INFO((tok.ok() ? std::string("ok") : tok.status().ToString()));
  REQUIRE(tok.ok());
  const auto ids = tok->Encode(
      "a\x04"
      "b\xc2\x80",
      false);
  // "\xc2\x80" is one character of two bytes: only its second byte lacks a symbol.
  std::vector<std::string> pieces;
  for (int32_t id : ids) pieces.push_back(*tok->IdToToken(id));
  CHECK(pieces == std::vector<std::string>{"a", "<unk>", "b", "Â", "<unk>"});
  // Without an unknown token the byte is dropped, as tokenizers does.
  auto no_unk = Tokenizer::FromJson(ByteLevelJson({4}, pre, false), "", "test");
  REQUIRE(no_unk.ok());
  CHECK(no_unk->Decode(no_unk->Encode("a\x04"
                                      "b",
                                      false),
                       false) == "ab");
}

TEST_CASE("Byte fallback without byte tokens gives the unknown token",
          "[tokenizer][pretokenizer]") {
  json vocab = {{"<unk>", 0}, {"a", 1}, {"<0xC3>", 2}, {"<0xA9>", 3}};
  const json root = {{"model",
                      {{"type", "BPE"},
                       {"unk_token", "<unk>"},
                       {"byte_fallback", true},
                       {"vocab", vocab},
                       {"merges", json::array()}}},
                     {"decoder", {{"type", "ByteFallback"}}}};
  auto tok = Tokenizer::FromJson(root.dump(), "", "test");
  INFO((tok.ok() ? std::string("ok") : tok.status().ToString()));
  REQUIRE(tok.ok());
  // é is C3 A9, both present; ñ is C3 B1, B1 is not: the whole character is unk.
  CHECK(tok->Encode("aéñ", false) == std::vector<int32_t>{1, 2, 3, 0});
}

TEST_CASE("Unsupported or broken pre-tokenizers are refused by name", "[tokenizer][pretokenizer]") {
  auto error = [](const json& pre) {
    const json root = {
        {"pre_tokenizer", pre},
        {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}}}, {"merges", json::array()}}}};
    auto tok = Tokenizer::FromJson(root.dump(), "", "dir/tokenizer.json");
    REQUIRE_FALSE(tok.ok());
    CHECK(tok.status().code() == StatusCode::kInvalidArgument);
    return tok.status().message();
  };
  std::string message =
      error({{"type", "Split"}, {"pattern", {{"Regex", "(a"}}}, {"behavior", "Isolated"}});
  CHECK(message.find("dir/tokenizer.json: pre_tokenizer: Split: regex '(a' does not compile") !=
        std::string::npos);
  message =
      error({{"type", "Sequence"},
             {"pretokenizers",
              {{{"type", "Digits"}},
               {{"type", "Split"}, {"pattern", {{"String", "x"}}}, {"behavior", "Sideways"}}}}});
  CHECK(message.find("pretokenizers[1]: Split: unknown behavior 'Sideways'") != std::string::npos);
  message = error({{"type", "BertPreTokenizer"}});
  CHECK(message.find("type 'BertPreTokenizer' is not supported") != std::string::npos);
  CHECK(message.find("Metaspace") != std::string::npos);  // lists what is supported
  message = error({{"type", "Metaspace"}, {"replacement", "__"}});
  CHECK(message.find("replacement '__' is not exactly one character") != std::string::npos);
  message = error({{"type", "Metaspace"}, {"replacement", "_"}, {"prepend_scheme", "sometimes"}});
  CHECK(message.find("unknown prepend_scheme 'sometimes'") != std::string::npos);
  message = error({{"type", "Split"}, {"pattern", {{"Glob", "*"}}}, {"behavior", "Isolated"}});
  CHECK(message.find("String or Regex") != std::string::npos);
}

// A tiny GGUF vocabulary: two control tokens, the byte symbols but for byte 4, two merges.
GgufVocab TinyGgufVocab() {
  GgufVocab v;
  v.model = "gpt2";
  v.pre = "smollm";
  v.tokens = {"<|endoftext|>", "<|im_start|>"};
  v.token_types = {GgufTokenType::kControl, GgufTokenType::kControl};
  for (int b = 0; b < 256; ++b) {
    if (b == 4) continue;
    v.tokens.push_back(ByteLevelChar(static_cast<uint8_t>(b)));
    v.token_types.push_back(GgufTokenType::kNormal);
  }
  for (const char* merged : {"he", "hel"}) {
    v.tokens.push_back(merged);
    v.token_types.push_back(GgufTokenType::kNormal);
  }
  v.merges = {"h e", "he l"};
  v.bos_id = 1;
  v.eos_id = 0;
  v.unk_id = 0;
  v.pad_id = 0;
  v.add_bos = true;
  v.chat_template = "{{ messages }}";
  return v;
}

TEST_CASE("TokenizerFromGguf builds the Hugging Face tokenizer of the model",
          "[tokenizer][gguf_tokenizer]") {
  auto tok = TokenizerFromGguf(TinyGgufVocab(), "tiny.gguf");
  INFO((tok.ok() ? std::string("ok") : tok.status().ToString()));
  REQUIRE(tok.ok());
  const auto ids = tok->Encode("hel 42<|im_start|>\x04", true);
  std::vector<std::string> pieces;
  for (int32_t id : ids) pieces.push_back(*tok->IdToToken(id));
  // add_bos, digits one by one (smollm), the control token matched whole, byte 4 -> unk.
  CHECK(pieces == std::vector<std::string>{"<|im_start|>", "hel", "Ġ", "4", "2", "<|im_start|>",
                                           "<|endoftext|>"});
  CHECK(tok->IsSpecial(1));
  CHECK(tok->bos_id() == 1);
  CHECK(tok->eos_id() == 0);
  CHECK(tok->pad_id() == 0);
  CHECK(tok->chat_template() == "{{ messages }}");
  CHECK(tok->Decode(ids, true) == "hel 42");
}

TEST_CASE("TokenizerFromGguf names the file and the bad value", "[tokenizer][gguf_tokenizer]") {
  auto error = [](const GgufVocab& v) {
    auto tok = TokenizerFromGguf(v, "/models/x.gguf");
    REQUIRE_FALSE(tok.ok());
    CHECK(tok.status().code() == StatusCode::kInvalidArgument);
    CHECK(tok.status().message().starts_with("/models/x.gguf: "));
    return tok.status().message();
  };
  GgufVocab v = TinyGgufVocab();
  v.model = "llama";
  CHECK(error(v).find("tokenizer.ggml.model 'llama' (SentencePiece) is not supported") !=
        std::string::npos);
  v = TinyGgufVocab();
  v.pre = "jais";
  CHECK(error(v).find("tokenizer.ggml.pre 'jais' is not supported") != std::string::npos);
  v = TinyGgufVocab();
  v.bos_id = 100000;
  CHECK(error(v).find("tokenizer.ggml.bos_token_id 100000 is not a token id") != std::string::npos);
  v = TinyGgufVocab();
  v.token_types.pop_back();
  CHECK(error(v).find("tokenizer.ggml.token_type has") != std::string::npos);
  v = TinyGgufVocab();
  v.token_types[5] = static_cast<GgufTokenType>(9);
  CHECK(error(v).find("tokenizer.ggml.token_type[5] is 9") != std::string::npos);
  v = TinyGgufVocab();
  v.tokens[3] = v.tokens[2];
  CHECK(error(v).find("tokenizer.ggml.tokens[3]") != std::string::npos);
  v = TinyGgufVocab();
  v.merges.push_back("he");
  CHECK(error(v).find("tokenizer.ggml.merges[2] 'he'") != std::string::npos);
  v = TinyGgufVocab();
  v.merges.push_back("x yz");
  CHECK(error(v).find("merge #2 'x yz'") != std::string::npos);
  v = TinyGgufVocab();
  v.bos_id.reset();
  CHECK(error(v).find("add_bos_token is true") != std::string::npos);
}

}  // namespace
}  // namespace tandem
