// The pre-tokenizers of Hugging Face `tokenizers` that LLM checkpoints use, with the same pieces as
// tokenizers 0.19 for every input:
//   ByteLevel(add_prefix_space, use_regex), Split(String or Regex pattern, behavior, invert),
//   Digits(individual_digits), Punctuation(behavior), Whitespace, WhitespaceSplit,
//   Metaspace(replacement, prepend_scheme, split); Sequence is a list of these.
//
// Split regexes run on ICU's regex engine with flags that give Oniguruma's (Ruby syntax) meaning to
// the constructs checkpoints use (\p{L}, \p{N}, \s, (?i:...), lookahead, ^/$ at line ends). The
// three patterns nearly every byte-level checkpoint uses (GPT-2, Llama 3, Qwen2) have hand-coded
// matchers instead, several times faster than a regex engine, with identical matches.
//
// Everything here is immutable after construction and may be shared by threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/base/status.h"

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

// Recognises one of the hand-coded patterns; nullopt for any other regex.
std::optional<SplitPattern> RecognizeSplitRegex(std::string_view regex);
const char* SplitRegexText(SplitPattern pattern);

// Splits `text` into the pieces the pattern matches, plus any unmatched gaps between matches
// (HF's "Isolated" behaviour). Returns [begin, end) byte ranges covering all of `text`, in order.
std::vector<std::pair<size_t, size_t>> SplitText(std::string_view text, SplitPattern pattern);

// One stretch of a text as HF's Pattern::find_matches reports it: a match of the pattern, or the
// text between two matches. Byte offsets; the stretches cover the text in order. Empty matches
// are possible (a regex that matches ""), empty gaps are not reported.
struct MatchSegment {
  size_t begin;
  size_t end;
  bool is_match;
};

// HF's SplitDelimiterBehavior: what happens to the matches when a text is split.
enum class SplitBehavior {
  kRemoved,             // matches are dropped
  kIsolated,            // matches are pieces of their own
  kMergedWithPrevious,  // a match joins the gap before it
  kMergedWithNext,      // a match joins the gap after it
  kContiguous,          // adjacent matches form one piece
};
// "Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous" (tokenizer.json).
std::optional<SplitBehavior> ParseSplitBehavior(std::string_view name);

// HF's NormalizedString::split: the [begin, end) byte ranges of the pieces, empty ones dropped.
std::vector<std::pair<size_t, size_t>> ApplySplitBehavior(const std::vector<MatchSegment>& segments,
                                                          SplitBehavior behavior);

// The pattern of a Split pre-tokenizer: a literal string or a regex.
class SplitRegex {
 public:
  // A literal pattern (tokenizer.json {"String": ...}); "" matches the empty string everywhere.
  static SplitRegex Literal(std::string text);
  // A regex ({"Regex": ...}); InvalidArgument naming the pattern and ICU's error when it does not
  // compile.
  static StatusOr<SplitRegex> Compile(std::string_view regex);

  // HF's find_matches: leftmost non-overlapping matches and the gaps between them. After an
  // empty match the search resumes one character further (as the onig crate does). Invalid UTF-8
  // bytes are seen by regexes as U+FFFD.
  std::vector<MatchSegment> FindMatches(std::string_view text) const;

  // True when a hand-coded matcher runs instead of ICU (for tests and benchmarks).
  bool hand_coded() const { return known_.has_value(); }

 private:
  struct Icu;  // the compiled ICU pattern (pretokenizer.cc)
  std::optional<SplitPattern> known_;
  std::shared_ptr<const Icu> icu_;
  std::optional<std::string> literal_;
};

// One pre-tokenizer step. Build with the factory functions; Apply runs it.
struct PreTokenizerOp {
  enum class Kind {
    kByteLevel,
    kSplit,
    kDigits,
    kPunctuation,
    kWhitespace,
    kWhitespaceSplit,
    kMetaspace,
  };
  enum class PrependScheme { kAlways, kFirst, kNever };

  Kind kind = Kind::kByteLevel;
  // kByteLevel
  bool add_prefix_space = false;
  bool use_regex = true;
  // kSplit (regex and invert), kPunctuation (behavior)
  std::shared_ptr<const SplitRegex> regex;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  // kDigits
  bool individual_digits = false;
  // kMetaspace
  std::string replacement;  // one character, UTF-8
  PrependScheme prepend_scheme = PrependScheme::kAlways;
  bool split = true;

  static PreTokenizerOp ByteLevel(bool add_prefix_space, bool use_regex);
  static PreTokenizerOp Split(SplitRegex regex, SplitBehavior behavior, bool invert);
  static PreTokenizerOp Digits(bool individual_digits);
  static PreTokenizerOp Punctuation(SplitBehavior behavior);
  static PreTokenizerOp Whitespace();
  static PreTokenizerOp WhitespaceSplit();
  static PreTokenizerOp Metaspace(std::string replacement, PrependScheme scheme, bool split);
};

// A piece of text between pre-tokenizer steps. `at_start`: the piece begins at offset 0 of the
// whole input (what Metaspace's prepend_scheme "first" asks).
struct PreTokenizedWord {
  std::string text;
  bool at_start = false;
};

// Runs `op` on every word of `words` and appends the resulting non-empty words to *out. ByteLevel
// maps the bytes of its output to GPT-2's byte characters, so later steps see mapped text, as in
// tokenizers.
void ApplyPreTokenizer(const PreTokenizerOp& op, std::vector<PreTokenizedWord>* words,
                       std::vector<PreTokenizedWord>* out);

}  // namespace tandem
