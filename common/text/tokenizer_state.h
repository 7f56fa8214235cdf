// The state behind a Tokenizer (common/text/tokenizer.h), shared by its two halves: the
// tokenizer.json / tokenizer_config.json reader that builds it (tokenizer_json.cc) and the
// encoder / decoder that use it (tokenizer.cc). Internal to common/text.
//
// Immutable once built, except the word cache, which cache_mu guards.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/base/thread_annotations.h"
#include "common/text/bpe.h"
#include "common/text/pretokenizer.h"
#include "common/text/unicode.h"

namespace tandem {
namespace tokenizer_internal {

struct AddedToken {
  int32_t id = 0;
  std::string content;  // for normalized tokens: the normalized content
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

struct NormalizerOp {
  enum class Kind { kForm, kPrepend, kReplace } kind = Kind::kForm;
  unicode::NormalForm form = unicode::NormalForm::kNfc;
  std::string a;  // prepend text, or replace pattern
  std::string b;  // replace content
};


struct DecoderSpec {
  enum class Kind { kNone, kByteLevel, kPieces } kind = Kind::kNone;
  std::vector<std::pair<std::string, std::string>> replacements;
  bool byte_fallback = false;
  bool fuse = false;
  std::string strip_content;  // empty: no Strip decoder
  int strip_start = 0;
};

// `text` with every `from` replaced by `to`.
std::string ReplaceAll(std::string_view text, std::string_view from, std::string_view to);

}  // namespace tokenizer_internal

struct TokenizerState {
  BpeModel model;
  std::vector<std::string> id_to_token;
  std::vector<uint8_t> is_special;
  std::vector<tokenizer_internal::AddedToken> added;
  std::unordered_map<std::string, int32_t> added_by_content;
  // Added tokens by first byte of their content, longest first, for each matching pass.
  std::vector<std::vector<int>> raw_index = std::vector<std::vector<int>>(256);
  std::vector<std::vector<int>> normalized_index = std::vector<std::vector<int>>(256);
  std::vector<tokenizer_internal::NormalizerOp> normalizers;
  std::vector<PreTokenizerOp> pre_tokenizers;
  tokenizer_internal::DecoderSpec decoder;
  std::vector<std::string> decoded;  // per id: bytes (byte-level) or replaced text (pieces)
  std::vector<int16_t> byte_of;      // per id: <0xNN> byte value for ByteFallback, or -1
  std::vector<int32_t> prefix_ids;
  std::vector<int32_t> suffix_ids;
  std::optional<int32_t> bos_id;
  std::optional<int32_t> eos_id;
  std::optional<int32_t> pad_id;
  std::string bos_token;
  std::string eos_token;
  std::string pad_token;
  std::string chat_template;

  // Encoded words, shared by the threads that encode with this tokenizer.
  mutable Mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache TANDEM_GUARDED_BY(cache_mu);

  std::string Normalize(std::string_view text) const;
  void SplitAdded(std::string_view text, bool normalized_pass,
                  const std::function<void(std::string_view, int32_t)>& emit) const;
  // Pre-tokenizes and encodes text between added tokens; `at_start`: it begins the input.
  void EncodePiece(std::string_view piece, bool at_start, std::vector<int32_t>* ids) const;
  void EncodeWord(const std::string& word, std::vector<int32_t>* ids) const;
};

}  // namespace tandem
