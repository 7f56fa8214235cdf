#include "common/text/pretokenizer.h"

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

std::vector<std::pair<size_t, size_t>> SplitText(std::string_view text, SplitPattern pattern) {
  std::vector<std::pair<size_t, size_t>> pieces;
  if (text.empty()) return pieces;
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
    if (gap_start < i) pieces.emplace_back(byte_at(gap_start), byte_at(i));
    pieces.emplace_back(byte_at(i), byte_at(i + len));
    i += len;
    gap_start = i;
  }
  if (gap_start < cps.size()) pieces.emplace_back(byte_at(gap_start), text.size());
  return pieces;
}

}  // namespace tandem
