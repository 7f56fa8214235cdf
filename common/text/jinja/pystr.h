// Python's str semantics the built-ins need (common/text/jinja): case mapping with Unicode's
// full mappings (ICU), strip/split/splitlines on Python's whitespace, replace, % and str.format
// formatting, int()/float() parsing and round(). Internal to common/text/jinja.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/text/jinja/value.h"

namespace tandem::jinja {

class Interpreter;

enum class CaseMap { kUpper, kLower, kTitleOne };
// str.upper() / str.lower() / title-casing of one character, with full case mappings.
std::string MapCase(const std::string& s, CaseMap map);
std::string PyTitle(const std::string& s);       // str.title()
std::string PyCapitalize(const std::string& s);  // str.capitalize()
std::string JinjaTitle(const std::string& s);    // jinja2's title filter
// str.strip/lstrip/rstrip(chars); chars null or None = whitespace.
std::string PyStrip(const std::string& s, const Value* chars, bool left, bool right);
// str.split / str.rsplit(sep, maxsplit); sep null or None = runs of whitespace.
std::vector<Value> PySplit(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right);
std::vector<std::string> PySplitLines(const std::string& s);  // str.splitlines()
std::string PyReplace(Interpreter& in, const std::string& s, const std::string& old,
                      const std::string& repl, int64_t count);
std::string HtmlEscape(const std::string& s);
// An int (or bool) argument, else a type error naming `what`.
int64_t ToIndex(const Value& v, const char* what);
const std::string& NeedString(const Value& v, const char* what);
// `fmt % args` (%s %r %d %i %x %f %% and %(name)s) and str.format ({} {0} {name}, !s !r).
std::string PercentFormat(Interpreter& in, const std::string& fmt, const Value& args);
std::string BraceFormat(Interpreter& in, const std::string& fmt, const CallArgs& args);
std::optional<int64_t> ParsePyInt(const std::string& text, int base);  // int(text, base)
std::optional<double> ParsePyFloat(const std::string& text);           // float(text)
double PyRound(double x, int64_t ndigits);                             // round(x, ndigits)
bool IsLowerStr(const std::string& s);  // str.islower()
bool IsUpperStr(const std::string& s);  // str.isupper()

}  // namespace tandem::jinja
