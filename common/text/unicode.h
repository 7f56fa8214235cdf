// Unicode helpers for the tokenizer: UTF-8 decoding that never fails, the character classes the
// pre-tokenizer regexes use (\p{L}, \p{N}, \s as Oniguruma defines them, looked up in ICU),
// normalization (NFC and friends, via ICU) and lossy UTF-8 repair with Rust's rules, so that our
// decoded text is byte-identical to Hugging Face `tokenizers`.
//
// All functions are pure and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::unicode {

// Class of a code point as the pre-tokenizer patterns see it.
enum class CharClass : uint8_t {
  kLetter,      // \p{L}
  kNumber,      // \p{N}
  kWhitespace,  // \s: U+0009-000D, U+0085, Zs, Zl, Zp
  kOther,       // anything else (also invalid UTF-8 bytes)
};

// A decoded code point and where it sits in the source string.
struct CodePoint {
  uint32_t value;  // 0xFFFD-like sentinel 0x110000 + byte for an invalid byte
  uint32_t offset;
  uint8_t length;  // bytes in the source
  CharClass cls;
};

// Decodes `text` into code points. An invalid byte becomes one code point of class kOther with
// value 0x110000 + byte, so every input, valid or not, can be pre-tokenized and byte-encoded.
std::vector<CodePoint> Decode(std::string_view text);

CharClass Classify(uint32_t cp);

// Length of the valid UTF-8 sequence starting at text[i] (1..4), or 0 when the byte at i does not
// start one. Sets *truncated when the bytes so far are a valid prefix cut off by the end of text.
size_t ValidSequenceLength(std::string_view text, size_t i, bool* truncated);

// Rust's String::from_utf8_lossy: each maximal invalid subpart becomes one U+FFFD.
std::string RepairUtf8(std::string_view bytes);

bool IsValidUtf8(std::string_view text);

// Appends the UTF-8 encoding of `cp` to *out.
void AppendUtf8(uint32_t cp, std::string* out);

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };

// Normalizes valid UTF-8 text (invalid input is first repaired). ASCII returns unchanged fast.
std::string Normalize(std::string_view text, NormalForm form);

// Python's str.isspace() for one code point (what Jinja's `trim` strips).
bool IsPythonSpace(uint32_t cp);

// Python's str.strip(): removes leading and trailing IsPythonSpace code points.
std::string PythonStrip(std::string_view text);

}  // namespace tandem::unicode
