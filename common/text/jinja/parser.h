// The Jinja parser: tokens (lexer.h) to a statement tree (ast.h), following jinja2's grammar and
// operator precedence (conditional expressions, or, and, not, comparisons, + -, ~, * / // %, **
// left-associative, unary - +, then postfix . [] () and filters | and tests `is`).
#pragma once

#include <string_view>

#include "common/base/status.h"
#include "common/text/jinja/ast.h"

namespace tandem::jinja {

// Nesting deeper than this (brackets, operators, blocks) is refused: the parser and the
// interpreter recurse on the tree.
inline constexpr int kMaxParseDepth = 256;

// Parses a whole template. InvalidArgument "line N: ..." for a syntax error, an unknown or
// unsupported tag, an unclosed block, or nesting beyond kMaxParseDepth.
StatusOr<Body> ParseTemplate(std::string_view source);

}  // namespace tandem::jinja
