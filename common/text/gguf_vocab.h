// The tokenizer a GGUF checkpoint carries in its metadata (the `tokenizer.ggml.*` keys and
// `tokenizer.chat_template`), as plain values, and the Tokenizer built from it.
//
// The GGUF reader (common/model/gguf.h) fills a GgufVocab from the file; TokenizerFromGguf turns
// it into a Tokenizer that encodes and decodes as Hugging Face `tokenizers` does for the same
// model's tokenizer.json. This header is the seam between the two: text does not read GGUF files
// and model does not know tokenizer internals.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"
#include "common/text/tokenizer.h"

namespace tandem {

// llama.cpp's token types (tokenizer.ggml.token_type).
enum class GgufTokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

struct GgufVocab {
  std::string model;  // tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SentencePiece)
  std::string pre;    // tokenizer.ggml.pre: "smollm", "llama-bpe", "qwen2", "gpt2", "default", ...
  std::vector<std::string> tokens;      // tokenizer.ggml.tokens, indexed by id
  std::vector<GgufTokenType> token_types;  // tokenizer.ggml.token_type (empty: all normal)
  std::vector<float> scores;            // tokenizer.ggml.scores (SentencePiece; may be empty)
  std::vector<std::string> merges;      // tokenizer.ggml.merges, "a b" per merge
  std::optional<int32_t> bos_id;        // tokenizer.ggml.bos_token_id
  std::optional<int32_t> eos_id;        // tokenizer.ggml.eos_token_id
  std::optional<int32_t> unk_id;        // tokenizer.ggml.unknown_token_id
  std::optional<int32_t> pad_id;        // tokenizer.ggml.padding_token_id
  std::optional<bool> add_bos;          // tokenizer.ggml.add_bos_token
  std::optional<bool> add_eos;          // tokenizer.ggml.add_eos_token
  std::string chat_template;            // tokenizer.chat_template ("" when absent)
};

// A Tokenizer equivalent to the Hugging Face tokenizer of the model the GGUF file was converted
// from. `source` (the file's path) prefixes every error: an unknown `model` or `pre`, a token id
// out of range, a merge naming a token not in the vocabulary.
StatusOr<Tokenizer> TokenizerFromGguf(const GgufVocab& vocab, std::string_view source);

}  // namespace tandem
