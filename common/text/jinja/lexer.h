// The Jinja lexer, as jinja2's Lexer with the settings transformers renders chat templates with
// (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False, default delimiters):
// newlines normalized to "\n" and one trailing newline dropped; `{%- ... -%}` whitespace
// control ('-' strips all whitespace on that side, '+' keeps it); lstrip_blocks removes the
// spaces before a block or comment tag that starts a line; trim_blocks removes the first newline
// after a block or comment tag; comments and `{% raw %}` handled here.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"

namespace tandem::jinja {

enum class TokenType {
  kData,        // text outside tags (value in `text`)
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,  // value decoded
  kInt,
  kFloat,
  kOperator,  // text: "+", "//", "==", "(", ...
  kEof,
};

struct Token {
  TokenType type = TokenType::kEof;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
};

// Tokenizes `source`. InvalidArgument with "line N: ..." for an unterminated tag, comment,
// string or raw block, an unexpected character, unbalanced brackets, or a bad escape.
StatusOr<std::vector<Token>> Tokenize(std::string_view source);

}  // namespace tandem::jinja
