// BPE trainer for `tandem make-model`: builds a small, real byte-level BPE tokenizer of a given
// family from a corpus generated deterministically from a seed, and returns the contents of the
// Hugging Face files. The same (family, vocab_size, seed) always gives byte-identical files.
// Thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <string>

#include "common/base/status.h"

namespace tandem {

struct TokenizerFiles {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
};

enum class TokenizerFamily { kLlama3, kQwen2 };

// Trains a byte-level BPE tokenizer (vocab_size total ids including 256 byte tokens and the
// family's special tokens) on a corpus this function generates deterministically from `seed`
// (varied English-like words, code, digits, punctuation, some multi-byte UTF-8) and returns the
// HF files' contents. Llama3 family: Llama 3 pre-tokenizer regex, specials <|begin_of_text|>,
// <|end_of_text|>, <|start_header_id|>, <|end_header_id|>, <|eot_id|>, bos=<|begin_of_text|>,
// TemplateProcessing post-processor that prepends bos like Llama 3; Qwen2 family: Qwen2 regex,
// NFC normalizer, specials <|endoftext|>, <|im_start|>, <|im_end|>, no bos. tokenizer_config.json
// carries the family's real chat template, bos/eos/pad tokens, model_max_length, tokenizer_class
// "PreTrainedTokenizerFast".
// InvalidArgument when vocab_size leaves no room for merges (< 256 + specials + 1) or exceeds
// 65536.
StatusOr<TokenizerFiles> TrainTokenizer(TokenizerFamily family, int vocab_size, uint64_t seed);

}  // namespace tandem
