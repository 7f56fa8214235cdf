// Hand-coded matchers for the pre-tokenizer regexes byte-level BPE tokenizers use. They find the
// same pieces as Hugging Face `tokenizers` (Oniguruma, leftmost alternative, greedy with
// backtracking) for the three known patterns, without a regex engine. A Split pre-tokenizer with
// any other pattern is rejected when the tokenizer loads.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem {

enum class SplitPattern {
  kGpt2,    // GPT-2; also what ByteLevel(use_regex=true) uses
  kLlama3,  // Llama 3: case-insensitive contractions, digits in groups of up to 3
  kQwen2,   // Qwen2: as Llama 3 but single digits
};

// The exact regex text of each pattern as it appears in tokenizer.json (after JSON unescaping).
extern const char kGpt2SplitRegex[];
extern const char kLlama3SplitRegex[];
extern const char kQwen2SplitRegex[];

// Recognises a tokenizer.json Split regex; nullopt for a pattern we have no matcher for.
std::optional<SplitPattern> RecognizeSplitRegex(std::string_view regex);
const char* SplitRegexText(SplitPattern pattern);

// Splits `text` into the pieces the pattern matches, plus any unmatched gaps between matches
// (HF's "Isolated" behaviour). Returns [begin, end) byte ranges covering all of `text`, in order.
std::vector<std::pair<size_t, size_t>> SplitText(std::string_view text, SplitPattern pattern);

}  // namespace tandem
