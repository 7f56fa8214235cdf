// TokenizerFromGguf (common/text/gguf_vocab.h): the GGUF metadata turned into the tokenizer.json
// and tokenizer_config.json of the Hugging Face model the file was converted from, then loaded by
// Tokenizer::FromJson, so a GGUF tokenizer runs exactly the code a tokenizer.json does.
//
// tokenizer.ggml.pre names the pre-tokenizer as llama.cpp's converter recognised it; each name
// maps to the pre-tokenizer (and normalizer, and model flags) of that family's tokenizer.json.
#include <nlohmann/json.hpp>

#include "common/text/gguf_vocab.h"
#include "common/text/pretokenizer.h"
#include "common/text/unicode.h"

namespace tandem {
namespace {

using json = nlohmann::json;

json ByteLevel(bool use_regex) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", false},
          {"trim_offsets", true},
          {"use_regex", use_regex}};
}

json IsolatedSplit(const char* regex) {
  return {{"type", "Split"},
          {"pattern", {{"Regex", regex}}},
          {"behavior", "Isolated"},
          {"invert", false}};
}

// The normalizer, pre-tokenizer and BPE flags of the tokenizer.json behind a `pre` value.
struct PreTokenizerSpec {
  json normalizer;  // null: none
  json pre_tokenizer;
  bool ignore_merges = false;
};

std::optional<PreTokenizerSpec> SpecForPre(const std::string& pre) {
  PreTokenizerSpec spec;
  if (pre == "smollm" || pre == "starcoder" || pre == "refact") {
    // tokenizer.json: Sequence[Digits(individual_digits), ByteLevel(use_regex)].
    spec.pre_tokenizer = {
        {"type", "Sequence"},
        {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, ByteLevel(true)}}};
  } else if (pre == "gpt2") {
    spec.pre_tokenizer = ByteLevel(true);
  } else if (pre == "llama-bpe" || pre == "llama3") {
    spec.pre_tokenizer = {{"type", "Sequence"},
                          {"pretokenizers", {IsolatedSplit(kLlama3SplitRegex), ByteLevel(false)}}};
    spec.ignore_merges = true;
  } else if (pre == "qwen2" || pre == "deepseek-r1-qwen") {
    spec.normalizer = {{"type", "NFC"}};
    spec.pre_tokenizer = {{"type", "Sequence"},
                          {"pretokenizers", {IsolatedSplit(kQwen2SplitRegex), ByteLevel(false)}}};
  } else if (pre == "default") {
    // No Hugging Face model: llama.cpp's own default, its four regexes applied in turn.
    spec.pre_tokenizer = {
        {"type", "Sequence"},
        {"pretokenizers",
         {IsolatedSplit(R"([\p{P}\$\+<=>\^~\|]+)"), IsolatedSplit(kGpt2SplitRegex),
          IsolatedSplit(R"(\p{N}+)"), IsolatedSplit("[0-9][0-9][0-9]"), ByteLevel(false)}}};
  } else {
    return std::nullopt;
  }
  return spec;
}

json AddedToken(int32_t id, const std::string& content, bool special) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", special}};
}

Status CheckId(const std::optional<int32_t>& id, const char* key, size_t vocab_size) {
  if (id && (*id < 0 || static_cast<size_t>(*id) >= vocab_size)) {
    return InvalidArgument(std::string(key) + " " + std::to_string(*id) +
                           " is not a token id (the vocabulary has " + std::to_string(vocab_size) +
                           " tokens)");
  }
  return Status::Ok();
}

// The model's vocabulary (token -> id) and the added tokens, from the tokens and their types.
Status BuildVocab(const GgufVocab& vocab, json* model_vocab_out, json* added_out) {
  const size_t n = vocab.tokens.size();
  json& model_vocab = *model_vocab_out;
  json& added = *added_out;
  for (size_t i = 0; i < n; ++i) {
    const std::string& token = vocab.tokens[i];
    const auto id = static_cast<int32_t>(i);
    if (token.empty() || !unicode::IsValidUtf8(token)) {
      return InvalidArgument("tokenizer.ggml.tokens[" + std::to_string(i) +
                             "] is empty or not valid UTF-8");
    }
    const auto [it, inserted] = model_vocab.emplace(token, id);
    if (!inserted) {
      return InvalidArgument("tokenizer.ggml.tokens[" + std::to_string(i) + "] '" + token +
                             "' repeats token " + std::to_string(it.value().get<int32_t>()));
    }
    const GgufTokenType type =
        vocab.token_types.empty() ? GgufTokenType::kNormal : vocab.token_types[i];
    switch (type) {
      case GgufTokenType::kUndefined:
      case GgufTokenType::kNormal:
      case GgufTokenType::kUnused:
      case GgufTokenType::kByte:
        break;
      // What the converter wrote for the model's added tokens: special ones (and the unknown
      // token) as control, the others as user-defined. All are matched before pre-tokenization.
      case GgufTokenType::kUnknown:
      case GgufTokenType::kControl:
        added.push_back(AddedToken(id, token, /*special=*/true));
        break;
      case GgufTokenType::kUserDefined:
        added.push_back(AddedToken(id, token, /*special=*/false));
        break;
      default:
        return InvalidArgument("tokenizer.ggml.token_type[" + std::to_string(i) + "] is " +
                               std::to_string(static_cast<int32_t>(type)) +
                               ", not a known token type (0-6)");
    }
  }
  return Status::Ok();
}

Status BuildMerges(const GgufVocab& vocab, json* merges_out) {
  json& merges = *merges_out;
  for (size_t i = 0; i < vocab.merges.size(); ++i) {
    const std::string& merge = vocab.merges[i];
    const size_t space = merge.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == merge.size() ||
        merge.find(' ', space + 1) != std::string::npos) {
      return InvalidArgument("tokenizer.ggml.merges[" + std::to_string(i) + "] '" + merge +
                             "' is not two tokens separated by one space");
    }
    if (!unicode::IsValidUtf8(merge)) {
      return InvalidArgument("tokenizer.ggml.merges[" + std::to_string(i) + "] is not valid UTF-8");
    }
    merges.push_back(merge);
  }

  return Status::Ok();
}

// A TemplateProcessing post-processor for add_bos / add_eos (null when neither).
Status BuildPostProcessor(const GgufVocab& vocab, json* post_processor_out) {
  json& post_processor = *post_processor_out;
  // add_bos / add_eos: absent means false, as in the tokenizer.json of byte-level BPE models.
  const bool add_bos = vocab.add_bos.value_or(false);
  const bool add_eos = vocab.add_eos.value_or(false);
  if (add_bos || add_eos) {
    json single = json::array();
    json specials = json::object();
    auto special = [&](const std::optional<int32_t>& id, const char* key) -> Status {
      if (!id)
        return InvalidArgument(std::string("tokenizer.ggml.") + key + " is true but the " +
                               "token id is not given");
      const std::string& content = vocab.tokens[*id];
      single.push_back({{"SpecialToken", {{"id", content}, {"type_id", 0}}}});
      specials[content] = {{"id", content}, {"ids", {*id}}, {"tokens", {content}}};
      return Status::Ok();
    };
    if (add_bos) TANDEM_RETURN_IF_ERROR(special(vocab.bos_id, "add_bos_token"));
    single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
    if (add_eos) TANDEM_RETURN_IF_ERROR(special(vocab.eos_id, "add_eos_token"));
    post_processor = {{"type", "TemplateProcessing"},
                      {"single", std::move(single)},
                      {"special_tokens", std::move(specials)}};
  }

  return Status::Ok();
}

// tokenizer.json and tokenizer_config.json equivalent to `vocab`.
Status BuildJson(const GgufVocab& vocab, json* tokenizer, json* config) {
  if (vocab.model != "gpt2") {
    if (vocab.model == "llama") {
      return InvalidArgument(
          "tokenizer.ggml.model 'llama' (SentencePiece) is not supported; only 'gpt2' (byte-level "
          "BPE) is");
    }
    return InvalidArgument("tokenizer.ggml.model '" + vocab.model +
                           "' is not supported; only 'gpt2' (byte-level BPE) is");
  }
  const auto spec = SpecForPre(vocab.pre);
  if (!spec) {
    return InvalidArgument("tokenizer.ggml.pre '" + vocab.pre +
                           "' is not supported (supported: smollm, starcoder, refact, gpt2, "
                           "llama-bpe, qwen2, deepseek-r1-qwen, default)");
  }
  const size_t n = vocab.tokens.size();
  if (n == 0) return InvalidArgument("tokenizer.ggml.tokens is empty");
  if (!vocab.token_types.empty() && vocab.token_types.size() != n) {
    return InvalidArgument("tokenizer.ggml.token_type has " +
                           std::to_string(vocab.token_types.size()) + " entries for " +
                           std::to_string(n) + " tokens");
  }
  TANDEM_RETURN_IF_ERROR(CheckId(vocab.bos_id, "tokenizer.ggml.bos_token_id", n));
  TANDEM_RETURN_IF_ERROR(CheckId(vocab.eos_id, "tokenizer.ggml.eos_token_id", n));
  TANDEM_RETURN_IF_ERROR(CheckId(vocab.unk_id, "tokenizer.ggml.unknown_token_id", n));
  TANDEM_RETURN_IF_ERROR(CheckId(vocab.pad_id, "tokenizer.ggml.padding_token_id", n));

  json model_vocab = json::object();
  json added = json::array();
  TANDEM_RETURN_IF_ERROR(BuildVocab(vocab, &model_vocab, &added));
  json merges = json::array();
  TANDEM_RETURN_IF_ERROR(BuildMerges(vocab, &merges));
  json model = {{"type", "BPE"},
                {"dropout", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", spec->ignore_merges},
                {"vocab", std::move(model_vocab)},
                {"merges", std::move(merges)}};
  model["unk_token"] = vocab.unk_id ? json(vocab.tokens[*vocab.unk_id]) : json(nullptr);

  json post_processor = nullptr;
  TANDEM_RETURN_IF_ERROR(BuildPostProcessor(vocab, &post_processor));
  *tokenizer = {{"version", "1.0"},
                {"truncation", nullptr},
                {"padding", nullptr},
                {"added_tokens", std::move(added)},
                {"normalizer", spec->normalizer},
                {"pre_tokenizer", spec->pre_tokenizer},
                {"post_processor", std::move(post_processor)},
                {"decoder", ByteLevel(true)},
                {"model", std::move(model)}};
  *config = json::object();
  if (vocab.bos_id) (*config)["bos_token"] = vocab.tokens[*vocab.bos_id];
  if (vocab.eos_id) (*config)["eos_token"] = vocab.tokens[*vocab.eos_id];
  if (vocab.pad_id) (*config)["pad_token"] = vocab.tokens[*vocab.pad_id];
  if (!vocab.chat_template.empty()) (*config)["chat_template"] = vocab.chat_template;
  return Status::Ok();
}

}  // namespace

StatusOr<Tokenizer> TokenizerFromGguf(const GgufVocab& vocab, std::string_view source) {
  json tokenizer;
  json config;
  const Status status = BuildJson(vocab, &tokenizer, &config);
  if (!status.ok()) return status.WithContext(source);
  if (!unicode::IsValidUtf8(vocab.chat_template)) {
    return InvalidArgument(std::string(source) + ": tokenizer.chat_template is not valid UTF-8");
  }
  return Tokenizer::FromJson(tokenizer.dump(), config.dump(), source);
}

}  // namespace tandem
