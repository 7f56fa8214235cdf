// The filters and tests, as jinja2 3.1 computes them. Lists where jinja2 returns a generator
// (map, select, reject, reverse, unique, batch): they iterate the same, and print as lists.
//
// Filters: abs, attr, batch, capitalize, center, count, d, default, dictsort, e, escape, first,
// float, forceescape, format, indent, int, items, join, last, length, list, lower, map, max,
// min, reject, rejectattr, replace, reverse, round, safe, select, selectattr, sort, string,
// sum, title, tojson (transformers': ensure_ascii=False, indent, separators, sort_keys), trim,
// unique, upper, wordcount.
// Tests: boolean, callable, defined, divisibleby, eq/equalto/==, escaped, even, false, filter,
// float, ge/>=, gt/greaterthan/>, in, integer, iterable, le/<=, lower, lt/lessthan/<, mapping,
// ne/!=, none, number, odd, sameas, sequence, string, test, true, undefined, upper.
#include <unicode/uchar.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "common/text/jinja/interpreter.h"
#include "common/text/jinja/pystr.h"

namespace tandem::jinja {
namespace {

// An attribute path "a.b.0" as jinja2's make_attrgetter resolves it.
Value GetAttrPath(Interpreter& in, const Value& item, const Value& path) {
  if (path.is_int()) return in.GetItem(item, path);
  const std::string& p = NeedString(path, "attribute");
  Value v = item;
  size_t start = 0;
  while (true) {
    const size_t dot = p.find('.', start);
    const std::string part = p.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!part.empty() && std::all_of(part.begin(), part.end(), ::isdigit) && part.size() < 18) {
      v = in.GetItem(v, Value::Int(std::stoll(part)));
    } else {
      v = in.GetItem(v, Value::String(part));
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return v;
}

Value SortKey(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::String(MapCase(v.str(), CaseMap::kLower));
  return v;
}

std::vector<Value> SortValues(Interpreter& in, std::vector<Value> items, bool reverse,
                              bool case_sensitive, const std::optional<Value>& attribute) {
  std::vector<std::pair<Value, Value>> keyed;
  for (Value& v : items) {
    Value key = attribute && !attribute->is_none() ? GetAttrPath(in, v, *attribute) : v;
    keyed.emplace_back(SortKey(key, case_sensitive), std::move(v));
  }
  in.Charge(static_cast<int64_t>(keyed.size()) * 8);
  std::stable_sort(keyed.begin(), keyed.end(), [reverse](const auto& a, const auto& b) {
    return reverse ? Less(b.first, a.first) : Less(a.first, b.first);
  });
  std::vector<Value> out;
  for (auto& [k, v] : keyed) out.push_back(std::move(v));
  return out;
}

using Filter = std::function<Value(Interpreter&, const Value&, CallArgs&)>;

std::string JsonFilter(Interpreter& in, const Value& v, CallArgs& args) {
  auto a = BindArgs(args, {"ensure_ascii", "indent", "separators", "sort_keys"}, "tojson");
  JsonOptions o;
  if (a[0]) o.ensure_ascii = a[0]->Truthy();
  if (a[1] && !a[1]->is_none()) {
    if (a[1]->is_string()) {
      o.indent = a[1]->str();
    } else {
      const int64_t n = ToIndex(*a[1], "indent");
      o.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(n, 0, 64)), ' ');
    }
    o.item_separator = ",";
  }
  if (a[2] && !a[2]->is_none()) {
    if (!a[2]->is_sequence() || a[2]->items().size() != 2 || !a[2]->items()[0].is_string() ||
        !a[2]->items()[1].is_string()) {
      Fail("tojson separators must be a pair of strings");
    }
    o.item_separator = a[2]->items()[0].str();
    o.key_separator = a[2]->items()[1].str();
  }
  if (a[3]) o.sort_keys = a[3]->Truthy();
  std::string out = ToJson(v, o, in.limits().max_output_bytes);
  in.Charge(static_cast<int64_t>(out.size() / 64));
  return out;
}

int64_t Length(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined: return 0;
    case Kind::kString: return static_cast<int64_t>(CodePointCount(v.str()));
    case Kind::kList:
    case Kind::kTuple: return static_cast<int64_t>(v.items().size());
    case Kind::kDict: return static_cast<int64_t>(v.dict().items.size());
    case Kind::kLoop: return static_cast<int64_t>(v.loop().items->items.size());
    case Kind::kNamespace: return static_cast<int64_t>(v.ns().attrs.items.size());
    default: Fail("object of type '" + v.TypeName() + "' has no len()");
  }
}

// select/reject/selectattr/rejectattr: keep items whose test (or truth) is `want`.
Value SelectFilter(Interpreter& in, const Value& v, CallArgs& args, bool want, bool by_attr) {
  std::vector<Value> pos = args.positional;
  std::optional<Value> attribute;
  if (by_attr) {
    if (pos.empty()) Fail("missing parameter for attribute name");
    attribute = pos[0];
    pos.erase(pos.begin());
  }
  std::string test;
  if (!pos.empty()) {
    test = NeedString(pos[0], "test name");
    pos.erase(pos.begin());
  }
  std::vector<Value> out;
  for (const Value& item : in.Iterate(v)) {
    in.Charge(1);
    Value subject = attribute ? GetAttrPath(in, item, *attribute) : item;
    bool ok;
    if (test.empty()) {
      ok = subject.Truthy();
    } else {
      CallArgs test_args;
      test_args.positional = pos;
      test_args.keywords = args.keywords;
      ok = in.ApplyTest(test, subject, test_args);
    }
    if (ok == want) out.push_back(item);
  }
  return Value::List(std::move(out));
}

// min/max: the first of the smallest / largest items.
Value Extreme(Interpreter& in, const Value& v, CallArgs& args, const char* which) {
  auto a = BindArgs(args, {"case_sensitive", "attribute"}, which);
  const bool is_max = std::string(which) == "max";
  std::optional<Value> best, best_key;
  for (const Value& item : in.Iterate(v)) {
    in.Charge(1);
    Value key = SortKey(a[1] && !a[1]->is_none() ? GetAttrPath(in, item, *a[1]) : item,
                        a[0] && a[0]->Truthy());
    if (!best || (is_max ? Less(*best_key, key) : Less(key, *best_key))) {
      best = item;
      best_key = key;
    }
  }
  if (!best) return Value::Undefined("No aggregated item, sequence was empty.");
  return *best;
}

// Filters abs .. format.
void AddFilters1(std::map<std::string, Filter>* filters) {
  filters->insert({      {"abs", [](Interpreter&, const Value& v, CallArgs&) {
         if (v.kind() == Kind::kFloat) return Value::Float(std::fabs(v.float_value()));
         if (!v.is_number()) {
           if (v.is_undefined()) FailUndefined(v);
           Fail("bad operand type for abs(): '" + v.TypeName() + "'");
         }
         if (v.int_value() == INT64_MIN) Fail("integer overflow");
         return Value::Int(std::llabs(v.int_value()));
       }},
      {"attr", [](Interpreter& in, const Value& v, CallArgs& args) {
         auto a = BindArgs(args, {"name"}, "attr");
         if (!a[0]) Fail("attr() missing the attribute name");
         return in.GetAttr(v, NeedString(*a[0], "attribute name"));
       }},
      {"batch", [](Interpreter& in, const Value& v, CallArgs& args) {
         auto a = BindArgs(args, {"linecount", "fill_with"}, "batch");
         if (!a[0]) Fail("batch() missing linecount");
         const int64_t n = ToIndex(*a[0], "linecount");
         if (n <= 0) Fail("batch linecount must be positive");
         std::vector<Value> out, cur;
         for (const Value& item : in.Iterate(v)) {
           cur.push_back(item);
           if (static_cast<int64_t>(cur.size()) == n) {
             out.push_back(Value::List(std::move(cur)));
             cur.clear();
           }
         }
         if (!cur.empty()) {
           if (a[1] && !a[1]->is_none()) {
             while (static_cast<int64_t>(cur.size()) < n) cur.push_back(*a[1]);
           }
           out.push_back(Value::List(std::move(cur)));
         }
         return Value::List(std::move(out));
       }},
      {"capitalize", [](Interpreter& in, const Value& v, CallArgs&) {
         return Value::String(PyCapitalize(in.Str(v)));
       }},
      {"center", [](Interpreter& in, const Value& v, CallArgs& args) {
         auto a = BindArgs(args, {"width"}, "center");
         const std::string s = in.Str(v);
         const int64_t width = a[0] ? ToIndex(*a[0], "width") : 80;
         const int64_t len = static_cast<int64_t>(CodePointCount(s));
         if (width <= len) return Value::String(s);
         in.CheckSize(static_cast<size_t>(width - len) + s.size());
         const int64_t marg = width - len;
         const int64_t left = marg / 2 + (marg & width & 1);
         return Value::String(std::string(static_cast<size_t>(left), ' ') + s +
                              std::string(static_cast<size_t>(marg - left), ' '));
       }},
      {"default", [](Interpreter&, const Value& v, CallArgs& args) {
         auto a = BindArgs(args, {"default_value", "boolean"}, "default");
         const bool boolean = a[1] && a[1]->Truthy();
         if (v.is_undefined() || (boolean && !v.Truthy())) {
           return a[0] ? *a[0] : Value::String("");
         }
         return v;
       }},
      {"dictsort", [](Interpreter& in, const Value& v, CallArgs& args) {
         auto a = BindArgs(args, {"case_sensitive", "by", "reverse"}, "dictsort");
         if (!v.is_dict()) Fail("dictsort needs a dict, not " + v.TypeName());
         const bool by_value = a[1] && a[1]->is_string() && a[1]->str() == "value";
         if (a[1] && !(a[1]->is_string() && (a[1]->str() == "key" || a[1]->str() == "value"))) {
           Fail("You can only sort by either \"key\" or \"value\"");
         }
         std::vector<Value> pairs;
         for (const auto& [k, val] : v.dict().items) pairs.push_back(Value::Tuple({k, val}));
         return Value::List(SortValues(in, std::move(pairs), a[2] && a[2]->Truthy(),
                                       a[0] && a[0]->Truthy(), Value::Int(by_value ? 1 : 0)));
       }},
      {"escape", [](Interpreter& in, const Value& v, CallArgs&) {
         return Value::String(HtmlEscape(in.Str(v)));
       }},
      {"first", [](Interpreter& in, const Value& v, CallArgs&) {
         std::vector<Value> items = in.Iterate(v);
         if (items.empty()) return Value::Undefined("No first item, sequence was empty.");
         return items.front();
       }},
      {"float", [](Interpreter&, const Value& v, CallArgs& args) {
         auto a = BindArgs(args, {"default"}, "float");
         const Value dflt = a[0] ? *a[0] : Value::Float(0.0);
         if (v.is_number()) return Value::Float(v.float_value());
         if (v.is_string()) {
           std::optional<double> d = ParsePyFloat(v.str());
           return d ? Value::Float(*d) : dflt;
         }
         if (v.is_undefined()) FailUndefined(v);
         return dflt;
       }},
      {"format", [](Interpreter& in, const Value& v, CallArgs& args) {
         const std::string& fmt = NeedString(v, "format");
         if (!args.keywords.empty()) {
           std::vector<std::pair<Value, Value>> kw;
           for (const auto& [k, val] : args.keywords) kw.emplace_back(Value::String(k), val);
           return Value::String(PercentFormat(in, fmt, Value::Dict(std::move(kw))));
         }
         return Value::String(PercentFormat(in, fmt, Value::Tuple(args.positional)));
       }},
  });
}

// Filters indent .. lower.
void AddFilters2(std::map<std::string, Filter>* filters) {
  filters->insert({      {"indent", [](Interpreter& in, const Value& v, CallArgs& args) {
         auto a = BindArgs(args, {"width", "first", "blank"}, "indent");
         std::string indention = "    ";
         if (a[0]) {
           if (a[0]->is_string()) {
             indention = a[0]->str();
           } else {
             const int64_t w = ToIndex(*a[0], "width");
             in.CheckSize(static_cast<size_t>(std::max<int64_t>(w, 0)));
             indention = std::string(static_cast<size_t>(std::max<int64_t>(w, 0)), ' ');
           }
         }
         const std::string s = in.Str(v) + "\n";
         std::vector<std::string> lines = PySplitLines(s);
         std::string rv;
         if (a[2] && a[2]->Truthy()) {
           for (size_t i = 0; i < lines.size(); ++i) {
             if (i > 0) rv += "\n" + indention;
             rv += lines[i];
             in.CheckSize(rv.size());
           }
         } else {
           rv = lines.empty() ? "" : lines[0];
           for (size_t i = 1; i < lines.size(); ++i) {
             rv += "\n";
             if (!lines[i].empty()) rv += indention;
             rv += lines[i];
             in.CheckSize(rv.size());
           }
         }
         if (a[1] && a[1]->Truthy()) rv = indention + rv;
         in.CheckSize(rv.size());
         return Value::String(std::move(rv));
       }},
      {"int", [](Interpreter&, const Value& v, CallArgs& args) {
         auto a = BindArgs(args, {"default", "base"}, "int");
         const Value dflt = a[0] ? *a[0] : Value::Int(0);
         const int64_t base = a[1] ? ToIndex(*a[1], "base") : 10;
         if (v.kind() == Kind::kInt || v.kind() == Kind::kBool) return Value::Int(v.int_value());
         if (v.kind() == Kind::kFloat) {
           const double d = std::trunc(v.float_value());
           if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return dflt;
           return Value::Int(static_cast<int64_t>(d));
         }
         if (v.is_string()) {
           if (base >= 2 && base <= 36) {
             if (std::optional<int64_t> i = ParsePyInt(v.str(), static_cast<int>(base))) return Value::Int(*i);
           }
           std::optional<double> d = ParsePyFloat(v.str());
           if (d && std::isfinite(*d) && std::fabs(*d) < 9.2e18) return Value::Int(static_cast<int64_t>(std::trunc(*d)));
           return dflt;
         }
         if (v.is_undefined()) FailUndefined(v);
         return dflt;
       }},
      {"items", [](Interpreter&, const Value& v, CallArgs&) {
         if (v.is_undefined()) return Value::List({});
         if (!v.is_dict()) Fail("can only get item pairs from a mapping, not " + v.TypeName());
         std::vector<Value> out;
         for (const auto& [k, val] : v.dict().items) out.push_back(Value::Tuple({k, val}));
         return Value::List(std::move(out));
       }},
      {"join", [](Interpreter& in, const Value& v, CallArgs& args) {
         auto a = BindArgs(args, {"d", "attribute"}, "join");
         const std::string sep = a[0] ? in.Str(*a[0]) : "";
         std::string out;
         bool first = true;
         for (const Value& item : in.Iterate(v)) {
           if (!first) out += sep;
           first = false;
           out += in.Str(a[1] && !a[1]->is_none() ? GetAttrPath(in, item, *a[1]) : item);
           in.CheckSize(out.size());
         }
         in.Charge(static_cast<int64_t>(out.size() / 64));
         return Value::String(std::move(out));
       }},
      {"last", [](Interpreter& in, const Value& v, CallArgs&) {
         std::vector<Value> items = in.Iterate(v);
         if (items.empty()) return Value::Undefined("No last item, sequence was empty.");
         return items.back();
       }},
      {"length", [](Interpreter&, const Value& v, CallArgs&) { return Value::Int(Length(v)); }},
      {"list", [](Interpreter& in, const Value& v, CallArgs&) { return Value::List(in.Iterate(v)); }},
      {"lower", [](Interpreter& in, const Value& v, CallArgs&) {
         return Value::String(MapCase(in.Str(v), CaseMap::kLower));
       }},
  });
}

// Filters map .. tojson.
void AddFilters3(std::map<std::string, Filter>* filters) {
  filters->insert({      {"map", [](Interpreter& in, const Value& v, CallArgs& args) {
         std::vector<Value> out;
         std::optional<Value> attribute, dflt;
         for (const auto& [k, val] : args.keywords) {
           if (k == "attribute") attribute = val;
           else if (k == "default") dflt = val;
         }
         if (attribute) {
           for (const Value& item : in.Iterate(v)) {
             Value got = GetAttrPath(in, item, *attribute);
             out.push_back(got.is_undefined() && dflt ? *dflt : got);
           }
           return Value::List(std::move(out));
         }
         if (args.positional.empty()) Fail("map requires a filter argument");
         const std::string name = NeedString(args.positional[0], "filter name");
         CallArgs rest;
         rest.positional.assign(args.positional.begin() + 1, args.positional.end());
         rest.keywords = args.keywords;
         for (const Value& item : in.Iterate(v)) {
           CallArgs copy = rest;
           out.push_back(in.ApplyFilter(name, item, copy));
         }
         return Value::List(std::move(out));
       }},
      {"max", [](Interpreter& in, const Value& v, CallArgs& args) {
         return Extreme(in, v, args, "max");
       }},
      {"min", [](Interpreter& in, const Value& v, CallArgs& args) {
         return Extreme(in, v, args, "min");
       }},
      {"reject", [](Interpreter& in, const Value& v, CallArgs& args) {
         return SelectFilter(in, v, args, false, false);
       }},
      {"rejectattr", [](Interpreter& in, const Value& v, CallArgs& args) {
         return SelectFilter(in, v, args, false, true);
       }},
      {"replace", [](Interpreter& in, const Value& v, CallArgs& args) {
         auto a = BindArgs(args, {"old", "new", "count"}, "replace");
         if (!a[0] || !a[1]) Fail("replace() needs old and new");
         const int64_t count = a[2] && !a[2]->is_none() ? ToIndex(*a[2], "count") : -1;
         return Value::String(PyReplace(in, in.Str(v), in.Str(*a[0]), in.Str(*a[1]), count));
       }},
      {"reverse", [](Interpreter& in, const Value& v, CallArgs&) {
         if (v.is_string()) {
           std::u32string cps = DecodeUtf8(v.str());
           std::reverse(cps.begin(), cps.end());
           return Value::String(EncodeUtf8(cps));
         }
         std::vector<Value> items = in.Iterate(v);
         std::reverse(items.begin(), items.end());
         return Value::List(std::move(items));
       }},
      {"round", [](Interpreter&, const Value& v, CallArgs& args) {
         auto a = BindArgs(args, {"precision", "method"}, "round");
         const int64_t precision = a[0] ? ToIndex(*a[0], "precision") : 0;
         const std::string method = a[1] ? NeedString(*a[1], "method") : "common";
         if (method != "common" && method != "ceil" && method != "floor") {
           Fail("method must be 'common', 'ceil' or 'floor'");
         }
         if (v.is_undefined()) FailUndefined(v);
         if (!v.is_number()) Fail("type " + v.TypeName() + " doesn't define __round__ method");
         if (method == "common") {
           if (v.kind() != Kind::kFloat) return Value::Int(v.int_value());
           return Value::Float(PyRound(v.float_value(), precision));
         }
         const double p = std::pow(10.0, static_cast<double>(std::clamp<int64_t>(precision, -300, 300)));
         const double x = v.float_value() * p;
         return Value::Float((method == "ceil" ? std::ceil(x) : std::floor(x)) / p);
       }},
      {"safe", [](Interpreter&, const Value& v, CallArgs&) { return v; }},
      {"select", [](Interpreter& in, const Value& v, CallArgs& args) {
         return SelectFilter(in, v, args, true, false);
       }},
      {"selectattr", [](Interpreter& in, const Value& v, CallArgs& args) {
         return SelectFilter(in, v, args, true, true);
       }},
      {"sort", [](Interpreter& in, const Value& v, CallArgs& args) {
         auto a = BindArgs(args, {"reverse", "case_sensitive", "attribute"}, "sort");
         return Value::List(SortValues(in, in.Iterate(v), a[0] && a[0]->Truthy(),
                                       a[1] && a[1]->Truthy(), a[2]));
       }},
      {"string", [](Interpreter& in, const Value& v, CallArgs&) { return Value::String(in.Str(v)); }},
      {"sum", [](Interpreter& in, const Value& v, CallArgs& args) {
         auto a = BindArgs(args, {"attribute", "start"}, "sum");
         Value total = a[1] ? *a[1] : Value::Int(0);
         for (const Value& item : in.Iterate(v)) {
           total = Interpreter::BinaryOp(in, "+", total,
                                         a[0] && !a[0]->is_none() ? GetAttrPath(in, item, *a[0]) : item);
         }
         return total;
       }},
      {"title", [](Interpreter& in, const Value& v, CallArgs&) {
         return Value::String(JinjaTitle(in.Str(v)));
       }},
      {"tojson", [](Interpreter& in, const Value& v, CallArgs& args) {
         return Value::String(JsonFilter(in, v, args));
       }},
  });
}

// Filters trim .. wordcount.
void AddFilters4(std::map<std::string, Filter>* filters) {
  filters->insert({      {"trim", [](Interpreter& in, const Value& v, CallArgs& args) {
         auto a = BindArgs(args, {"chars"}, "trim");
         return Value::String(PyStrip(in.Str(v), a[0] ? &*a[0] : nullptr, true, true));
       }},
      {"unique", [](Interpreter& in, const Value& v, CallArgs& args) {
         auto a = BindArgs(args, {"case_sensitive", "attribute"}, "unique");
         std::vector<Value> seen, out;
         for (const Value& item : in.Iterate(v)) {
           Value key = SortKey(a[1] && !a[1]->is_none() ? GetAttrPath(in, item, *a[1]) : item,
                               a[0] && a[0]->Truthy());
           if (key.kind() == Kind::kList || key.kind() == Kind::kDict) {
             Fail("unhashable type: '" + key.TypeName() + "'");
           }
           in.Charge(static_cast<int64_t>(seen.size()));
           if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return Equal(s, key); })) {
             seen.push_back(key);
             out.push_back(item);
           }
         }
         return Value::List(std::move(out));
       }},
      {"upper", [](Interpreter& in, const Value& v, CallArgs&) {
         return Value::String(MapCase(in.Str(v), CaseMap::kUpper));
       }},
      {"wordcount", [](Interpreter& in, const Value& v, CallArgs&) {
         int64_t words = 0;
         bool in_word = false;
         for (char32_t c : DecodeUtf8(in.Str(v))) {
           const bool w = c == '_' || u_isalnum(static_cast<UChar32>(c));
           if (w && !in_word) ++words;
           in_word = w;
         }
         return Value::Int(words);
       }},

  });
}

const std::map<std::string, Filter>& Filters() {
  static const auto* filters = [] {
    auto* m = new std::map<std::string, Filter>;
    AddFilters1(m);
    AddFilters2(m);
    AddFilters3(m);
    AddFilters4(m);
    return m;
  }();
  return *filters;
}

}  // namespace

Value Interpreter::ApplyFilter(const std::string& name, const Value& subject, CallArgs& args) {
  Charge(1);
  ChargeFor(subject);
  std::string key = name == "d" ? "default" : name == "e" || name == "forceescape" ? "escape"
                    : name == "count" ? "length" : name;
  auto it = Filters().find(key);
  if (it == Filters().end()) Fail("no filter named '" + name + "'");
  return it->second(*this, subject, args);
}

bool Interpreter::ApplyTest(const std::string& name, const Value& v, CallArgs& args) {
  Charge(1);
  ChargeFor(v);
  for (const Value& a : args.positional) ChargeFor(a);
  auto arg = [&](const char* what) -> Value {
    auto a = BindArgs(args, {what}, name);
    if (!a[0]) Fail("test '" + name + "' needs an argument");
    return *a[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.kind() == Kind::kBool;
  if (name == "true") return v.kind() == Kind::kBool && v.bool_value();
  if (name == "false") return v.kind() == Kind::kBool && !v.bool_value();
  if (name == "integer") return v.kind() == Kind::kInt;
  if (name == "float") return v.kind() == Kind::kFloat;
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") {
    return v.is_string() || v.is_sequence() || v.is_dict() || v.is_undefined() ||
           v.kind() == Kind::kLoop;
  }
  if (name == "sequence") return v.is_string() || v.is_sequence() || v.is_dict() || v.is_undefined();
  if (name == "callable") return v.kind() == Kind::kCallable;
  if (name == "escaped") return false;
  if (name == "even" || name == "odd") {
    if (v.is_undefined()) FailUndefined(v);
    if (v.kind() == Kind::kFloat) {
      const double r = std::fmod(v.float_value(), 2.0);
      return name == "even" ? r == 0 : std::fabs(r) == 1;
    }
    if (!v.is_number()) Fail("not all arguments converted during string formatting");
    const bool even = v.int_value() % 2 == 0;
    return name == "even" ? even : !even;
  }
  if (name == "divisibleby") {
    Value n = arg("num");
    if (!v.is_number() || !n.is_number()) {
      if (v.is_undefined()) FailUndefined(v);
      Fail("divisibleby needs numbers");
    }
    if (v.kind() == Kind::kFloat || n.kind() == Kind::kFloat) {
      if (n.float_value() == 0) Fail("float modulo");
      return std::fmod(v.float_value(), n.float_value()) == 0;
    }
    if (n.int_value() == 0) Fail("integer division or modulo by zero");
    if (n.int_value() == -1) return true;
    return v.int_value() % n.int_value() == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return Equal(v, arg("other"));
  if (name == "ne" || name == "!=") return !Equal(v, arg("other"));
  if (name == "lt" || name == "lessthan" || name == "<") return Less(v, arg("other"));
  if (name == "le" || name == "<=") {
    Value o = arg("other");
    return Less(v, o) || Equal(v, o);
  }
  if (name == "gt" || name == "greaterthan" || name == ">") return Less(arg("other"), v);
  if (name == "ge" || name == ">=") {
    Value o = arg("other");
    return Less(o, v) || Equal(v, o);
  }
  if (name == "in") return Contains(arg("seq"), v);
  if (name == "sameas") {
    // Python's `is`: singletons and small ints by value, containers by identity.
    Value o = arg("other");
    if (v.kind() != o.kind()) return false;
    switch (v.kind()) {
      case Kind::kNone:
      case Kind::kUndefined: return true;
      case Kind::kBool: return v.bool_value() == o.bool_value();
      case Kind::kInt: return v.int_value() == o.int_value() && v.int_value() >= -5 && v.int_value() <= 256;
      case Kind::kList:
      case Kind::kTuple: return v.list_data() == o.list_data();
      case Kind::kNamespace:
      case Kind::kCallable:
      case Kind::kLoop: return Equal(v, o);
      default: return false;
    }
  }
  if (name == "lower") return IsLowerStr(Str(v));
  if (name == "upper") return IsUpperStr(Str(v));
  if (name == "filter") {
    Value n = arg("value");
    return n.is_string() && Filters().count(n.str() == "d" ? "default" : n.str()) > 0;
  }
  if (name == "test") {
    static const char* const kTests[] = {
        "defined", "undefined", "none", "boolean", "true", "false", "integer", "float", "number",
        "string", "mapping", "iterable", "sequence", "callable", "escaped", "even", "odd",
        "divisibleby", "eq", "equalto", "ne", "lt", "lessthan", "le", "gt", "greaterthan", "ge",
        "in", "sameas", "lower", "upper", "filter", "test", "==", "!=", "<", "<=", ">", ">="};
    Value n = arg("value");
    return n.is_string() &&
           std::any_of(std::begin(kTests), std::end(kTests), [&](const char* t) { return n.str() == t; });
  }
  Fail("no test named '" + name + "'");
}

}  // namespace tandem::jinja
