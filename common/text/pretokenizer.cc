// The pre-tokenizers of common/text/pretokenizer.h.
#include "common/text/pretokenizer.h"

#include <unicode/regex.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <algorithm>

#include "common/text/bpe.h"
#include "common/text/unicode.h"

namespace tandem {

const char kGpt2SplitRegex[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char kLlama3SplitRegex[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char kQwen2SplitRegex[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::optional<SplitPattern> RecognizeSplitRegex(std::string_view regex) {
  if (regex == kGpt2SplitRegex) return SplitPattern::kGpt2;
  if (regex == kLlama3SplitRegex) return SplitPattern::kLlama3;
  if (regex == kQwen2SplitRegex) return SplitPattern::kQwen2;
  return std::nullopt;
}

const char* SplitRegexText(SplitPattern pattern) {
  switch (pattern) {
    case SplitPattern::kGpt2: return kGpt2SplitRegex;
    case SplitPattern::kLlama3: return kLlama3SplitRegex;
    case SplitPattern::kQwen2: return kQwen2SplitRegex;
  }
  return kGpt2SplitRegex;
}

namespace {

using unicode::CharClass;
using unicode::CodePoint;

class Matcher {
 public:
  Matcher(const std::vector<CodePoint>& cps, SplitPattern pattern)
      : cps_(cps), n_(cps.size()), pattern_(pattern) {}

  // Length in code points of the match starting at i, or 0 when no alternative matches.
  size_t MatchAt(size_t i) const {
    return pattern_ == SplitPattern::kGpt2 ? MatchGpt2(i) : MatchLlama3(i);
  }

 private:
  bool Is(size_t i, CharClass cls) const { return i < n_ && cps_[i].cls == cls; }
  bool IsChar(size_t i, uint32_t c) const { return i < n_ && cps_[i].value == c; }
  bool IsNewline(size_t i) const { return IsChar(i, '\r') || IsChar(i, '\n'); }
  size_t RunOf(size_t i, CharClass cls) const {
    size_t j = i;
    while (j < n_ && cps_[j].cls == cls) ++j;
    return j;
  }

  // 's|'t|'re|'ve|'m|'ll|'d, optionally ASCII case-insensitive (plus U+017F, which folds to s).
  size_t MatchContraction(size_t i, bool ignore_case) const {
    if (!IsChar(i, '\'') || i + 1 >= n_) return 0;
    auto lower = [&](size_t k) -> uint32_t {
      if (k >= n_) return 0;
      uint32_t c = cps_[k].value;
      if (!ignore_case) return c;
      if (c >= 'A' && c <= 'Z') return c + 32;
      if (c == 0x17F) return 's';
      return c;
    };
    const uint32_t a = lower(i + 1);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    const uint32_t b = lower(i + 2);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
  }

  // \s+(?!\S) then \s+: a whitespace run, leaving its last char when a non-space follows.
  size_t MatchWhitespaceTail(size_t i) const {
    if (!Is(i, CharClass::kWhitespace)) return 0;
    const size_t end = RunOf(i, CharClass::kWhitespace);
    if (end == n_) return end - i;
    if (end - i >= 2) return end - 1 - i;
    return 1;  // the plain \s+ alternative
  }

  size_t MatchGpt2(size_t i) const {
    if (size_t m = MatchContraction(i, false)) return m;
    const size_t start = IsChar(i, ' ') ? i + 1 : i;
    // ` ?X+` for the three classes; with the space consumed, X must follow it.
    for (CharClass cls : {CharClass::kLetter, CharClass::kNumber, CharClass::kOther}) {
      if (Is(start, cls)) return RunOf(start, cls) - i;
    }
    return MatchWhitespaceTail(i);
  }

  size_t MatchLlama3(size_t i) const {
    if (size_t m = MatchContraction(i, true)) return m;
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (Is(i, CharClass::kLetter)) return RunOf(i, CharClass::kLetter) - i;
    if (i < n_ && !IsNewline(i) && !Is(i, CharClass::kNumber) && Is(i + 1, CharClass::kLetter)) {
      return RunOf(i + 1, CharClass::kLetter) - i;
    }
    // \p{N}{1,3} (Llama 3) or \p{N} (Qwen2)
    if (Is(i, CharClass::kNumber)) {
      const size_t max_digits = pattern_ == SplitPattern::kLlama3 ? 3 : 1;
      size_t j = i;
      while (j < n_ && j - i < max_digits && cps_[j].cls == CharClass::kNumber) ++j;
      return j - i;
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    size_t start = i;
    if (IsChar(i, ' ') && Is(i + 1, CharClass::kOther)) start = i + 1;
    if (Is(start, CharClass::kOther)) {
      size_t j = RunOf(start, CharClass::kOther);
      while (IsNewline(j)) ++j;
      return j - i;
    }
    if (!Is(i, CharClass::kWhitespace)) return 0;
    // \s*[\r\n]+: up to and including the last newline of the whitespace run.
    const size_t end = RunOf(i, CharClass::kWhitespace);
    for (size_t k = end; k > i; --k) {
      if (IsNewline(k - 1)) return k - i;
    }
    return MatchWhitespaceTail(i);
  }

  const std::vector<CodePoint>& cps_;
  const size_t n_;
  const SplitPattern pattern_;
};

}  // namespace


namespace {

// Matches of a hand-coded pattern as HF's find_matches reports them.
std::vector<MatchSegment> FindKnownMatches(std::string_view text, SplitPattern pattern) {
  std::vector<MatchSegment> segments;
  if (text.empty()) return segments;
  const std::vector<CodePoint> cps = unicode::Decode(text);
  const Matcher matcher(cps, pattern);
  auto byte_at = [&](size_t cp_index) -> size_t {
    return cp_index < cps.size() ? cps[cp_index].offset : text.size();
  };
  size_t gap_start = 0;  // code point index where the current unmatched gap began
  size_t i = 0;
  while (i < cps.size()) {
    const size_t len = matcher.MatchAt(i);
    if (len == 0) {
      ++i;
      continue;
    }
    if (gap_start < i) segments.push_back({byte_at(gap_start), byte_at(i), false});
    segments.push_back({byte_at(i), byte_at(i + len), true});
    i += len;
    gap_start = i;
  }
  if (gap_start < cps.size()) segments.push_back({byte_at(gap_start), text.size(), false});
  return segments;
}

// HF's pattern for a `Fn(char) -> bool`: every matching character is a match of its own.
template <typename Predicate>
std::vector<MatchSegment> FindCharMatches(std::string_view text, Predicate matches) {
  std::vector<MatchSegment> segments;
  size_t gap_start = 0;
  for (const CodePoint& cp : unicode::Decode(text)) {
    if (!matches(cp.value)) continue;
    if (gap_start < cp.offset) segments.push_back({gap_start, cp.offset, false});
    segments.push_back({cp.offset, cp.offset + cp.length, true});
    gap_start = cp.offset + cp.length;
  }
  if (gap_start < text.size()) segments.push_back({gap_start, text.size(), false});
  return segments;
}

// The onig crate's find_iter over `find(start) -> (begin, end)`, in the units of `advance`: an
// empty match right where the previous match ended is skipped by moving one character on.
template <typename Find, typename Advance>
std::vector<MatchSegment> FindIter(size_t size, Find find, Advance advance) {
  std::vector<MatchSegment> segments;
  size_t prev = 0;
  size_t last_end = 0;
  std::optional<size_t> last_match_end;
  while (last_end <= size) {
    const std::optional<std::pair<size_t, size_t>> hit = find(last_end);
    if (!hit) break;
    const auto [begin, end] = *hit;
    if (begin == end && last_match_end == end) {
      last_end = last_end < size ? advance(last_end) : size + 1;
      continue;
    }
    last_end = end;
    last_match_end = end;
    if (prev != begin) segments.push_back({prev, begin, false});
    segments.push_back({begin, end, true});
    prev = end;
  }
  if (prev != size) segments.push_back({prev, size, false});
  return segments;
}

std::string ReplaceAllText(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  size_t pos = 0;
  for (size_t hit = text.find(from); hit != std::string_view::npos; hit = text.find(from, pos)) {
    out.append(text.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
  out.append(text.substr(pos));
  return out;
}

bool IsRustNumeric(uint32_t cp) { return unicode::Classify(cp) == CharClass::kNumber; }

bool IsWhiteSpaceProperty(uint32_t cp) {
  return cp < 0x110000 && u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_WHITE_SPACE);
}

// tokenizers' is_punc: ASCII punctuation (which includes $+<=>^`|~) or a P* general category.
bool IsPunctuation(uint32_t cp) {
  if (cp < 128) {
    return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) ||
           (cp >= 0x5B && cp <= 0x60) || (cp >= 0x7B && cp <= 0x7E);
  }
  if (cp >= 0x110000) return false;
  // tokenizers takes the categories from the unicode_categories crate, which has Unicode 8.0's
  // tables: later punctuation (U+0C77, U+2E43, ...) is not punctuation there.
  UVersionInfo age;
  u_charAge(static_cast<UChar32>(cp), age);
  if (age[0] > 8) return false;
  switch (u_charType(static_cast<UChar32>(cp))) {
    case U_CONNECTOR_PUNCTUATION:
    case U_DASH_PUNCTUATION:
    case U_START_PUNCTUATION:
    case U_END_PUNCTUATION:
    case U_INITIAL_PUNCTUATION:
    case U_FINAL_PUNCTUATION:
    case U_OTHER_PUNCTUATION:
      return true;
    default:
      return false;
  }
}

// \w of the Rust regex crate (UTS #18): Alphabetic, Mark, Decimal_Number, Connector_Punctuation,
// Join_Control. What the Whitespace pre-tokenizer's `\w+|[^\w\s]+` keeps together.
bool IsRegexWordChar(uint32_t cp) {
  if (cp < 128) {
    return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9') ||
           cp == '_';
  }
  if (cp >= 0x110000) return false;
  const auto c = static_cast<UChar32>(cp);
  if (cp == 0x200C || cp == 0x200D || u_hasBinaryProperty(c, UCHAR_ALPHABETIC)) return true;
  switch (u_charType(c)) {
    case U_NON_SPACING_MARK:
    case U_ENCLOSING_MARK:
    case U_COMBINING_SPACING_MARK:
    case U_DECIMAL_DIGIT_NUMBER:
    case U_CONNECTOR_PUNCTUATION:
      return true;
    default:
      return false;
  }
}

// The Whitespace pre-tokenizer: runs of word characters and runs of other non-space characters;
// whitespace separates them and is dropped.
void SplitWhitespace(const PreTokenizedWord& word, std::vector<PreTokenizedWord>* out) {
  enum { kSpace, kWord, kOther };
  int run_kind = kSpace;
  size_t run_start = 0;
  auto flush = [&](size_t end) {
    if (run_kind != kSpace && end > run_start) {
      out->push_back({word.text.substr(run_start, end - run_start),
                      word.at_start && run_start == 0});
    }
  };
  for (const CodePoint& cp : unicode::Decode(word.text)) {
    const int kind = IsRegexWordChar(cp.value)       ? kWord
                     : IsWhiteSpaceProperty(cp.value) ? kSpace
                                                      : kOther;
    if (kind == run_kind) continue;
    flush(cp.offset);
    run_kind = kind;
    run_start = cp.offset;
  }
  flush(word.text.size());
}

void AppendPieces(const PreTokenizedWord& word, const std::vector<MatchSegment>& segments,
                  SplitBehavior behavior, std::vector<PreTokenizedWord>* out) {
  for (const auto& [begin, end] : ApplySplitBehavior(segments, behavior)) {
    out->push_back({word.text.substr(begin, end - begin), word.at_start && begin == 0});
  }
}

}  // namespace

std::vector<std::pair<size_t, size_t>> SplitText(std::string_view text, SplitPattern pattern) {
  std::vector<std::pair<size_t, size_t>> pieces;
  for (const MatchSegment& s : FindKnownMatches(text, pattern)) pieces.emplace_back(s.begin, s.end);
  return pieces;
}

std::optional<SplitBehavior> ParseSplitBehavior(std::string_view name) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return std::nullopt;
}

std::vector<std::pair<size_t, size_t>> ApplySplitBehavior(const std::vector<MatchSegment>& segments,
                                                          SplitBehavior behavior) {
  // Transcribed from tokenizers' NormalizedString::split.
  std::vector<std::pair<size_t, size_t>> pieces;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const MatchSegment& s : segments) {
        if (!s.is_match) pieces.emplace_back(s.begin, s.end);
      }
      break;
    case SplitBehavior::kIsolated:
      for (const MatchSegment& s : segments) pieces.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::kContiguous:
      for (const MatchSegment& s : segments) {
        if (s.is_match == previous_match && !pieces.empty()) {
          pieces.back().second = s.end;
        } else {
          pieces.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const MatchSegment& s : segments) {
        if (s.is_match && !previous_match && !pieces.empty()) {
          pieces.back().second = s.end;
        } else {
          pieces.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (size_t k = segments.size(); k > 0; --k) {
        const MatchSegment& s = segments[k - 1];
        if (s.is_match && !previous_match && !pieces.empty()) {
          pieces.back().first = s.begin;
        } else {
          pieces.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      std::reverse(pieces.begin(), pieces.end());
      break;
  }
  std::erase_if(pieces, [](const auto& p) { return p.first == p.second; });
  return pieces;
}

// ---- SplitRegex ----------------------------------------------------------------------------------

struct SplitRegex::Icu {
  std::unique_ptr<icu::RegexPattern> pattern;
};

SplitRegex SplitRegex::Literal(std::string text) {
  SplitRegex regex;
  regex.literal_ = std::move(text);
  return regex;
}

StatusOr<SplitRegex> SplitRegex::Compile(std::string_view text) {
  SplitRegex regex;
  regex.known_ = RecognizeSplitRegex(text);
  if (regex.known_) return regex;
  UErrorCode status = U_ZERO_ERROR;
  UParseError parse_error{};
  const icu::UnicodeString pattern =
      icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  // Oniguruma's Ruby syntax: ^ and $ match at every line end, and only "\n" ends a line.
  auto icu = std::make_shared<Icu>();
  icu->pattern.reset(icu::RegexPattern::compile(pattern, UREGEX_MULTILINE | UREGEX_UNIX_LINES,
                                                parse_error, status));
  if (U_FAILURE(status) || icu->pattern == nullptr) {
    return InvalidArgument("regex '" + std::string(text) + "' does not compile: " +
                           u_errorName(status) + " at offset " +
                           std::to_string(parse_error.offset));
  }
  regex.icu_ = std::move(icu);
  return regex;
}

std::vector<MatchSegment> SplitRegex::FindMatches(std::string_view text) const {
  if (text.empty()) return {};
  if (known_) return FindKnownMatches(text, *known_);
  if (literal_) {
    const std::string& needle = *literal_;
    return FindIter(
        text.size(),
        [&](size_t start) -> std::optional<std::pair<size_t, size_t>> {
          const size_t hit = text.find(needle, start);
          if (hit == std::string_view::npos) return std::nullopt;
          return std::pair{hit, hit + needle.size()};
        },
        [&](size_t pos) {
          bool truncated;
          const size_t len = unicode::ValidSequenceLength(text, pos, &truncated);
          return pos + (len == 0 ? 1 : len);
        });
  }
  // ICU searches UTF-16: convert, keeping the byte offset of every UTF-16 unit.
  const std::vector<CodePoint> cps = unicode::Decode(text);
  icu::UnicodeString input;
  std::vector<size_t> byte_of_unit;
  byte_of_unit.reserve(text.size() + 1);
  for (const CodePoint& cp : cps) {
    const UChar32 c = cp.value < 0x110000 ? static_cast<UChar32>(cp.value) : 0xFFFD;
    input.append(c);
    byte_of_unit.push_back(cp.offset);
    if (c > 0xFFFF) byte_of_unit.push_back(cp.offset);
  }
  byte_of_unit.push_back(text.size());
  const size_t units = static_cast<size_t>(input.length());
  UErrorCode status = U_ZERO_ERROR;
  std::unique_ptr<icu::RegexMatcher> matcher(icu_->pattern->matcher(input, status));
  if (U_FAILURE(status)) return {{0, text.size(), false}};
  std::vector<MatchSegment> segments = FindIter(
      units,
      [&](size_t start) -> std::optional<std::pair<size_t, size_t>> {
        UErrorCode s = U_ZERO_ERROR;
        if (!matcher->find(static_cast<int64_t>(start), s) || U_FAILURE(s)) return std::nullopt;
        return std::pair{static_cast<size_t>(matcher->start(s)),
                         static_cast<size_t>(matcher->end(s))};
      },
      [&](size_t pos) { return pos + (U16_IS_LEAD(input.charAt(static_cast<int32_t>(pos))) ? 2 : 1); });
  for (MatchSegment& segment : segments) {
    segment.begin = byte_of_unit[segment.begin];
    segment.end = byte_of_unit[segment.end];
  }
  return segments;
}

// ---- PreTokenizerOp ------------------------------------------------------------------------------

PreTokenizerOp PreTokenizerOp::ByteLevel(bool add_prefix_space, bool use_regex) {
  PreTokenizerOp op;
  op.kind = Kind::kByteLevel;
  op.add_prefix_space = add_prefix_space;
  op.use_regex = use_regex;
  if (use_regex) {
    op.regex = std::make_shared<const SplitRegex>(*SplitRegex::Compile(kGpt2SplitRegex));
  }
  return op;
}

PreTokenizerOp PreTokenizerOp::Split(SplitRegex regex, SplitBehavior behavior, bool invert) {
  PreTokenizerOp op;
  op.kind = Kind::kSplit;
  op.regex = std::make_shared<const SplitRegex>(std::move(regex));
  op.behavior = behavior;
  op.invert = invert;
  return op;
}

PreTokenizerOp PreTokenizerOp::Digits(bool individual_digits) {
  PreTokenizerOp op;
  op.kind = Kind::kDigits;
  op.individual_digits = individual_digits;
  op.behavior = individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous;
  return op;
}

PreTokenizerOp PreTokenizerOp::Punctuation(SplitBehavior behavior) {
  PreTokenizerOp op;
  op.kind = Kind::kPunctuation;
  op.behavior = behavior;
  return op;
}

PreTokenizerOp PreTokenizerOp::Whitespace() {
  PreTokenizerOp op;
  op.kind = Kind::kWhitespace;
  return op;
}

PreTokenizerOp PreTokenizerOp::WhitespaceSplit() {
  PreTokenizerOp op;
  op.kind = Kind::kWhitespaceSplit;
  op.behavior = SplitBehavior::kRemoved;
  return op;
}

PreTokenizerOp PreTokenizerOp::Metaspace(std::string replacement, PrependScheme scheme,
                                         bool split) {
  PreTokenizerOp op;
  op.kind = Kind::kMetaspace;
  op.replacement = std::move(replacement);
  op.prepend_scheme = scheme;
  op.split = split;
  op.behavior = SplitBehavior::kMergedWithNext;
  return op;
}

void ApplyPreTokenizer(const PreTokenizerOp& op, std::vector<PreTokenizedWord>* words,
                       std::vector<PreTokenizedWord>* out) {
  using Kind = PreTokenizerOp::Kind;
  for (PreTokenizedWord& word : *words) {
    if (word.text.empty()) continue;
    switch (op.kind) {
      case Kind::kByteLevel: {
        if (op.add_prefix_space && word.text[0] != ' ') word.text.insert(word.text.begin(), ' ');
        if (!op.use_regex) {
          out->push_back({ByteLevelEncode(word.text), word.at_start});
          break;
        }
        for (const MatchSegment& s : op.regex->FindMatches(word.text)) {
          out->push_back({ByteLevelEncode(std::string_view(word.text).substr(s.begin, s.end - s.begin)),
                          word.at_start && s.begin == 0});
        }
        break;
      }
      case Kind::kSplit: {
        std::vector<MatchSegment> segments = op.regex->FindMatches(word.text);
        if (op.invert) {
          for (MatchSegment& s : segments) s.is_match = !s.is_match;
        }
        AppendPieces(word, segments, op.behavior, out);
        break;
      }
      case Kind::kDigits:
        AppendPieces(word, FindCharMatches(word.text, IsRustNumeric), op.behavior, out);
        break;
      case Kind::kPunctuation:
        AppendPieces(word, FindCharMatches(word.text, IsPunctuation), op.behavior, out);
        break;
      case Kind::kWhitespace:
        SplitWhitespace(word, out);
        break;
      case Kind::kWhitespaceSplit:
        AppendPieces(word, FindCharMatches(word.text, IsWhiteSpaceProperty), op.behavior, out);
        break;
      case Kind::kMetaspace: {
        PreTokenizedWord replaced{ReplaceAllText(word.text, " ", op.replacement), word.at_start};
        const bool prepend =
            !replaced.text.starts_with(op.replacement) &&
            (op.prepend_scheme == PreTokenizerOp::PrependScheme::kAlways ||
             (op.prepend_scheme == PreTokenizerOp::PrependScheme::kFirst && word.at_start));
        if (prepend) replaced.text.insert(0, op.replacement);
        if (!op.split) {
          out->push_back(std::move(replaced));
          break;
        }
        const std::string& rep = op.replacement;
        std::vector<MatchSegment> segments;
        size_t gap_start = 0;
        for (size_t pos = replaced.text.find(rep); pos != std::string::npos;
             pos = replaced.text.find(rep, pos + rep.size())) {
          if (gap_start < pos) segments.push_back({gap_start, pos, false});
          segments.push_back({pos, pos + rep.size(), true});
          gap_start = pos + rep.size();
        }
        if (gap_start < replaced.text.size()) {
          segments.push_back({gap_start, replaced.text.size(), false});
        }
        AppendPieces(replaced, segments, op.behavior, out);
        break;
      }
    }
  }
}

}  // namespace tandem
