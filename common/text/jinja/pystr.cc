#include "common/text/jinja/pystr.h"

#include <unicode/uchar.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "common/text/jinja/interpreter.h"

namespace tandem::jinja {
namespace {

std::string OneChar(char32_t c) {
  std::string s;
  AppendUtf8(&s, c);
  return s;
}

bool IsCased(char32_t c) {
  return u_isUUppercase(static_cast<UChar32>(c)) || u_isULowercase(static_cast<UChar32>(c)) ||
         u_istitle(static_cast<UChar32>(c));
}

bool IsLineBreak(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e ||
         c == 0x85 || c == 0x2028 || c == 0x2029;
}

}  // namespace

std::string MapCase(const std::string& s, CaseMap map) {
  if (s.empty()) return s;
  UErrorCode err = U_ZERO_ERROR;
  int32_t len16 = 0;
  // Invalid UTF-8 becomes U+FFFD. The length query must substitute the same way as the
  // conversion: without substitution it stops at the first bad byte and under-counts.
  u_strFromUTF8WithSub(nullptr, 0, &len16, s.data(), static_cast<int32_t>(s.size()), 0xfffd,
                       nullptr, &err);
  if (err != U_BUFFER_OVERFLOW_ERROR && U_FAILURE(err)) return s;
  err = U_ZERO_ERROR;
  std::u16string in(static_cast<size_t>(len16), u'\0');
  u_strFromUTF8WithSub(in.data(), len16, &len16, s.data(), static_cast<int32_t>(s.size()), 0xfffd,
                       nullptr, &err);
  if (U_FAILURE(err)) return s;
  std::u16string out(in.size() * 3 + 4, u'\0');
  err = U_ZERO_ERROR;
  int32_t n = 0;
  if (map == CaseMap::kUpper) {
    n = u_strToUpper(out.data(), static_cast<int32_t>(out.size()), in.data(), len16, "", &err);
  } else if (map == CaseMap::kLower) {
    n = u_strToLower(out.data(), static_cast<int32_t>(out.size()), in.data(), len16, "", &err);
  } else {
    n = u_strToTitle(out.data(), static_cast<int32_t>(out.size()), in.data(), len16, nullptr, "",
                     &err);
  }
  if (U_FAILURE(err)) return s;
  out.resize(static_cast<size_t>(n));
  std::string result;
  int32_t len8 = 0;
  err = U_ZERO_ERROR;
  u_strToUTF8(nullptr, 0, &len8, out.data(), n, &err);
  result.resize(static_cast<size_t>(len8));
  err = U_ZERO_ERROR;
  u_strToUTF8(result.data(), len8, &len8, out.data(), n, &err);
  return result;
}

// Python's str.title(): a cased character after an uncased one starts a word.
std::string PyTitle(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (char32_t c : DecodeUtf8(s)) {
    const std::string one = OneChar(c);
    out += prev_cased ? MapCase(one, CaseMap::kLower) : MapCase(one, CaseMap::kTitleOne);
    prev_cased = IsCased(c);
  }
  return out;
}

// Python's str.capitalize(): the first character title-cased, the rest lower-cased.
std::string PyCapitalize(const std::string& s) {
  const std::u32string cps = DecodeUtf8(s);
  if (cps.empty()) return s;
  return MapCase(OneChar(cps[0]), CaseMap::kTitleOne) +
         MapCase(EncodeUtf8(cps.substr(1)), CaseMap::kLower);
}

// jinja2's title filter: upper-case the first character after a run of [-\s({[<].
std::string JinjaTitle(const std::string& s) {
  std::string out;
  bool at_start = true;
  for (char32_t c : DecodeUtf8(s)) {
    const bool sep = IsPythonSpace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      AppendUtf8(&out, c);
      at_start = true;
    } else {
      out += MapCase(OneChar(c), at_start ? CaseMap::kUpper : CaseMap::kLower);
      at_start = false;
    }
  }
  return out;
}

// str.strip/lstrip/rstrip([chars]).
std::string PyStrip(const std::string& s, const Value* chars, bool left, bool right) {
  const std::u32string cps = DecodeUtf8(s);
  std::u32string set;
  const bool whitespace = chars == nullptr || chars->is_none();
  if (!whitespace) {
    if (!chars->is_string()) Fail("strip arg must be None or str");
    set = DecodeUtf8(chars->str());
  }
  auto strip = [&](char32_t c) {
    return whitespace ? IsPythonSpace(c) : set.find(c) != std::u32string::npos;
  };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip(cps[e - 1])) --e;
  }
  return EncodeUtf8(std::u32string_view(cps).substr(b, e - b));
}

std::vector<Value> PySplit(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (sep == nullptr || sep->is_none()) {
    std::u32string cps = DecodeUtf8(s);
    if (from_right) std::reverse(cps.begin(), cps.end());
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && IsPythonSpace(cps[i])) ++i;
      if (i >= cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        size_t e = cps.size();
        while (e > i && IsPythonSpace(cps[e - 1])) --e;
        std::u32string rest = cps.substr(i, e - i);
        if (from_right) std::reverse(rest.begin(), rest.end());
        parts.push_back(EncodeUtf8(rest));
        break;
      }
      size_t j = i;
      while (j < cps.size() && !IsPythonSpace(cps[j])) ++j;
      std::u32string word = cps.substr(i, j - i);
      if (from_right) std::reverse(word.begin(), word.end());
      parts.push_back(EncodeUtf8(word));
      i = j;
    }
    if (from_right) std::reverse(parts.begin(), parts.end());
  } else {
    if (!sep->is_string()) Fail("must be str or None, not " + sep->TypeName());
    const std::string& d = sep->str();
    if (d.empty()) Fail("empty separator");
    if (!from_right) {
      size_t start = 0;
      while (true) {
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) break;
        size_t at = s.find(d, start);
        if (at == std::string::npos) break;
        parts.push_back(s.substr(start, at - start));
        start = at + d.size();
      }
      parts.push_back(s.substr(start));
    } else {
      size_t end = s.size();
      std::vector<std::string> rev;
      while (true) {
        if (maxsplit >= 0 && static_cast<int64_t>(rev.size()) == maxsplit) break;
        if (end < d.size()) break;
        size_t at = s.rfind(d, end - d.size());
        if (at == std::string::npos) break;
        rev.push_back(s.substr(at + d.size(), end - at - d.size()));
        end = at;
      }
      rev.push_back(s.substr(0, end));
      parts.assign(rev.rbegin(), rev.rend());
    }
  }
  std::vector<Value> out;
  for (auto& p : parts) out.push_back(Value::String(std::move(p)));
  return out;
}


// str.splitlines() (keepends=False).
std::vector<std::string> PySplitLines(const std::string& s) {
  const std::u32string cps = DecodeUtf8(s);
  std::vector<std::string> lines;
  size_t i = 0;
  while (i < cps.size()) {
    size_t j = i;
    while (j < cps.size() && !IsLineBreak(cps[j])) ++j;
    lines.push_back(EncodeUtf8(std::u32string_view(cps).substr(i, j - i)));
    if (j < cps.size() && cps[j] == '\r' && j + 1 < cps.size() && cps[j + 1] == '\n') ++j;
    i = j + 1;
  }
  return lines;
}

std::string PyReplace(Interpreter& in, const std::string& s, const std::string& old,
                      const std::string& repl, int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {
    const std::u32string cps = DecodeUtf8(s);
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      if (i < cps.size()) AppendUtf8(&out, cps[i]);
      in.CheckSize(out.size());
    }
    return out;
  }
  size_t start = 0;
  while (count < 0 || done < count) {
    size_t at = s.find(old, start);
    if (at == std::string::npos) break;
    out.append(s, start, at - start);
    out += repl;
    in.CheckSize(out.size());
    start = at + old.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  in.CheckSize(out.size());
  return out;
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '\'': out += "&#39;"; break;
      case '"': out += "&#34;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

int64_t ToIndex(const Value& v, const char* what) {
  if (v.kind() != Kind::kInt && v.kind() != Kind::kBool) {
    Fail(std::string(what) + " must be an integer, not " + v.TypeName());
  }
  return v.int_value();
}

const std::string& NeedString(const Value& v, const char* what) {
  if (!v.is_string()) Fail(std::string(what) + " must be a string, not " + v.TypeName());
  return v.str();
}

// printf-style `format % args` for %s %r %d %i %f %x %% (with an optional precision).
std::string PercentFormat(Interpreter& in, const std::string& fmt, const Value& args) {
  std::vector<Value> list;
  if (args.kind() == Kind::kTuple) list = args.items();
  else list.push_back(args);
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    if (++i >= fmt.size()) Fail("incomplete format");
    if (fmt[i] == '%') {
      out.push_back('%');
      continue;
    }
    const Value* arg = nullptr;
    Value named;
    if (fmt[i] == '(') {
      const size_t close = fmt.find(')', i);
      if (close == std::string::npos) Fail("incomplete format key");
      if (!args.is_dict()) Fail("format requires a mapping");
      const Value* v = args.dict().Find(Value::String(fmt.substr(i + 1, close - i - 1)));
      if (v == nullptr) Fail("format key " + fmt.substr(i + 1, close - i - 1) + " not found");
      named = *v;
      arg = &named;
      i = close + 1;
    }
    int precision = -1;
    if (i < fmt.size() && fmt[i] == '.') {
      precision = 0;
      while (++i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) {
        precision = std::min(precision * 10 + (fmt[i] - '0'), 100);
      }
    }
    if (i >= fmt.size()) Fail("incomplete format");
    if (arg == nullptr) {
      if (next >= list.size()) Fail("not enough arguments for format string");
      arg = &list[next++];
    }
    const char conv = fmt[i];
    char buf[512];
    switch (conv) {
      case 's': out += in.Str(*arg); break;
      case 'r': out += arg->Repr(in.limits().max_output_bytes); break;
      case 'd':
      case 'i':
      case 'x':
        if (!arg->is_number()) Fail("%" + std::string(1, conv) + " format: a real number is required, not " + arg->TypeName());
        if (conv == 'x') {
          std::snprintf(buf, sizeof(buf), "%llx", static_cast<long long>(arg->kind() == Kind::kFloat ? static_cast<int64_t>(arg->float_value()) : arg->int_value()));
        } else {
          std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(arg->kind() == Kind::kFloat ? static_cast<int64_t>(arg->float_value()) : arg->int_value()));
        }
        out += buf;
        break;
      case 'f':
        if (!arg->is_number()) Fail("must be real number, not " + arg->TypeName());
        if (std::fabs(arg->float_value()) > 1e300) Fail("%f argument too large");
        std::snprintf(buf, sizeof(buf), "%.*f", precision < 0 ? 6 : precision, arg->float_value());
        out += buf;
        break;
      default: Fail(std::string("unsupported format character '") + conv + "'");
    }
    in.CheckSize(out.size());
  }
  if (args.kind() == Kind::kTuple && next < list.size()) {
    Fail("not all arguments converted during string formatting");
  }
  return out;
}

// str.format with {} / {0} / {name} fields and !s / !r conversions (no format specs).
std::string BraceFormat(Interpreter& in, const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '}' ) {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') ++i;
      else Fail("Single '}' encountered in format string");
      out.push_back('}');
      continue;
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    const size_t close = fmt.find('}', i);
    if (close == std::string::npos) Fail("Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    char conversion = 's';
    if (const size_t bang = field.find('!'); bang != std::string::npos) {
      if (bang + 2 != field.size()) Fail("unsupported format field '{" + field + "}'");
      conversion = field[bang + 1];
      field.resize(bang);
    }
    if (field.find_first_of(":.[") != std::string::npos) {
      Fail("format specs are not supported: '{" + field + "}'");
    }
    const Value* v = nullptr;
    if (field.empty() || std::all_of(field.begin(), field.end(), ::isdigit)) {
      const size_t index = field.empty() ? auto_index++ : std::stoul(field.substr(0, 9));
      if (index >= args.positional.size()) Fail("Replacement index " + std::to_string(index) + " out of range");
      v = &args.positional[index];
    } else {
      for (const auto& [k, val] : args.keywords) {
        if (k == field) v = &val;
      }
      if (v == nullptr) Fail("KeyError: '" + field + "'");
    }
    if (conversion == 'r') out += v->Repr(in.limits().max_output_bytes);
    else if (conversion == 's') out += in.Str(*v);
    else Fail(std::string("unknown conversion specifier ") + conversion);
    in.CheckSize(out.size());
    i = close;
  }
  return out;
}

// Python int(str): optional sign, digits with single underscores, surrounding whitespace.
std::optional<int64_t> ParsePyInt(const std::string& text, int base) {
  std::string s;
  for (char c : text) s.push_back(c);
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  s = s.substr(b, e - b);
  if (s.empty()) return std::nullopt;
  bool neg = false;
  size_t i = 0;
  if (s[0] == '+' || s[0] == '-') {
    neg = s[0] == '-';
    i = 1;
  }
  if (i >= s.size()) return std::nullopt;
  std::string digits;
  for (; i < s.size(); ++i) {
    if (s[i] == '_' && !digits.empty() && i + 1 < s.size() && s[i + 1] != '_') continue;
    if (!std::isalnum(static_cast<unsigned char>(s[i]))) return std::nullopt;
    digits.push_back(s[i]);
  }
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(digits.c_str(), &end, base);
  if (errno == ERANGE || *end != '\0' || digits.empty()) return std::nullopt;
  return neg ? -v : v;
}

std::optional<double> ParsePyFloat(const std::string& text) {
  std::string s = text;
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  s = s.substr(b, e - b);
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  if (s.empty()) return std::nullopt;
  std::string lower;
  for (char c : s) lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  const std::string bare = lower[0] == '+' || lower[0] == '-' ? lower.substr(1) : lower;
  if (bare == "inf" || bare == "infinity") return lower[0] == '-' ? -INFINITY : INFINITY;
  if (bare == "nan") return NAN;
  for (char c : bare) {
    if (!std::isdigit(static_cast<unsigned char>(c)) && c != '.' && c != 'e' && c != '+' && c != '-') {
      return std::nullopt;
    }
  }
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  if (*end != '\0') return std::nullopt;
  return d;
}

// Python round(x, n) for floats: correctly rounded, ties to even (glibc's printf rounds so).
double PyRound(double x, int64_t ndigits) {
  if (!std::isfinite(x)) return x;
  if (ndigits > 300) return x;
  if (ndigits < -300) return 0.0 * x;
  if (ndigits >= 0) {
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(ndigits), x);
    return std::strtod(buf, nullptr);
  }
  const double p = std::pow(10.0, static_cast<double>(-ndigits));
  return std::nearbyint(x / p) * p;
}

bool IsLowerStr(const std::string& s) {
  bool cased = false;
  for (char32_t c : DecodeUtf8(s)) {
    if (u_isUUppercase(static_cast<UChar32>(c)) || u_istitle(static_cast<UChar32>(c))) return false;
    if (u_isULowercase(static_cast<UChar32>(c))) cased = true;
  }
  return cased;
}

bool IsUpperStr(const std::string& s) {
  bool cased = false;
  for (char32_t c : DecodeUtf8(s)) {
    if (u_isULowercase(static_cast<UChar32>(c)) || u_istitle(static_cast<UChar32>(c))) return false;
    if (u_isUUppercase(static_cast<UChar32>(c))) cased = true;
  }
  return cased;
}

}  // namespace tandem::jinja
