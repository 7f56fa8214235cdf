#include "common/text/unicode.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <array>

namespace tandem::unicode {
namespace {

constexpr uint32_t kInvalidBase = 0x110000;

// ASCII is most of any prompt; a table keeps ICU off the hot path.
constexpr std::array<CharClass, 128> MakeAsciiTable() {
  std::array<CharClass, 128> table{};
  for (int c = 0; c < 128; ++c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      table[c] = CharClass::kLetter;
    } else if (c >= '0' && c <= '9') {
      table[c] = CharClass::kNumber;
    } else if ((c >= 0x09 && c <= 0x0D) || c == ' ') {
      table[c] = CharClass::kWhitespace;
    } else {
      table[c] = CharClass::kOther;
    }
  }
  return table;
}
constexpr std::array<CharClass, 128> kAsciiClass = MakeAsciiTable();

bool IsCont(unsigned char b) { return (b & 0xC0) == 0x80; }

}  // namespace

CharClass Classify(uint32_t cp) {
  if (cp < 128) return kAsciiClass[cp];
  if (cp >= kInvalidBase) return CharClass::kOther;
  if (cp == 0x85) return CharClass::kWhitespace;
  switch (u_charType(static_cast<UChar32>(cp))) {
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      return CharClass::kLetter;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER:
      return CharClass::kNumber;
    case U_SPACE_SEPARATOR:
    case U_LINE_SEPARATOR:
    case U_PARAGRAPH_SEPARATOR:
      return CharClass::kWhitespace;
    default:
      return CharClass::kOther;
  }
}

size_t ValidSequenceLength(std::string_view text, size_t i, bool* truncated) {
  *truncated = false;
  const auto b0 = static_cast<unsigned char>(text[i]);
  if (b0 < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k < need; ++k) {
    if (i + k >= text.size()) {
      *truncated = true;
      return 0;
    }
    const auto b = static_cast<unsigned char>(text[i + k]);
    const bool ok = (k == 1) ? (b >= lo && b <= hi) : IsCont(b);
    if (!ok) return 0;
  }
  return need;
}

std::vector<CodePoint> Decode(std::string_view text) {
  std::vector<CodePoint> out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const auto b0 = static_cast<unsigned char>(text[i]);
    if (b0 < 0x80) {
      out.push_back({b0, static_cast<uint32_t>(i), 1, kAsciiClass[b0]});
      ++i;
      continue;
    }
    bool truncated;
    const size_t len = ValidSequenceLength(text, i, &truncated);
    if (len == 0) {
      out.push_back({kInvalidBase + b0, static_cast<uint32_t>(i), 1, CharClass::kOther});
      ++i;
      continue;
    }
    uint32_t cp = b0 & (0xFF >> (len + 1));
    for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
    out.push_back({cp, static_cast<uint32_t>(i), static_cast<uint8_t>(len), Classify(cp)});
    i += len;
  }
  return out;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string RepairUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    bool truncated;
    const size_t len = ValidSequenceLength(bytes, i, &truncated);
    if (len > 0) {
      out.append(bytes.substr(i, len));
      i += len;
      continue;
    }
    out.append("\xEF\xBF\xBD");
    // Skip the maximal subpart: the lead byte plus the continuation bytes that were still valid.
    const auto b0 = static_cast<unsigned char>(bytes[i]);
    size_t skip = 1;
    if (b0 >= 0xC2 && b0 <= 0xF4) {
      unsigned char lo = 0x80, hi = 0xBF;
      size_t need = b0 <= 0xDF ? 2 : (b0 <= 0xEF ? 3 : 4);
      if (b0 == 0xE0) lo = 0xA0;
      if (b0 == 0xED) hi = 0x9F;
      if (b0 == 0xF0) lo = 0x90;
      if (b0 == 0xF4) hi = 0x8F;
      for (size_t k = 1; k < need && i + k < bytes.size(); ++k) {
        const auto b = static_cast<unsigned char>(bytes[i + k]);
        const bool ok = (k == 1) ? (b >= lo && b <= hi) : IsCont(b);
        if (!ok) break;
        ++skip;
      }
    }
    i += skip;
  }
  return out;
}

bool IsValidUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    bool truncated;
    const size_t len = ValidSequenceLength(text, i, &truncated);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

std::string Normalize(std::string_view text, NormalForm form) {
  bool ascii = true;
  for (char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) {
      ascii = false;
      break;
    }
  }
  if (ascii) return std::string(text);
  std::string repaired;
  if (!IsValidUtf8(text)) {
    repaired = RepairUtf8(text);
    text = repaired;
  }
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = nullptr;
  switch (form) {
    case NormalForm::kNfc: normalizer = icu::Normalizer2::getNFCInstance(err); break;
    case NormalForm::kNfd: normalizer = icu::Normalizer2::getNFDInstance(err); break;
    case NormalForm::kNfkc: normalizer = icu::Normalizer2::getNFKCInstance(err); break;
    case NormalForm::kNfkd: normalizer = icu::Normalizer2::getNFKDInstance(err); break;
  }
  if (U_FAILURE(err) || normalizer == nullptr) return std::string(text);
  const icu::UnicodeString source =
      icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  const icu::UnicodeString result = normalizer->normalize(source, err);
  if (U_FAILURE(err)) return std::string(text);
  std::string out;
  result.toUTF8String(out);
  return out;
}

bool IsPythonSpace(uint32_t cp) {
  // Python: bidirectional class WS, B or S, or category Zs.
  if ((cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20)) return true;
  switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

std::string PythonStrip(std::string_view text) {
  const std::vector<CodePoint> cps = Decode(text);
  size_t begin = 0, end = cps.size();
  while (begin < end && IsPythonSpace(cps[begin].value)) ++begin;
  while (end > begin && IsPythonSpace(cps[end - 1].value)) --end;
  if (begin == end) return std::string();
  const size_t from = cps[begin].offset;
  const size_t to = cps[end - 1].offset + cps[end - 1].length;
  return std::string(text.substr(from, to - from));
}

}  // namespace tandem::unicode
