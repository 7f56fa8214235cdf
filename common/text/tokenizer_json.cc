// Tokenizer::Load and Tokenizer::FromJson: tokenizer.json and tokenizer_config.json read into
// a TokenizerState (common/text/tokenizer_state.h). Every component that is not supported is
// refused with an error naming it.
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/text/tokenizer.h"
#include "common/text/tokenizer_state.h"

namespace tandem {

using json = nlohmann::json;

namespace {

using tokenizer_internal::AddedToken;
using tokenizer_internal::DecoderSpec;
using tokenizer_internal::NormalizerOp;
using tokenizer_internal::ReplaceAll;

// The byte value of a "<0xNN>" token, or -1.
int ByteTokenValue(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return -1;
  int value = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = token[i];
    int digit;
    if (c >= '0' && c <= '9')
      digit = c - '0';
    else if (c >= 'A' && c <= 'F')
      digit = c - 'A' + 10;
    else if (c >= 'a' && c <= 'f')
      digit = c - 'a' + 10;
    else
      return -1;
    value = value * 16 + digit;
  }
  return value;
}

// Reads a whole file; NotFound when it does not exist.
StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open " + path);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return DataLoss("error reading " + path);
  return buffer.str();
}

// Reads "bos_token" style fields: a string, {"content": "..."} or null.
std::string TokenField(const json& config, const char* key) {
  if (!config.contains(key)) return "";
  const json& value = config.at(key);
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value.at("content").is_string()) {
    return value.at("content").get<std::string>();
  }
  return "";
}

Status ParseNormalizer(const json& node, std::vector<NormalizerOp>* ops) {
  if (node.is_null()) return Status::Ok();
  const std::string type = node.value("type", "");
  if (type == "Sequence") {
    for (const json& child : node.at("normalizers"))
      TANDEM_RETURN_IF_ERROR(ParseNormalizer(child, ops));
    return Status::Ok();
  }
  NormalizerOp op;
  op.kind = NormalizerOp::Kind::kForm;
  if (type == "NFC") {
    op.form = unicode::NormalForm::kNfc;
  } else if (type == "NFD") {
    op.form = unicode::NormalForm::kNfd;
  } else if (type == "NFKC") {
    op.form = unicode::NormalForm::kNfkc;
  } else if (type == "NFKD") {
    op.form = unicode::NormalForm::kNfkd;
  } else if (type == "Prepend") {
    op.kind = NormalizerOp::Kind::kPrepend;
    op.a = node.at("prepend").get<std::string>();
  } else if (type == "Replace") {
    op.kind = NormalizerOp::Kind::kReplace;
    const json& pattern = node.at("pattern");
    if (!pattern.contains("String")) {
      return InvalidArgument("normalizer Replace with a regex pattern is not supported");
    }
    op.a = pattern.at("String").get<std::string>();
    op.b = node.at("content").get<std::string>();
  } else {
    return InvalidArgument("normalizer type '" + type + "' is not supported");
  }
  ops->push_back(std::move(op));
  return Status::Ok();
}

// A SplitDelimiterBehavior field ("behavior"), `fallback` when absent.
StatusOr<SplitBehavior> BehaviorField(const json& node, const std::string& type,
                                      SplitBehavior fallback) {
  if (!node.contains("behavior")) return fallback;
  const std::string name = node.at("behavior").get<std::string>();
  const auto behavior = ParseSplitBehavior(name);
  if (!behavior) {
    return InvalidArgument(type + ": unknown behavior '" + name +
                           "' (Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous)");
  }
  return *behavior;
}

Status ParsePreTokenizer(const json& node, std::vector<PreTokenizerOp>* ops) {
  if (node.is_null()) return Status::Ok();
  const std::string type = node.value("type", "");
  if (type == "Sequence") {
    const json& children = node.at("pretokenizers");
    for (size_t i = 0; i < children.size(); ++i) {
      const Status s = ParsePreTokenizer(children[i], ops);
      if (!s.ok()) return s.WithContext("pretokenizers[" + std::to_string(i) + "]");
    }
    return Status::Ok();
  }
  if (type == "ByteLevel") {
    ops->push_back(PreTokenizerOp::ByteLevel(node.value("add_prefix_space", true),
                                             node.value("use_regex", true)));
    return Status::Ok();
  }
  if (type == "Split") {
    if (!node.contains("pattern") || !node.at("pattern").is_object()) {
      return InvalidArgument("Split: pattern must be {\"String\": ...} or {\"Regex\": ...}");
    }
    const json& pattern = node.at("pattern");
    StatusOr<SplitRegex> regex = InvalidArgument("Split: pattern must be String or Regex");
    if (pattern.contains("Regex")) {
      regex = SplitRegex::Compile(pattern.at("Regex").get<std::string>());
      if (!regex.ok()) return regex.status().WithContext("Split");
    } else if (pattern.contains("String")) {
      regex = SplitRegex::Literal(pattern.at("String").get<std::string>());
    } else {
      return regex.status();
    }
    if (!node.contains("behavior")) return InvalidArgument("Split: behavior is missing");
    TANDEM_ASSIGN_OR_RETURN(const SplitBehavior behavior,
                            BehaviorField(node, type, SplitBehavior::kIsolated));
    ops->push_back(PreTokenizerOp::Split(std::move(regex).value(), behavior,
                                         node.value("invert", false)));
    return Status::Ok();
  }
  if (type == "Digits") {
    ops->push_back(PreTokenizerOp::Digits(node.value("individual_digits", false)));
    return Status::Ok();
  }
  if (type == "Punctuation") {
    TANDEM_ASSIGN_OR_RETURN(const SplitBehavior behavior,
                            BehaviorField(node, type, SplitBehavior::kIsolated));
    ops->push_back(PreTokenizerOp::Punctuation(behavior));
    return Status::Ok();
  }
  if (type == "Whitespace") {
    ops->push_back(PreTokenizerOp::Whitespace());
    return Status::Ok();
  }
  if (type == "WhitespaceSplit") {
    ops->push_back(PreTokenizerOp::WhitespaceSplit());
    return Status::Ok();
  }
  if (type == "Metaspace") {
    const std::string replacement = node.value("replacement", "\u2581");
    if (unicode::Decode(replacement).size() != 1 || !unicode::IsValidUtf8(replacement)) {
      return InvalidArgument("Metaspace: replacement '" + replacement +
                             "' is not exactly one character");
    }
    // tokenizers 0.19: prepend_scheme "always" unless given; the older add_prefix_space=false
    // means "never".
    auto scheme = PreTokenizerOp::PrependScheme::kAlways;
    if (node.contains("prepend_scheme") && !node.at("prepend_scheme").is_null()) {
      const std::string name = node.at("prepend_scheme").get<std::string>();
      if (name == "always") {
        scheme = PreTokenizerOp::PrependScheme::kAlways;
      } else if (name == "first") {
        scheme = PreTokenizerOp::PrependScheme::kFirst;
      } else if (name == "never") {
        scheme = PreTokenizerOp::PrependScheme::kNever;
      } else {
        return InvalidArgument("Metaspace: unknown prepend_scheme '" + name +
                               "' (always, first, never)");
      }
      if (node.contains("add_prefix_space") && node.at("add_prefix_space").is_boolean() &&
          !node.at("add_prefix_space").get<bool>() &&
          scheme != PreTokenizerOp::PrependScheme::kNever) {
        return InvalidArgument("Metaspace: add_prefix_space false contradicts prepend_scheme '" +
                               name + "'");
      }
    } else if (node.contains("add_prefix_space") && node.at("add_prefix_space").is_boolean() &&
               !node.at("add_prefix_space").get<bool>()) {
      scheme = PreTokenizerOp::PrependScheme::kNever;
    }
    ops->push_back(PreTokenizerOp::Metaspace(replacement, scheme, node.value("split", true)));
    return Status::Ok();
  }
  return InvalidArgument(
      "type '" + type +
      "' is not supported (supported: ByteLevel, Split, Digits, Punctuation, Whitespace, "
      "WhitespaceSplit, Metaspace, Sequence)");
}

Status ParseDecoder(const json& node, DecoderSpec* spec) {
  if (node.is_null()) {
    spec->kind = DecoderSpec::Kind::kNone;
    return Status::Ok();
  }
  std::vector<json> chain;
  if (node.value("type", "") == "Sequence") {
    for (const json& child : node.at("decoders")) chain.push_back(child);
  } else {
    chain.push_back(node);
  }
  if (chain.size() == 1 && chain[0].value("type", "") == "ByteLevel") {
    spec->kind = DecoderSpec::Kind::kByteLevel;
    return Status::Ok();
  }
  // SentencePiece chain: Replace* ByteFallback? Fuse? Strip?, in this order.
  spec->kind = DecoderSpec::Kind::kPieces;
  int stage = 0;
  for (const json& step : chain) {
    const std::string type = step.value("type", "");
    if (type == "Replace" && stage == 0) {
      const json& pattern = step.at("pattern");
      if (!pattern.contains("String"))
        return InvalidArgument("decoder Replace with a regex is not supported");
      spec->replacements.emplace_back(pattern.at("String").get<std::string>(),
                                      step.at("content").get<std::string>());
    } else if (type == "ByteFallback" && stage < 1) {
      spec->byte_fallback = true;
      stage = 1;
    } else if (type == "Fuse" && stage < 2) {
      spec->fuse = true;
      stage = 2;
    } else if (type == "Strip" && stage < 3) {
      spec->strip_content = step.at("content").get<std::string>();
      spec->strip_start = step.value("start", 0);
      if (step.value("stop", 0) != 0) {
        return InvalidArgument(
            "decoder Strip with stop > 0 cannot be streamed and is not supported");
      }
      stage = 3;
    } else {
      return InvalidArgument("decoder '" + type +
                             "' is not supported here (supported: ByteLevel, or "
                             "Replace/ByteFallback/Fuse/Strip in that order)");
    }
  }
  return Status::Ok();
}

Status ParsePostProcessor(const json& node, const json& root_added, TokenizerState* state) {
  (void)root_added;
  if (node.is_null()) return Status::Ok();
  const std::string type = node.value("type", "");
  if (type == "Sequence") {
    for (const json& child : node.at("processors")) {
      TANDEM_RETURN_IF_ERROR(ParsePostProcessor(child, root_added, state));
    }
    return Status::Ok();
  }
  if (type == "ByteLevel") return Status::Ok();  // only touches offsets
  if (type == "TemplateProcessing") {
    const json& specials = node.at("special_tokens");
    bool seen_sequence = false;
    for (const json& item : node.at("single")) {
      if (item.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      const std::string name = item.at("SpecialToken").at("id").get<std::string>();
      if (!specials.contains(name)) {
        return InvalidArgument("post_processor: special token '" + name + "' has no ids");
      }
      for (const json& id : specials.at(name).at("ids")) {
        (seen_sequence ? state->suffix_ids : state->prefix_ids).push_back(id.get<int32_t>());
      }
    }
    return Status::Ok();
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    state->prefix_ids.push_back(node.at("cls").at(1).get<int32_t>());
    state->suffix_ids.push_back(node.at("sep").at(1).get<int32_t>());
    return Status::Ok();
  }
  return InvalidArgument("post_processor type '" + type + "' is not supported");
}

Status ParseModel(const json& model, TokenizerState* state) {
  const std::string type = model.value("type", "BPE");
  if (type != "BPE")
    return InvalidArgument("model type '" + type + "' is not supported (only BPE)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model.at(key).is_null() &&
        !model.at(key).get<std::string>().empty()) {
      return InvalidArgument(std::string("model.") + key + " is not supported");
    }
  }
  if (model.contains("dropout") && !model.at("dropout").is_null() &&
      model.at("dropout").get<double>() != 0.0) {
    return InvalidArgument("model.dropout is not supported");
  }
  if (!model.contains("vocab") || !model.at("vocab").is_object()) {
    return InvalidArgument("model.vocab is missing or not an object");
  }
  std::unordered_map<std::string, int32_t> vocab;
  for (const auto& [token, id] : model.at("vocab").items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > (1 << 30)) {
      return InvalidArgument("model.vocab['" + token + "'] is not a valid id");
    }
    vocab.emplace(token, id.get<int32_t>());
  }
  std::vector<std::pair<std::string, std::string>> merges;
  const json& merge_list = model.contains("merges") ? model.at("merges") : json::array();
  if (!merge_list.is_array()) return InvalidArgument("model.merges is not an array");
  merges.reserve(merge_list.size());
  for (size_t i = 0; i < merge_list.size(); ++i) {
    const json& m = merge_list[i];
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return InvalidArgument("model.merges[" + std::to_string(i) + "] '" + s +
                               "' is not two tokens separated by one space");
      }
      merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return InvalidArgument("model.merges[" + std::to_string(i) +
                             "] is neither \"a b\" nor [a, b]");
    }
  }
  BpeOptions options;
  options.byte_fallback = model.value("byte_fallback", false);
  options.ignore_merges = model.value("ignore_merges", false);
  options.fuse_unk = model.value("fuse_unk", false);
  if (model.contains("unk_token") && model.at("unk_token").is_string()) {
    const auto it = vocab.find(model.at("unk_token").get<std::string>());
    if (it == vocab.end()) return InvalidArgument("model.unk_token is not in the vocabulary");
    options.unk_id = it->second;
  }
  auto created = BpeModel::Create(std::move(vocab), merges, options);
  if (!created.ok()) return created.status().WithContext("model");
  state->model = std::move(created).value();
  return Status::Ok();
}

// The model's vocabulary and the added tokens: id -> token, which ids exist, and the added
// tokens' matching indexes (normalized content for normalized tokens, as tokenizers does).
StatusOr<std::vector<uint8_t>> BuildVocabulary(const json& root, TokenizerState* state) {
  int32_t size = 0;
  for (const auto& [token, id] : state->model.vocab()) size = std::max(size, id + 1);
  const json& added = root.contains("added_tokens") ? root.at("added_tokens") : json::array();
  if (!added.is_array()) return InvalidArgument("added_tokens is not an array");
  for (size_t i = 0; i < added.size(); ++i) {
    const json& t = added[i];
    if (!t.is_object() || !t.contains("id") || !t.contains("content") ||
        !t.at("id").is_number_integer() || !t.at("content").is_string()) {
      return InvalidArgument("added_tokens[" + std::to_string(i) +
                             "] needs an integer id and a string content");
    }
    AddedToken token;
    token.id = t.at("id").get<int32_t>();
    if (token.id < 0)
      return InvalidArgument("added_tokens[" + std::to_string(i) + "] has a negative id");
    token.content = t.at("content").get<std::string>();
    if (token.content.empty())
      return InvalidArgument("added_tokens[" + std::to_string(i) + "] is empty");
    token.special = t.value("special", false);
    token.lstrip = t.value("lstrip", false);
    token.rstrip = t.value("rstrip", false);
    token.single_word = t.value("single_word", false);
    token.normalized = t.value("normalized", !token.special);
    size = std::max(size, token.id + 1);
    state->added.push_back(std::move(token));
  }
  state->id_to_token.assign(size, "");
  std::vector<uint8_t> present(size, 0);
  state->is_special.assign(size, 0);
  for (const auto& [token, id] : state->model.vocab()) {
    state->id_to_token[id] = token;
    present[id] = 1;
  }
  for (const AddedToken& token : state->added) {
    state->id_to_token[token.id] = token.content;
    present[token.id] = 1;
    state->is_special[token.id] = token.special ? 1 : 0;
    state->added_by_content[token.content] = token.id;
  }
  for (size_t k = 0; k < state->added.size(); ++k) {
    AddedToken& token = state->added[k];
    if (token.normalized) token.content = state->Normalize(token.content);
    if (token.content.empty()) continue;
    auto& index = token.normalized ? state->normalized_index : state->raw_index;
    index[static_cast<uint8_t>(token.content[0])].push_back(static_cast<int>(k));
  }
  for (auto* index : {&state->raw_index, &state->normalized_index}) {
    for (auto& list : *index) {
      std::stable_sort(list.begin(), list.end(), [&](int a, int b) {
        return state->added[a].content.size() > state->added[b].content.size();
      });
    }
  }
  return present;
}

// What each id contributes to decoded text.
void BuildDecoded(const std::vector<uint8_t>& present, TokenizerState* state) {
  const int32_t size = static_cast<int32_t>(state->id_to_token.size());
  state->decoded.assign(size, "");
  state->byte_of.assign(size, -1);
  for (int32_t id = 0; id < size; ++id) {
    if (!present[id]) continue;
    const std::string& token = state->id_to_token[id];
    if (state->decoder.kind == DecoderSpec::Kind::kByteLevel) {
      std::string bytes;
      bool all_mapped = true;
      for (const auto& cp : unicode::Decode(token)) {
        const auto byte = ByteLevelByte(cp.value);
        if (!byte) {
          all_mapped = false;
          break;
        }
        bytes.push_back(static_cast<char>(*byte));
      }
      state->decoded[id] = all_mapped ? bytes : token;
    } else {
      std::string text = token;
      for (const auto& [from, to] : state->decoder.replacements) text = ReplaceAll(text, from, to);
      if (state->decoder.byte_fallback)
        state->byte_of[id] = static_cast<int16_t>(ByteTokenValue(text));
      state->decoded[id] = std::move(text);
    }
  }
}

// tokenizer_config.json: BOS / EOS (which must be in the vocabulary) and the chat template.
Status ReadConfig(const json* config, TokenizerState* state) {
  if (config != nullptr) {
    if (!config->is_object()) return InvalidArgument("tokenizer_config.json is not a JSON object");
    state->bos_token = TokenField(*config, "bos_token");
    state->eos_token = TokenField(*config, "eos_token");
    state->pad_token = TokenField(*config, "pad_token");
    if (config->contains("chat_template")) {
      const json& tmpl = config->at("chat_template");
      if (tmpl.is_string()) {
        state->chat_template = tmpl.get<std::string>();
      } else if (tmpl.is_array()) {  // [{"name": ..., "template": ...}]: use "default"
        for (const json& entry : tmpl) {
          if (entry.value("name", "") == "default")
            state->chat_template = entry.value("template", "");
        }
      }
    }
  }
  auto lookup = [&](const std::string& token,
                    const char* what) -> StatusOr<std::optional<int32_t>> {
    if (token.empty()) return std::optional<int32_t>();
    const auto it = state->added_by_content.find(token);
    if (it != state->added_by_content.end()) return std::optional<int32_t>(it->second);
    const auto v = state->model.vocab().find(token);
    if (v != state->model.vocab().end()) return std::optional<int32_t>(v->second);
    return InvalidArgument(std::string("tokenizer_config.json ") + what + " '" + token +
                           "' is not in the vocabulary");
  };
  TANDEM_ASSIGN_OR_RETURN(state->bos_id, lookup(state->bos_token, "bos_token"));
  TANDEM_ASSIGN_OR_RETURN(state->eos_id, lookup(state->eos_token, "eos_token"));
  TANDEM_ASSIGN_OR_RETURN(state->pad_id, lookup(state->pad_token, "pad_token"));
  return Status::Ok();
}

Status Build(const json& root, const json* config, TokenizerState* state) {
  if (!root.is_object()) return InvalidArgument("top level is not a JSON object");
  if (!root.contains("model")) return InvalidArgument("no \"model\" section");
  TANDEM_RETURN_IF_ERROR(ParseModel(root.at("model"), state));
  if (root.contains("normalizer")) {
    auto s = ParseNormalizer(root.at("normalizer"), &state->normalizers);
    if (!s.ok()) return s.WithContext("normalizer");
  }
  if (root.contains("pre_tokenizer")) {
    auto s = ParsePreTokenizer(root.at("pre_tokenizer"), &state->pre_tokenizers);
    if (!s.ok()) return s.WithContext("pre_tokenizer");
  }
  if (root.contains("decoder")) {
    auto s = ParseDecoder(root.at("decoder"), &state->decoder);
    if (!s.ok()) return s.WithContext("decoder");
  }
  if (root.contains("post_processor")) {
    auto s = ParsePostProcessor(root.at("post_processor"), json(), state);
    if (!s.ok()) return s.WithContext("post_processor");
  }
  // A byte-level vocabulary may lack some byte characters (SmolLM2 lacks 21): as in tokenizers,
  // such a byte becomes the unknown token, or is dropped when there is none.
  TANDEM_ASSIGN_OR_RETURN(std::vector<uint8_t> present, BuildVocabulary(root, state));
  const int32_t size = static_cast<int32_t>(state->id_to_token.size());
  for (int32_t id : state->prefix_ids) {
    if (id < 0 || id >= size)
      return InvalidArgument("post_processor uses unknown id " + std::to_string(id));
  }
  for (int32_t id : state->suffix_ids) {
    if (id < 0 || id >= size)
      return InvalidArgument("post_processor uses unknown id " + std::to_string(id));
  }
  BuildDecoded(present, state);
  return ReadConfig(config, state);
}

}  // namespace

StatusOr<Tokenizer> Tokenizer::FromJson(std::string_view tokenizer_json,
                                        std::string_view tokenizer_config_json,
                                        std::string_view source) {
  const std::string where(source);
  auto state = std::make_shared<TokenizerState>();
  try {
    const json root = json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
    if (root.is_discarded()) return InvalidArgument(where + ": tokenizer.json is not valid JSON");
    json config;
    const bool has_config = !tokenizer_config_json.empty();
    if (has_config) {
      config = json::parse(tokenizer_config_json, nullptr, false);
      if (config.is_discarded()) {
        return InvalidArgument(where + ": tokenizer_config.json is not valid JSON");
      }
    }
    const Status status = Build(root, has_config ? &config : nullptr, state.get());
    if (!status.ok()) return status.WithContext(where);
  } catch (const json::exception& e) {
    return InvalidArgument(where + ": unexpected JSON structure: " + e.what());
  }
  return Tokenizer(std::move(state));
}

StatusOr<Tokenizer> Tokenizer::Load(const std::string& model_dir) {
  const std::string path = model_dir + "/tokenizer.json";
  TANDEM_ASSIGN_OR_RETURN(std::string tokenizer_json, ReadFile(path));
  std::string config_json;
  const std::string config_path = model_dir + "/tokenizer_config.json";
  auto config = ReadFile(config_path);
  if (config.ok()) {
    config_json = std::move(config).value();
  } else if (config.status().code() != StatusCode::kNotFound) {
    return config.status();
  }
  return FromJson(tokenizer_json, config_json, path);
}

}  // namespace tandem
