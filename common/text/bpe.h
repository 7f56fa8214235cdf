// The BPE model of a Hugging Face tokenizer: vocabulary, merge ranks, and the merge loop that
// turns one pre-tokenized word into ids. Immutable after construction, so it may be shared by
// threads; the word cache lives in Tokenizer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/base/status.h"

namespace tandem {

// The 256-entry GPT-2 byte-to-unicode table: printable bytes map to themselves, the rest to
// U+0100 and up. ByteLevelChar(b) is the UTF-8 text of byte b's character.
const std::string& ByteLevelChar(uint8_t byte);
// Inverse: the byte for a character of the table, or nullopt.
std::optional<uint8_t> ByteLevelByte(uint32_t code_point);
// Maps every byte of `bytes` to its character (the ByteLevel pre-tokenizer's output).
std::string ByteLevelEncode(std::string_view bytes);

struct BpeOptions {
  // Unknown characters become <0xNN> tokens (SentencePiece style); a character with a byte that
  // has no such token becomes unk instead.
  bool byte_fallback = false;
  bool ignore_merges = false;  // a word that is itself in the vocabulary is one token (Llama 3)
  bool fuse_unk = false;
  std::optional<int32_t> unk_id;
};

class BpeModel {
 public:
  // `merges` are (left, right) token strings in rank order. Errors name the offending entry.
  static StatusOr<BpeModel> Create(std::unordered_map<std::string, int32_t> vocab,
                                   const std::vector<std::pair<std::string, std::string>>& merges,
                                   BpeOptions options);

  // Appends the ids of one word (already byte-mapped for byte-level tokenizers) to *ids.
  void EncodeWord(std::string_view word, std::vector<int32_t>* ids) const;

  const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }
  const BpeOptions& options() const { return options_; }

 private:
  struct MergeTarget {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<uint64_t, MergeTarget> merges_;
  std::vector<int32_t> byte_tokens_;  // <0xNN> ids (-1: absent) when byte_fallback, else empty
  BpeOptions options_;
};

}  // namespace tandem
