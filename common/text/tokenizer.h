// Tokenizer: loads a Hugging Face `tokenizer.json` (+ optional `tokenizer_config.json`) and
// encodes / decodes exactly as the `tokenizers` library does for the configurations LLM
// checkpoints use:
//   - byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM2): normalizer NFC or none; ByteLevel
//     decoder; a vocabulary may lack some byte symbols (such a byte becomes the unknown token);
//   - SentencePiece-style BPE (Llama 2, Mistral): normalizer Prepend("▁") + Replace(" ", "▁"),
//     byte_fallback <0xNN> tokens (a character whose byte tokens are missing becomes unk),
//     decoder Replace / ByteFallback / Fuse / Strip;
//   - pre-tokenizers ByteLevel, Split (String or Regex, every behavior, invert), Digits,
//     Punctuation, Whitespace, WhitespaceSplit, Metaspace and Sequences of them
//     (common/text/pretokenizer.h).
// Added tokens are matched before anything else (leftmost, longest; lstrip / rstrip /
// single_word / normalized honoured). Any other component is rejected by Load with an error that
// names the file and the component, never accepted and then silently mis-encoded.
//
// A Tokenizer is immutable after Load except for an internal word cache guarded by a mutex, so
// one instance may be shared by threads. Copies share the same state.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"

namespace tandem {

struct TokenizerState;  // common/text/tokenizer_state.h

class Tokenizer {
 public:
  // Reads `model_dir`/tokenizer.json and, when present, `model_dir`/tokenizer_config.json.
  static StatusOr<Tokenizer> Load(const std::string& model_dir);
  // Same from the files' contents; `source` names them in error messages. An empty
  // tokenizer_config_json means there is none.
  static StatusOr<Tokenizer> FromJson(std::string_view tokenizer_json,
                                      std::string_view tokenizer_config_json,
                                      std::string_view source);

  // Token ids of `text`. With add_special_tokens the post-processor's template applies (e.g.
  // Llama 3 prepends <|begin_of_text|>). Special tokens written in `text` are always matched, as
  // in tokenizers. Never fails: bytes that are not valid UTF-8 are encoded byte-level.
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const;

  // Text of `ids`; unknown ids are skipped, invalid UTF-8 becomes U+FFFD (Rust's lossy rules).
  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  std::optional<std::string> IdToToken(int32_t id) const;
  // One more than the largest id (model vocabulary and added tokens).
  int32_t vocab_size() const;
  // True for added tokens marked "special" (skipped by Decode with skip_special_tokens).
  bool IsSpecial(int32_t id) const;

  // From tokenizer_config.json (bos_token / eos_token); nullopt when not configured.
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  // From tokenizer_config.json pad_token (a GGUF file's tokenizer.ggml.padding_token_id).
  std::optional<int32_t> pad_id() const;
  const std::string& bos_token() const;  // "" when none
  const std::string& eos_token() const;
  // tokenizer_config.json "chat_template" ("" when absent).
  const std::string& chat_template() const;

 private:
  friend class IncrementalDecoder;
  explicit Tokenizer(std::shared_ptr<TokenizerState> state) : state_(std::move(state)) {}
  std::shared_ptr<TokenizerState> state_;
};

// Streaming detokenizer for one sequence: feed ids as they are generated, get text deltas. A
// delta never ends inside a UTF-8 sequence (incomplete bytes are held back until the next ids
// complete them) and the concatenation of all deltas plus Finish() equals
// tokenizer.Decode(all ids, skip_special_tokens). Not thread-safe; keeps a copy of the tokenizer.
class IncrementalDecoder {
 public:
  IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens);

  // Text that became final with this id (possibly empty).
  std::string Add(int32_t id);
  // Flushes anything held back (an incomplete sequence becomes U+FFFD). Call once at the end.
  std::string Finish();

 private:
  std::string Emit(std::string text);

  Tokenizer tokenizer_;
  bool skip_special_tokens_;
  std::string pending_bytes_;   // byte-level: bytes not yet forming complete characters
  std::string pending_run_;     // byte fallback: the current run of <0xNN> bytes
  int strip_left_;              // leading strip characters still to remove (Strip decoder)
  bool first_token_ = true;     // no decoder: tokens are joined with " "
};

}  // namespace tandem
