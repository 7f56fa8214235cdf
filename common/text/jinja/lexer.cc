#include "common/text/jinja/lexer.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "common/text/jinja/value.h"

namespace tandem::jinja {
namespace {

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// The byte length of the Python-whitespace prefix/suffix of `s` (str.isspace per code point).
size_t LeadingSpace(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (IsAsciiSpace(s[i]) || (s[i] >= 0x1c && s[i] <= 0x1f)) {
      ++i;
      continue;
    }
    if (static_cast<unsigned char>(s[i]) < 0x80) break;
    size_t len = 1;
    while (i + len < s.size() && (static_cast<unsigned char>(s[i + len]) & 0xc0) == 0x80) ++len;
    std::u32string cp = DecodeUtf8(s.substr(i, len));
    if (cp.size() != 1 || !IsPythonSpace(cp[0])) break;
    i += len;
  }
  return i;
}

std::string_view RStrip(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xc0) == 0x80) --start;
    if (LeadingSpace(s.substr(start, end - start)) != end - start) break;
    end = start;
  }
  return s.substr(0, end);
}

bool AllSpace(std::string_view s) { return LeadingSpace(s) == s.size(); }

int CountNewlines(std::string_view s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // jinja2 splits on \r\n, \r and \n and joins with \n, dropping one trailing newline.
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_.push_back('\n');
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_.push_back(source[i]);
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  StatusOr<std::vector<Token>> Run() {
    while (pos_ < src_.size()) {
      const size_t tag = FindTagStart(pos_);
      if (tag == std::string::npos) {
        AddData(std::string_view(src_).substr(pos_));
        line_ += CountNewlines(std::string_view(src_).substr(pos_));
        pos_ = src_.size();
        break;
      }
      const char kind = src_[tag + 1];  // '{', '%' or '#'
      char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (sign != '-' && sign != '+') sign = '\0';
      std::string_view text = std::string_view(src_).substr(pos_, tag - pos_);
      if (sign == '-') {
        text = RStrip(text);
      } else if (sign != '+' && kind != '{') {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting_) && l_pos < text.size() && AllSpace(text.substr(l_pos))) {
          text = text.substr(0, l_pos);
        }
      }
      AddData(text);
      line_ += CountNewlines(std::string_view(src_).substr(pos_, tag - pos_));
      pos_ = tag + 2 + (sign ? 1 : 0);
      Status s = kind == '#'   ? Comment()
                 : kind == '%' ? (IsRaw(tag) ? Raw() : Tag(TokenType::kBlockBegin))
                               : Tag(TokenType::kVarBegin);
      if (!s.ok()) return s;
    }
    Token eof;
    eof.type = TokenType::kEof;
    eof.line = line_;
    tokens_.push_back(eof);
    return std::move(tokens_);
  }

 private:
  Status Error(const std::string& message) const {
    return InvalidArgument("line " + std::to_string(line_) + ": " + message);
  }

  size_t FindTagStart(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return std::string::npos;
  }

  void AddData(std::string_view text) {
    if (text.empty()) return;
    Token t;
    t.type = TokenType::kData;
    t.text = std::string(text);
    t.line = line_;
    tokens_.push_back(std::move(t));
  }

  void Add(TokenType type, std::string text = "") {
    Token t;
    t.type = type;
    t.text = std::move(text);
    t.line = line_;
    tokens_.push_back(std::move(t));
  }

  // After an end delimiter: '-' strips all whitespace, trim_blocks one newline (blocks and
  // comments), '+' nothing. Sets line_starting_ as jinja2 does (the match ended in "\n").
  void AfterEnd(char sign, bool block) {
    size_t skip = 0;
    std::string_view rest = std::string_view(src_).substr(pos_);
    if (sign == '-') {
      skip = LeadingSpace(rest);
    } else if (sign != '+' && block && !rest.empty() && rest[0] == '\n') {
      skip = 1;
    }
    line_ += CountNewlines(rest.substr(0, skip));
    pos_ += skip;
    line_starting_ = skip > 0 ? rest[skip - 1] == '\n' : false;
  }

  Status Comment() {
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) return Error("missing end of comment tag");
    char sign = end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : '\0';
    line_ += CountNewlines(std::string_view(src_).substr(pos_, end - pos_));
    pos_ = end + 2;
    AfterEnd(sign, /*block=*/true);
    return Status::Ok();
  }

  // `{%[-+]?\s*raw\s*(-%}|%})` at `tag`.
  bool IsRaw(size_t tag) {
    size_t i = tag + 2;
    if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
    while (i < src_.size() && IsAsciiSpace(src_[i])) ++i;
    if (src_.compare(i, 3, "raw") != 0) return false;
    i += 3;
    while (i < src_.size() && IsAsciiSpace(src_[i])) ++i;
    if (src_.compare(i, 3, "-%}") == 0) {
      raw_begin_end_ = i + 3;
      raw_begin_strip_ = true;
      return true;
    }
    if (src_.compare(i, 2, "%}") == 0) {
      raw_begin_end_ = i + 2;
      raw_begin_strip_ = false;
      return true;
    }
    return false;
  }

  Status Raw() {
    line_ += CountNewlines(std::string_view(src_).substr(pos_, raw_begin_end_ - pos_));
    pos_ = raw_begin_end_;
    if (raw_begin_strip_) {
      AfterEnd('-', true);
    } else {
      line_starting_ = false;
    }
    // Find `{%[-+]?\s*endraw\s*(+%}|-%}|%})`.
    for (size_t at = src_.find("{%", pos_); at != std::string::npos; at = src_.find("{%", at + 1)) {
      size_t i = at + 2;
      char sign = '\0';
      if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) sign = src_[i++];
      while (i < src_.size() && IsAsciiSpace(src_[i])) ++i;
      if (src_.compare(i, 6, "endraw") != 0) continue;
      i += 6;
      while (i < src_.size() && IsAsciiSpace(src_[i])) ++i;
      char end_sign = '\0';
      if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) end_sign = src_[i++];
      if (src_.compare(i, 2, "%}") != 0) continue;
      std::string_view text = std::string_view(src_).substr(pos_, at - pos_);
      if (sign == '-') {
        text = RStrip(text);
      } else if (sign != '+') {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting_) && l_pos < text.size() && AllSpace(text.substr(l_pos))) {
          text = text.substr(0, l_pos);
        }
      }
      AddData(text);
      line_ += CountNewlines(std::string_view(src_).substr(pos_, i + 2 - pos_));
      pos_ = i + 2;
      AfterEnd(end_sign, true);
      return Status::Ok();
    }
    return Error("missing end of raw directive");
  }

  // Tokens of one {{ }} or {% %} tag, up to and including its end.
  Status Tag(TokenType begin) {
    const bool block = begin == TokenType::kBlockBegin;
    Add(begin);
    std::vector<char> brackets;
    while (true) {
      if (pos_ >= src_.size()) {
        return Error(block ? "unexpected end of template, expected '%}'"
                           : "unexpected end of template, expected '}}'");
      }
      if (brackets.empty()) {
        const char* close = block ? "%}" : "}}";
        char sign = '\0';
        size_t at = pos_;
        if ((src_[at] == '-' || (block && src_[at] == '+')) && src_.compare(at + 1, 2, close) == 0) {
          sign = src_[at++];
        }
        if (src_.compare(at, 2, close) == 0) {
          Add(block ? TokenType::kBlockEnd : TokenType::kVarEnd);
          pos_ = at + 2;
          AfterEnd(sign, block);
          return Status::Ok();
        }
      }
      const char c = src_[pos_];
      if (IsAsciiSpace(c)) {
        line_ += c == '\n';
        ++pos_;
        continue;
      }
      if (std::isdigit(static_cast<unsigned char>(c))) {
        TANDEM_RETURN_IF_ERROR(Number());
        continue;
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t end = pos_;
        while (end < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) {
          ++end;
        }
        Add(TokenType::kName, src_.substr(pos_, end - pos_));
        pos_ = end;
        continue;
      }
      if (c == '\'' || c == '"') {
        TANDEM_RETURN_IF_ERROR(String(c));
        continue;
      }
      static const char* const kOperators[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                               "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                               ">",  "<",  "=",  ".",  ":",  "|",  ",", ";"};
      const char* op = nullptr;
      for (const char* candidate : kOperators) {
        if (src_.compare(pos_, std::char_traits<char>::length(candidate), candidate) == 0) {
          op = candidate;
          break;
        }
      }
      if (op == nullptr) {
        std::string shown = static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f
                                ? "byte " + std::to_string(static_cast<unsigned char>(c))
                                : std::string("'") + c + "'";
        return Error("unexpected character " + shown + " in a tag");
      }
      const std::string o(op);
      if (o == "(" || o == "[" || o == "{") {
        brackets.push_back(o == "(" ? ')' : o == "[" ? ']' : '}');
      } else if (o == ")" || o == "]" || o == "}") {
        if (brackets.empty()) return Error("unexpected '" + o + "'");
        if (brackets.back() != o[0]) {
          return Error("unexpected '" + o + "', expected '" + std::string(1, brackets.back()) + "'");
        }
        brackets.pop_back();
      }
      Add(TokenType::kOperator, o);
      pos_ += o.size();
    }
  }

  // jinja2's float_re, then integer_re (with '_' separators and 0b/0o/0x prefixes).
  Status Number() {
    auto digits = [this](size_t i) {  // (\d+_)*\d+ ; returns the end or npos
      if (i >= src_.size() || !std::isdigit(static_cast<unsigned char>(src_[i]))) return std::string::npos;
      while (i < src_.size()) {
        if (std::isdigit(static_cast<unsigned char>(src_[i]))) {
          ++i;
        } else if (src_[i] == '_' && i + 1 < src_.size() &&
                   std::isdigit(static_cast<unsigned char>(src_[i + 1]))) {
          ++i;
        } else {
          break;
        }
      }
      return i;
    };
    auto clean = [](std::string s) {
      std::string out;
      for (char c : s) {
        if (c != '_') out.push_back(c);
      }
      return out;
    };
    const bool after_dot = pos_ > 0 && src_[pos_ - 1] == '.';
    size_t int_end = digits(pos_);
    if (!after_dot) {
      size_t end = int_end;
      bool is_float = false;
      if (end < src_.size() && src_[end] == '.') {
        size_t frac = digits(end + 1);
        if (frac != std::string::npos) {
          end = frac;
          is_float = true;
        }
      }
      if (end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
        size_t e = end + 1;
        if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
        size_t exp_end = digits(e);
        if (exp_end != std::string::npos) {
          end = exp_end;
          is_float = true;
        }
      }
      if (is_float) {
        Token t;
        t.type = TokenType::kFloat;
        t.float_value = std::strtod(clean(src_.substr(pos_, end - pos_)).c_str(), nullptr);
        t.line = line_;
        tokens_.push_back(t);
        pos_ = end;
        return Status::Ok();
      }
    }
    // Integers: 0b/0o/0x, [1-9](_?\d)*, 0(_?0)*.
    int base = 10;
    size_t start = pos_, end = int_end;
    if (src_[pos_] == '0' && pos_ + 1 < src_.size()) {
      const char p = static_cast<char>(std::tolower(static_cast<unsigned char>(src_[pos_ + 1])));
      if (p == 'b' || p == 'o' || p == 'x') {
        base = p == 'b' ? 2 : p == 'o' ? 8 : 16;
        size_t i = pos_ + 2;
        auto ok = [&](char ch) {
          ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
          return base == 2 ? (ch == '0' || ch == '1')
                 : base == 8 ? (ch >= '0' && ch <= '7')
                             : std::isxdigit(static_cast<unsigned char>(ch)) != 0;
        };
        size_t j = i;
        while (j < src_.size() && (ok(src_[j]) || (src_[j] == '_' && j + 1 < src_.size() && ok(src_[j + 1])))) ++j;
        if (j > i) {
          start = i;
          end = j;
        } else {
          base = 10;
        }
      }
    }
    if (base == 10 && src_[pos_] == '0') {  // 0(_?0)*
      end = pos_ + 1;
      while (end < src_.size() && (src_[end] == '0' || (src_[end] == '_' && end + 1 < src_.size() && src_[end + 1] == '0'))) ++end;
    }
    const std::string text = clean(src_.substr(start, end - start));
    errno = 0;
    char* parse_end = nullptr;
    const unsigned long long value = std::strtoull(text.c_str(), &parse_end, base);
    if (errno == ERANGE || value > static_cast<unsigned long long>(INT64_MAX)) {
      return Error("integer literal " + src_.substr(pos_, end - pos_) + " is too large");
    }
    Token t;
    t.type = TokenType::kInt;
    t.int_value = static_cast<int64_t>(value);
    t.line = line_;
    tokens_.push_back(t);
    pos_ = end;
    return Status::Ok();
  }

  // A quoted string with Python's escapes (as jinja2's unicode-escape decoding).
  Status String(char quote) {
    const int start_line = line_;
    std::string out;
    size_t i = pos_ + 1;
    while (true) {
      if (i >= src_.size()) return Error("unterminated string");
      const char c = src_[i];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        out.push_back(c);
        ++i;
        continue;
      }
      if (i + 1 >= src_.size()) return Error("unterminated string");
      const char e = src_[i + 1];
      i += 2;
      auto hex = [&](int n) -> StatusOr<char32_t> {
        if (i + n > src_.size()) return Error("truncated \\x, \\u or \\U escape in a string");
        char32_t v = 0;
        for (int k = 0; k < n; ++k) {
          const char h = src_[i + k];
          if (!std::isxdigit(static_cast<unsigned char>(h))) {
            return Error("truncated \\x, \\u or \\U escape in a string");
          }
          v = v * 16 + static_cast<char32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : std::tolower(h) - 'a' + 10);
        }
        i += n;
        return v;
      };
      switch (e) {
        case '\n': ++line_; break;  // line continuation
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'v': out.push_back('\v'); break;
        case 'x':
        case 'u':
        case 'U': {
          TANDEM_ASSIGN_OR_RETURN(char32_t v, hex(e == 'x' ? 2 : e == 'u' ? 4 : 8));
          if (v > 0x10ffff) return Error("illegal Unicode character in a string escape");
          AppendUtf8(&out, v);
          break;
        }
        case 'N': return Error("\\N{...} escapes are not supported");
        default:
          if (e >= '0' && e <= '7') {
            char32_t v = static_cast<char32_t>(e - '0');
            for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k) {
              v = v * 8 + static_cast<char32_t>(src_[i++] - '0');
            }
            AppendUtf8(&out, v);
          } else {
            out.push_back('\\');
            out.push_back(e);
          }
      }
    }
    Token t;
    t.type = TokenType::kString;
    t.text = std::move(out);
    t.line = start_line;
    tokens_.push_back(std::move(t));
    pos_ = i + 1;
    return Status::Ok();
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  size_t raw_begin_end_ = 0;
  bool raw_begin_strip_ = false;
  std::vector<Token> tokens_;
};

}  // namespace

StatusOr<std::vector<Token>> Tokenize(std::string_view source) { return Lexer(source).Run(); }

}  // namespace tandem::jinja
