#include "common/text/jinja/value.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace tandem::jinja {

void Fail(std::string message) { throw Error(Error::Kind::kRuntime, std::move(message)); }

namespace {

[[noreturn]] void FailLimit(size_t limit) {
  throw Error(Error::Kind::kLimit,
              "a value would exceed the template's size limit of " + std::to_string(limit) + " bytes");
}

void CheckSize(const std::string& out, size_t limit) {
  if (out.size() > limit) FailLimit(limit);
}

int DepthOf(const std::vector<Value>& items) {
  int depth = 0;
  for (const Value& v : items) depth = std::max(depth, v.depth());
  if (depth + 1 > kMaxValueDepth) {
    Fail("a list or dict nests deeper than " + std::to_string(kMaxValueDepth) + " levels");
  }
  return depth + 1;
}

// Python's hashability: what a dict key may be.
void CheckHashable(const Value& key) {
  switch (key.kind()) {
    case Kind::kList: Fail("unhashable type: 'list'");
    case Kind::kDict: Fail("unhashable type: 'dict'");
    case Kind::kTuple:
      for (const Value& v : key.items()) CheckHashable(v);
      return;
    default: return;
  }
}

}  // namespace

// ---- UTF-8 ---------------------------------------------------------------------------------

std::u32string DecodeUtf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    char32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    bool ok = len > 0 && i + len <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc >> 6) != 2) ok = false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (ok && ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
               cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))) {
      ok = false;
    }
    if (!ok) {
      out.push_back(0xfffd);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += len;
  }
  return out;
}

void AppendUtf8(std::string* out, char32_t c) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xc0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3f)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xe0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3f)));
  } else {
    out->push_back(static_cast<char>(0xf0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3f)));
  }
}

std::string EncodeUtf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) AppendUtf8(&out, c);
  return out;
}

size_t CodePointCount(std::string_view s) {
  bool ascii = std::all_of(s.begin(), s.end(), [](char c) { return (c & 0x80) == 0; });
  return ascii ? s.size() : DecodeUtf8(s).size();
}

bool IsPythonSpace(char32_t c) {
  switch (c) {
    case 0x09: case 0x0a: case 0x0b: case 0x0c: case 0x0d: case 0x1c: case 0x1d: case 0x1e:
    case 0x1f: case 0x20: case 0x85: case 0xa0: case 0x1680: case 0x2028: case 0x2029:
    case 0x202f: case 0x205f: case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200a;
  }
}

// ---- construction --------------------------------------------------------------------------

const std::shared_ptr<const std::string>& Value::EmptyString() {
  static const auto* empty = new std::shared_ptr<const std::string>(std::make_shared<std::string>());
  return *empty;
}

Value Value::Undefined(std::string hint) {
  Value v;
  if (!hint.empty()) v.s_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}

Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}

Value Value::Float(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = d;
  return v;
}

Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  if (!s.empty()) v.s_ = std::make_shared<const std::string>(std::move(s));
  return v;
}

Value Value::List(std::vector<Value> items) {
  Value v;
  v.kind_ = Kind::kList;
  auto data = std::make_shared<ListData>();
  data->depth = DepthOf(items);
  data->items = std::move(items);
  v.list_ = std::move(data);
  return v;
}

Value Value::Tuple(std::vector<Value> items) {
  Value v = List(std::move(items));
  v.kind_ = Kind::kTuple;
  return v;
}

Value Value::Dict(std::vector<std::pair<Value, Value>> items) {
  Value v;
  v.kind_ = Kind::kDict;
  auto data = std::make_shared<DictData>();
  int depth = 0;
  for (auto& [key, value] : items) {
    CheckHashable(key);
    depth = std::max({depth, key.depth(), value.depth()});
    bool replaced = false;
    for (auto& existing : data->items) {
      if (Equal(existing.first, key)) {
        existing.second = std::move(value);
        replaced = true;
        break;
      }
    }
    if (!replaced) data->items.emplace_back(std::move(key), std::move(value));
  }
  if (depth + 1 > kMaxValueDepth) {
    Fail("a list or dict nests deeper than " + std::to_string(kMaxValueDepth) + " levels");
  }
  data->depth = depth + 1;
  v.dict_ = std::move(data);
  return v;
}

Value Value::Namespace(std::shared_ptr<NamespaceData> ns) {
  Value v;
  v.kind_ = Kind::kNamespace;
  v.ns_ = std::move(ns);
  return v;
}

Value Value::Callable(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.callable_ = std::make_shared<const CallableData>(CallableData{std::move(name), std::move(fn)});
  return v;
}

Value Value::Loop(std::shared_ptr<LoopData> loop) {
  Value v;
  v.kind_ = Kind::kLoop;
  v.loop_ = std::move(loop);
  return v;
}

namespace {

template <typename Json>
StatusOr<Value> FromJsonAt(const Json& json, int depth) {
  if (depth > kMaxValueDepth) {
    return InvalidArgument("JSON nests deeper than " + std::to_string(kMaxValueDepth) + " levels");
  }
  switch (json.type()) {
    case nlohmann::json::value_t::null: return Value::None();
    case nlohmann::json::value_t::boolean: return Value::Bool(json.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value::Int(json.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const uint64_t u = json.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::Float(static_cast<double>(u));
      return Value::Int(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float: return Value::Float(json.template get<double>());
    case nlohmann::json::value_t::string: return Value::String(json.template get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(json.size());
      for (const auto& item : json) {
        TANDEM_ASSIGN_OR_RETURN(Value v, FromJsonAt(item, depth + 1));
        items.push_back(std::move(v));
      }
      return Value::List(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      std::vector<std::pair<Value, Value>> items;
      items.reserve(json.size());
      for (auto it = json.begin(); it != json.end(); ++it) {
        TANDEM_ASSIGN_OR_RETURN(Value v, FromJsonAt(it.value(), depth + 1));
        items.emplace_back(Value::String(it.key()), std::move(v));
      }
      return Value::Dict(std::move(items));
    }
    default: return InvalidArgument("JSON value of an unsupported type");
  }
}

}  // namespace

StatusOr<Value> Value::FromJson(const nlohmann::json& json) {
  try {
    return FromJsonAt(json, 1);
  } catch (const Error& e) {
    return InvalidArgument(e.what());
  }
}

StatusOr<Value> Value::FromJson(const nlohmann::ordered_json& json) {
  try {
    return FromJsonAt(json, 1);
  } catch (const Error& e) {
    return InvalidArgument(e.what());
  }
}

const Value* DictData::Find(const Value& key) const {
  for (const auto& [k, v] : items) {
    if (Equal(k, key)) return &v;
  }
  return nullptr;
}

int Value::depth() const {
  if (kind_ == Kind::kList || kind_ == Kind::kTuple) return list_->depth;
  if (kind_ == Kind::kDict) return dict_->depth;
  return 0;
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return b_;
    case Kind::kInt: return i_ != 0;
    case Kind::kFloat: return f_ != 0;
    case Kind::kString: return !s_->empty();
    case Kind::kList:
    case Kind::kTuple: return !list_->items.empty();
    case Kind::kDict: return !dict_->items.empty();
    default: return true;
  }
}

std::string Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return "list";
    case Kind::kTuple: return "tuple";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kCallable: return "function";
    case Kind::kLoop: return "LoopContext";
  }
  return "object";
}

// ---- printing ------------------------------------------------------------------------------

namespace {

// repr(float) as Python prints it: the shortest digits that round-trip, fixed notation for
// decimal exponents in (-4, 16], else d.ddde+XX.
std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e_pos = sci.find('e');
  std::string digits = sci.substr(0, e_pos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  const int decpt = exponent + 1;
  std::string out = sign;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(-decpt, '0') + digits;
    } else if (decpt >= static_cast<int>(digits.size())) {
      out += digits + std::string(decpt - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, decpt) + "." + digits.substr(decpt);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp[16];
  std::snprintf(exp, sizeof(exp), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exp;
}

bool IsPrintable(char32_t c) {
  if (c == ' ') return true;
  switch (u_charType(static_cast<UChar32>(c))) {
    case U_CONTROL_CHAR:
    case U_FORMAT_CHAR:
    case U_SURROGATE:
    case U_PRIVATE_USE_CHAR:
    case U_UNASSIGNED:
    case U_LINE_SEPARATOR:
    case U_PARAGRAPH_SEPARATOR:
    case U_SPACE_SEPARATOR: return false;
    default: return true;
  }
}

void AppendStringRepr(std::string* out, const std::string& s, size_t limit) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  out->push_back(quote);
  for (char32_t c : DecodeUtf8(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(c));
    } else if (c == '\t') {
      *out += "\\t";
    } else if (c == '\n') {
      *out += "\\n";
    } else if (c == '\r') {
      *out += "\\r";
    } else if (c < 0x80 ? (c < 0x20 || c == 0x7f) : !IsPrintable(c)) {
      char buf[16];
      if (c < 0x100) std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
      else if (c < 0x10000) std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      else std::snprintf(buf, sizeof(buf), "\\U%08x", static_cast<unsigned>(c));
      *out += buf;
    } else {
      AppendUtf8(out, c);
    }
  }
  out->push_back(quote);
  CheckSize(*out, limit);
}

void AppendRepr(std::string* out, const Value& v, size_t limit, int depth);

void AppendDictRepr(std::string* out, const DictData& d, size_t limit, int depth) {
  out->push_back('{');
  bool first = true;
  for (const auto& [k, val] : d.items) {
    if (!first) *out += ", ";
    first = false;
    AppendRepr(out, k, limit, depth + 1);
    *out += ": ";
    AppendRepr(out, val, limit, depth + 1);
  }
  out->push_back('}');
}

void AppendRepr(std::string* out, const Value& v, size_t limit, int depth) {
  // Namespaces may hold themselves or long chains of each other: bound the recursion.
  if (depth > kMaxValueDepth) Fail("a value nests too deeply to print");
  switch (v.kind()) {
    case Kind::kString: AppendStringRepr(out, v.str(), limit); break;
    case Kind::kList:
    case Kind::kTuple: {
      const bool tuple = v.kind() == Kind::kTuple;
      out->push_back(tuple ? '(' : '[');
      for (size_t i = 0; i < v.items().size(); ++i) {
        if (i > 0) *out += ", ";
        AppendRepr(out, v.items()[i], limit, depth + 1);
      }
      if (tuple && v.items().size() == 1) out->push_back(',');
      out->push_back(tuple ? ')' : ']');
      break;
    }
    case Kind::kDict: AppendDictRepr(out, v.dict(), limit, depth); break;
    case Kind::kUndefined: *out += "Undefined"; break;
    case Kind::kNamespace:
      *out += "<Namespace ";
      AppendDictRepr(out, v.ns().attrs, limit, depth);
      *out += ">";
      break;
    case Kind::kCallable: *out += "<function " + v.callable().name + ">"; break;
    case Kind::kLoop:
      *out += "<LoopContext " + std::to_string(v.loop().index0 + 1) + "/" +
              std::to_string(v.loop().items->items.size()) + ">";
      break;
    default: *out += v.Str(limit); break;
  }
  CheckSize(*out, limit);
}

}  // namespace

std::string Value::Str(size_t limit) const {
  switch (kind_) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return b_ ? "True" : "False";
    case Kind::kInt: return std::to_string(i_);
    case Kind::kFloat: return FloatRepr(f_);
    case Kind::kString: return *s_;
    default: return Repr(limit);
  }
}

std::string Value::Repr(size_t limit) const {
  std::string out;
  AppendRepr(&out, *this, limit, 0);
  return out;
}

// ---- comparison ----------------------------------------------------------------------------

bool Equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Kind::kFloat || b.kind() == Kind::kFloat) {
      return a.float_value() == b.float_value();
    }
    return a.int_value() == b.int_value();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return a.str() == b.str();
    case Kind::kList:
    case Kind::kTuple: {
      if (a.list_data() == b.list_data()) return true;
      if (a.items().size() != b.items().size()) return false;
      for (size_t i = 0; i < a.items().size(); ++i) {
        if (!Equal(a.items()[i], b.items()[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      if (a.dict().items.size() != b.dict().items.size()) return false;
      for (const auto& [k, v] : a.dict().items) {
        const Value* other = b.dict().Find(k);
        if (other == nullptr || !Equal(v, *other)) return false;
      }
      return true;
    }
    case Kind::kNamespace: return &a.ns() == &b.ns();
    case Kind::kCallable: return &a.callable() == &b.callable();
    case Kind::kLoop: return &a.loop() == &b.loop();
    default: return false;
  }
}

bool Less(const Value& a, const Value& b) {
  if (a.is_undefined() || b.is_undefined()) {
    const Value& u = a.is_undefined() ? a : b;
    Fail(u.undefined_hint().empty() ? "a value is undefined" : u.undefined_hint());
  }
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Kind::kFloat || b.kind() == Kind::kFloat) {
      return a.float_value() < b.float_value();
    }
    return a.int_value() < b.int_value();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();  // UTF-8 order = code points
  if (a.kind() == b.kind() && a.is_sequence()) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!Equal(x[i], y[i])) return Less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  Fail("'<' not supported between instances of '" + a.TypeName() + "' and '" + b.TypeName() + "'");
}

// ---- arguments -----------------------------------------------------------------------------

std::vector<std::optional<Value>> BindArgs(const CallArgs& args,
                                           std::initializer_list<const char*> names,
                                           std::string_view what) {
  std::vector<std::optional<Value>> bound(names.size());
  if (args.positional.size() > names.size()) {
    Fail(std::string(what) + "() takes at most " + std::to_string(names.size()) +
         " arguments (" + std::to_string(args.positional.size()) + " given)");
  }
  for (size_t i = 0; i < args.positional.size(); ++i) bound[i] = args.positional[i];
  for (const auto& [name, value] : args.keywords) {
    size_t index = 0;
    for (const char* n : names) {
      if (name == n) break;
      ++index;
    }
    if (index == names.size()) {
      Fail(std::string(what) + "() got an unexpected keyword argument '" + name + "'");
    }
    if (bound[index]) {
      Fail(std::string(what) + "() got multiple values for argument '" + name + "'");
    }
    bound[index] = value;
  }
  return bound;
}

// ---- JSON ----------------------------------------------------------------------------------

namespace {

void AppendJsonString(std::string* out, const std::string& s, bool ensure_ascii) {
  out->push_back('"');
  auto hex4 = [out](unsigned c) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "\\u%04x", c);
    *out += buf;
  };
  for (char32_t c : DecodeUtf8(s)) {
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default:
        if (c < 0x20) {
          hex4(c);
        } else if (ensure_ascii && c >= 0x80) {
          if (c >= 0x10000) {
            const unsigned v = c - 0x10000;
            hex4(0xd800 | (v >> 10));
            hex4(0xdc00 | (v & 0x3ff));
          } else {
            hex4(c);
          }
        } else {
          AppendUtf8(out, c);
        }
    }
  }
  out->push_back('"');
}

void AppendJson(std::string* out, const Value& v, const JsonOptions& o, int level, size_t limit);

void NewlineIndent(std::string* out, const JsonOptions& o, int level) {
  out->push_back('\n');
  for (int i = 0; i < level; ++i) *out += *o.indent;
}

// A dict key as json.dumps converts it: strings as they are; numbers, bools and None printed.
std::string JsonKey(const Value& k) {
  switch (k.kind()) {
    case Kind::kString: return k.str();
    case Kind::kBool: return k.bool_value() ? "true" : "false";
    case Kind::kNone: return "null";
    case Kind::kInt: return std::to_string(k.int_value());
    case Kind::kFloat: {
      const double d = k.float_value();
      if (std::isnan(d)) return "NaN";
      if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
      return FloatRepr(d);
    }
    default: Fail("keys must be str, int, float, bool or None, not " + k.TypeName());
  }
}

void AppendJson(std::string* out, const Value& v, const JsonOptions& o, int level, size_t limit) {
  switch (v.kind()) {
    case Kind::kNone: *out += "null"; break;
    case Kind::kBool: *out += v.bool_value() ? "true" : "false"; break;
    case Kind::kInt: *out += std::to_string(v.int_value()); break;
    case Kind::kFloat: {
      const double d = v.float_value();
      if (std::isnan(d)) *out += "NaN";
      else if (std::isinf(d)) *out += d > 0 ? "Infinity" : "-Infinity";
      else *out += FloatRepr(d);
      break;
    }
    case Kind::kString: AppendJsonString(out, v.str(), o.ensure_ascii); break;
    case Kind::kList:
    case Kind::kTuple: {
      if (v.items().empty()) {
        *out += "[]";
        break;
      }
      out->push_back('[');
      for (size_t i = 0; i < v.items().size(); ++i) {
        if (i > 0) *out += o.item_separator;
        if (o.indent) NewlineIndent(out, o, level + 1);
        AppendJson(out, v.items()[i], o, level + 1, limit);
      }
      if (o.indent) NewlineIndent(out, o, level);
      out->push_back(']');
      break;
    }
    case Kind::kDict: {
      if (v.dict().items.empty()) {
        *out += "{}";
        break;
      }
      std::vector<std::pair<std::string, const Value*>> entries;
      for (const auto& [k, val] : v.dict().items) entries.emplace_back(JsonKey(k), &val);
      if (o.sort_keys) {
        for (const auto& [k, val] : v.dict().items) {
          if (!k.is_string()) Fail("'<' not supported between dict keys that are not all str");
        }
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      out->push_back('{');
      bool first = true;
      for (const auto& [key, val] : entries) {
        if (!first) *out += o.item_separator;
        first = false;
        if (o.indent) NewlineIndent(out, o, level + 1);
        AppendJsonString(out, key, o.ensure_ascii);
        *out += o.key_separator;
        AppendJson(out, *val, o, level + 1, limit);
      }
      if (o.indent) NewlineIndent(out, o, level);
      out->push_back('}');
      break;
    }
    default:
      Fail("Object of type " + v.TypeName() + " is not JSON serializable");
  }
  CheckSize(*out, limit);
}

}  // namespace

std::string ToJson(const Value& value, const JsonOptions& options, size_t limit) {
  std::string out;
  AppendJson(&out, value, options, 0, limit);
  return out;
}

}  // namespace tandem::jinja
