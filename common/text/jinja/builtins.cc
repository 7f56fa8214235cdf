// String, dict and list methods, the operators and the global functions, as Python and
// jinja2's sandbox compute them.
//
// String methods: capitalize, count, endswith, find, format, index, isalnum, isalpha, isdigit,
// islower, isspace, isupper, join, lower, lstrip, removeprefix, removesuffix, replace, rfind,
// rsplit, rstrip, split, splitlines, startswith, strip, title, upper. Dict methods: get, items,
// keys, values (items/keys/values give lists). List methods: count, index.
// Globals: dict, namespace, raise_exception, range (a list), strftime_now.
#include <unicode/uchar.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <functional>
#include <map>

#include "common/text/jinja/interpreter.h"
#include "common/text/jinja/pystr.h"

namespace tandem::jinja {

bool Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::kUndefined: return false;
    case Kind::kString:
      if (!item.is_string()) {
        Fail("'in <string>' requires string as left operand, not " + item.TypeName());
      }
      return container.str().find(item.str()) != std::string::npos;
    case Kind::kList:
    case Kind::kTuple:
      return std::any_of(container.items().begin(), container.items().end(),
                         [&](const Value& v) { return Equal(v, item); });
    case Kind::kDict:
      if (item.kind() == Kind::kList || item.kind() == Kind::kDict) {
        Fail("unhashable type: '" + item.TypeName() + "'");
      }
      return container.dict().Find(item) != nullptr;
    default: Fail("argument of type '" + container.TypeName() + "' is not iterable");
  }
}

// ---- methods -------------------------------------------------------------------------------

namespace {

using MethodFn = std::function<Value(Interpreter&, const Value&, CallArgs&)>;

Value BindMethod(const Value& self, const std::string& name, MethodFn fn) {
  return Value::Callable(self.TypeName() + "." + name, [self, fn](Interpreter& in, CallArgs& args) {
    in.Charge(1);
    in.ChargeFor(self);
    return fn(in, self, args);
  });
}

// dict.items/keys/values/get, list.index/count; the mutating methods are refused as the
// sandbox refuses them (an undefined value that fails when called).
Value ContainerMethod(const Value& self, const std::string& name) {
  auto method = [&](MethodFn fn) { return BindMethod(self, name, std::move(fn)); };
  if (self.is_dict()) {
    if (name == "items" || name == "keys" || name == "values") {
      return method([name](Interpreter&, const Value& d, CallArgs& args) {
        BindArgs(args, {}, name);
        std::vector<Value> out;
        for (const auto& [k, v] : d.dict().items) {
          out.push_back(name == "items" ? Value::Tuple({k, v}) : name == "keys" ? k : v);
        }
        return Value::List(std::move(out));
      });
    }
    if (name == "get") {
      return method([](Interpreter&, const Value& d, CallArgs& args) {
        auto a = BindArgs(args, {"key", "default"}, "get");
        if (!a[0]) Fail("get expected at least 1 argument, got 0");
        if (a[0]->kind() == Kind::kList || a[0]->kind() == Kind::kDict) {
          Fail("unhashable type: '" + a[0]->TypeName() + "'");
        }
        const Value* v = d.dict().Find(*a[0]);
        return v != nullptr ? *v : a[1] ? *a[1] : Value::None();
      });
    }
    for (const char* unsafe : {"update", "pop", "popitem", "setdefault", "clear", "copy"}) {
      if (name == unsafe) {
        return Value::Undefined("access to attribute '" + name + "' of 'dict' object is unsafe.");
      }
    }
    return Value();
  }
  if (self.is_sequence()) {
    if (name == "index" || name == "count") {
      return method([name](Interpreter&, const Value& l, CallArgs& args) {
        auto a = BindArgs(args, {"value"}, name);
        if (!a[0]) Fail(name + "() takes exactly one argument (0 given)");
        int64_t count = 0;
        for (size_t i = 0; i < l.items().size(); ++i) {
          if (!Equal(l.items()[i], *a[0])) continue;
          if (name == "index") return Value::Int(static_cast<int64_t>(i));
          ++count;
        }
        if (name == "index") Fail(a[0]->Repr(256) + " is not in list");
        return Value::Int(count);
      });
    }
    for (const char* unsafe : {"append", "extend", "insert", "pop", "remove", "clear", "sort",
                               "reverse", "copy"}) {
      if (name == unsafe) {
        return Value::Undefined("access to attribute '" + name + "' of '" + self.TypeName() +
                                "' object is unsafe.");
      }
    }
    return Value();
  }
  return Value();
}

void AddStringMethods1(std::map<std::string, MethodFn>* methods) {
  methods->insert({      {"strip", [](Interpreter&, const Value& s, CallArgs& args) {
         auto a = BindArgs(args, {"chars"}, "strip");
         return Value::String(PyStrip(s.str(), a[0] ? &*a[0] : nullptr, true, true));
       }},
      {"lstrip", [](Interpreter&, const Value& s, CallArgs& args) {
         auto a = BindArgs(args, {"chars"}, "lstrip");
         return Value::String(PyStrip(s.str(), a[0] ? &*a[0] : nullptr, true, false));
       }},
      {"rstrip", [](Interpreter&, const Value& s, CallArgs& args) {
         auto a = BindArgs(args, {"chars"}, "rstrip");
         return Value::String(PyStrip(s.str(), a[0] ? &*a[0] : nullptr, false, true));
       }},
      {"split", [](Interpreter& in, const Value& s, CallArgs& args) {
         auto a = BindArgs(args, {"sep", "maxsplit"}, "split");
         std::vector<Value> parts = PySplit(s.str(), a[0] ? &*a[0] : nullptr,
                                            a[1] ? ToIndex(*a[1], "maxsplit") : -1, false);
         in.Charge(static_cast<int64_t>(parts.size()));
         return Value::List(std::move(parts));
       }},
      {"rsplit", [](Interpreter& in, const Value& s, CallArgs& args) {
         auto a = BindArgs(args, {"sep", "maxsplit"}, "rsplit");
         std::vector<Value> parts = PySplit(s.str(), a[0] ? &*a[0] : nullptr,
                                            a[1] ? ToIndex(*a[1], "maxsplit") : -1, true);
         in.Charge(static_cast<int64_t>(parts.size()));
         return Value::List(std::move(parts));
       }},
      {"splitlines", [](Interpreter& in, const Value& s, CallArgs& args) {
         BindArgs(args, {}, "splitlines");
         std::vector<Value> out;
         for (std::string& l : PySplitLines(s.str())) out.push_back(Value::String(std::move(l)));
         in.Charge(static_cast<int64_t>(out.size()));
         return Value::List(std::move(out));
       }},
      {"startswith", [](Interpreter&, const Value& s, CallArgs& args) {
         auto a = BindArgs(args, {"prefix"}, "startswith");
         if (!a[0]) Fail("startswith takes at least 1 argument");
         std::vector<Value> options = a[0]->kind() == Kind::kTuple ? a[0]->items() : std::vector<Value>{*a[0]};
         for (const Value& p : options) {
           const std::string& prefix = NeedString(p, "startswith first arg");
           if (s.str().compare(0, prefix.size(), prefix) == 0) return Value::Bool(true);
         }
         return Value::Bool(false);
       }},
      {"endswith", [](Interpreter&, const Value& s, CallArgs& args) {
         auto a = BindArgs(args, {"suffix"}, "endswith");
         if (!a[0]) Fail("endswith takes at least 1 argument");
         std::vector<Value> options = a[0]->kind() == Kind::kTuple ? a[0]->items() : std::vector<Value>{*a[0]};
         for (const Value& p : options) {
           const std::string& suffix = NeedString(p, "endswith first arg");
           if (s.str().size() >= suffix.size() &&
               s.str().compare(s.str().size() - suffix.size(), suffix.size(), suffix) == 0) {
             return Value::Bool(true);
           }
         }
         return Value::Bool(false);
       }},
      {"upper", [](Interpreter&, const Value& s, CallArgs& args) {
         BindArgs(args, {}, "upper");
         return Value::String(MapCase(s.str(), CaseMap::kUpper));
       }},
      {"lower", [](Interpreter&, const Value& s, CallArgs& args) {
         BindArgs(args, {}, "lower");
         return Value::String(MapCase(s.str(), CaseMap::kLower));
       }},
      {"title", [](Interpreter&, const Value& s, CallArgs& args) {
         BindArgs(args, {}, "title");
         return Value::String(PyTitle(s.str()));
       }},
      {"capitalize", [](Interpreter&, const Value& s, CallArgs& args) {
         BindArgs(args, {}, "capitalize");
         return Value::String(PyCapitalize(s.str()));
       }},
      {"replace", [](Interpreter& in, const Value& s, CallArgs& args) {
         auto a = BindArgs(args, {"old", "new", "count"}, "replace");
         if (!a[0] || !a[1]) Fail("replace expected at least 2 arguments");
         return Value::String(PyReplace(in, s.str(), NeedString(*a[0], "replace arg 1"),
                                        NeedString(*a[1], "replace arg 2"),
                                        a[2] ? ToIndex(*a[2], "count") : -1));
       }},
      {"find", [](Interpreter&, const Value& s, CallArgs& args) {
         auto a = BindArgs(args, {"sub"}, "find");
         if (!a[0]) Fail("find takes at least 1 argument");
         const size_t at = s.str().find(NeedString(*a[0], "find arg"));
         return Value::Int(at == std::string::npos ? -1 : static_cast<int64_t>(CodePointCount(s.str().substr(0, at))));
       }},
  });
}

void AddStringMethods2(std::map<std::string, MethodFn>* methods) {
  methods->insert({      {"rfind", [](Interpreter&, const Value& s, CallArgs& args) {
         auto a = BindArgs(args, {"sub"}, "rfind");
         if (!a[0]) Fail("rfind takes at least 1 argument");
         const size_t at = s.str().rfind(NeedString(*a[0], "rfind arg"));
         return Value::Int(at == std::string::npos ? -1 : static_cast<int64_t>(CodePointCount(s.str().substr(0, at))));
       }},
      {"index", [](Interpreter&, const Value& s, CallArgs& args) {
         auto a = BindArgs(args, {"sub"}, "index");
         if (!a[0]) Fail("index takes at least 1 argument");
         const size_t at = s.str().find(NeedString(*a[0], "index arg"));
         if (at == std::string::npos) Fail("substring not found");
         return Value::Int(static_cast<int64_t>(CodePointCount(s.str().substr(0, at))));
       }},
      {"count", [](Interpreter&, const Value& s, CallArgs& args) {
         auto a = BindArgs(args, {"sub"}, "count");
         if (!a[0]) Fail("count takes at least 1 argument");
         const std::string& sub = NeedString(*a[0], "count arg");
         if (sub.empty()) return Value::Int(static_cast<int64_t>(CodePointCount(s.str())) + 1);
         int64_t n = 0;
         for (size_t at = s.str().find(sub); at != std::string::npos; at = s.str().find(sub, at + sub.size())) ++n;
         return Value::Int(n);
       }},
      {"join", [](Interpreter& in, const Value& s, CallArgs& args) {
         auto a = BindArgs(args, {"iterable"}, "join");
         if (!a[0]) Fail("join() takes exactly one argument (0 given)");
         std::string out;
         bool first = true;
         for (const Value& item : in.Iterate(*a[0])) {
           if (!first) out += s.str();
           first = false;
           out += NeedString(item, "sequence item");
           in.CheckSize(out.size());
         }
         return Value::String(std::move(out));
       }},
      {"format", [](Interpreter& in, const Value& s, CallArgs& args) {
         return Value::String(BraceFormat(in, s.str(), args));
       }},
      {"removeprefix", [](Interpreter&, const Value& s, CallArgs& args) {
         auto a = BindArgs(args, {"prefix"}, "removeprefix");
         if (!a[0]) Fail("removeprefix takes exactly one argument");
         const std::string& p = NeedString(*a[0], "removeprefix arg");
         return Value::String(s.str().compare(0, p.size(), p) == 0 ? s.str().substr(p.size()) : s.str());
       }},
      {"removesuffix", [](Interpreter&, const Value& s, CallArgs& args) {
         auto a = BindArgs(args, {"suffix"}, "removesuffix");
         if (!a[0]) Fail("removesuffix takes exactly one argument");
         const std::string& p = NeedString(*a[0], "removesuffix arg");
         const std::string& str = s.str();
         const bool ends = !p.empty() && str.size() >= p.size() && str.compare(str.size() - p.size(), p.size(), p) == 0;
         return Value::String(ends ? str.substr(0, str.size() - p.size()) : str);
       }},
      {"isdigit", [](Interpreter&, const Value& s, CallArgs&) {
         const std::u32string cps = DecodeUtf8(s.str());
         return Value::Bool(!cps.empty() && std::all_of(cps.begin(), cps.end(), [](char32_t c) { return u_isdigit(static_cast<UChar32>(c)) != 0; }));
       }},
      {"isalpha", [](Interpreter&, const Value& s, CallArgs&) {
         const std::u32string cps = DecodeUtf8(s.str());
         return Value::Bool(!cps.empty() && std::all_of(cps.begin(), cps.end(), [](char32_t c) { return u_isalpha(static_cast<UChar32>(c)) != 0; }));
       }},
      {"isalnum", [](Interpreter&, const Value& s, CallArgs&) {
         const std::u32string cps = DecodeUtf8(s.str());
         return Value::Bool(!cps.empty() && std::all_of(cps.begin(), cps.end(), [](char32_t c) { return u_isalnum(static_cast<UChar32>(c)) != 0; }));
       }},
      {"isspace", [](Interpreter&, const Value& s, CallArgs&) {
         const std::u32string cps = DecodeUtf8(s.str());
         return Value::Bool(!cps.empty() && std::all_of(cps.begin(), cps.end(), IsPythonSpace));
       }},
      {"islower", [](Interpreter&, const Value& s, CallArgs&) { return Value::Bool(IsLowerStr(s.str())); }},
      {"isupper", [](Interpreter&, const Value& s, CallArgs&) { return Value::Bool(IsUpperStr(s.str())); }},

  });
}

}  // namespace

Value Interpreter::StringMethod(const Value& self, const std::string& name) {
  if (self.is_dict() || self.is_sequence()) return ContainerMethod(self, name);
  if (!self.is_string()) return Value();
  static const auto* methods = [] {
    auto* m = new std::map<std::string, MethodFn>;
    AddStringMethods1(m);
    AddStringMethods2(m);
    return m;
  }();
  auto it = methods->find(name);
  if (it == methods->end()) return Value();
  return BindMethod(self, name, it->second);
}

// ---- operators -----------------------------------------------------------------------------

namespace {

[[noreturn]] void OperandError(const std::string& op, const Value& a, const Value& b) {
  Fail("unsupported operand type(s) for " + op + ": '" + a.TypeName() + "' and '" + b.TypeName() + "'");
}

Value Add([[maybe_unused]] Interpreter& in, const std::string& op, const Value& a,
           const Value& b) {
  const bool numbers = a.is_number() && b.is_number();
  [[maybe_unused]] const bool floats =
      numbers && (a.kind() == Kind::kFloat || b.kind() == Kind::kFloat);
  if (numbers) {
    if (floats) return Value::Float(a.float_value() + b.float_value());
    int64_t r;
    if (__builtin_add_overflow(a.int_value(), b.int_value(), &r)) Fail("integer overflow");
    return Value::Int(r);
  }
  if (a.is_string() && b.is_string()) {
    in.CheckSize(a.str().size() + b.str().size());
    in.Charge(static_cast<int64_t>((a.str().size() + b.str().size()) / 64));
    return Value::String(a.str() + b.str());
  }
  if (a.kind() == b.kind() && a.is_sequence()) {
    std::vector<Value> items = a.items();
    items.insert(items.end(), b.items().begin(), b.items().end());
    in.Charge(static_cast<int64_t>(items.size()));
    return a.kind() == Kind::kTuple ? Value::Tuple(std::move(items)) : Value::List(std::move(items));
  }
  if (a.is_string()) Fail("can only concatenate str (not \"" + b.TypeName() + "\") to str");
  if (a.is_sequence()) {
    Fail("can only concatenate " + a.TypeName() + " (not \"" + b.TypeName() + "\") to " + a.TypeName());
  }
  OperandError(op, a, b);

  OperandError(op, a, b);
}

Value Subtract([[maybe_unused]] Interpreter& in, const std::string& op, const Value& a,
           const Value& b) {
  const bool numbers = a.is_number() && b.is_number();
  [[maybe_unused]] const bool floats =
      numbers && (a.kind() == Kind::kFloat || b.kind() == Kind::kFloat);
  if (!numbers) OperandError(op, a, b);
  if (floats) return Value::Float(a.float_value() - b.float_value());
  int64_t r;
  if (__builtin_sub_overflow(a.int_value(), b.int_value(), &r)) Fail("integer overflow");
  return Value::Int(r);

  OperandError(op, a, b);
}

Value Multiply([[maybe_unused]] Interpreter& in, const std::string& op, const Value& a,
           const Value& b) {
  const bool numbers = a.is_number() && b.is_number();
  [[maybe_unused]] const bool floats =
      numbers && (a.kind() == Kind::kFloat || b.kind() == Kind::kFloat);
  if (numbers) {
    if (floats) return Value::Float(a.float_value() * b.float_value());
    int64_t r;
    if (__builtin_mul_overflow(a.int_value(), b.int_value(), &r)) Fail("integer overflow");
    return Value::Int(r);
  }
  const Value& seq = a.is_number() ? b : a;
  const Value& count = a.is_number() ? a : b;
  if (count.kind() == Kind::kFloat || !count.is_number()) {
    Fail("can't multiply sequence by non-int of type '" + count.TypeName() + "'");
  }
  const int64_t n = std::max<int64_t>(count.int_value(), 0);
  if (seq.is_string()) {
    if (n > 0 && seq.str().size() > 0) in.CheckSize(static_cast<size_t>(std::min<int64_t>(n, INT32_MAX)) * seq.str().size());
    std::string out;
    for (int64_t i = 0; i < n && !seq.str().empty(); ++i) out += seq.str();
    in.Charge(static_cast<int64_t>(out.size() / 64));
    return Value::String(std::move(out));
  }
  if (seq.is_sequence()) {
    const size_t total = seq.items().empty() ? 0 : static_cast<size_t>(std::min<int64_t>(n, INT32_MAX)) * seq.items().size();
    if (total > static_cast<size_t>(in.limits().max_range)) {
      throw Error(Error::Kind::kLimit, "a list would hold more than " + std::to_string(in.limits().max_range) + " items");
    }
    std::vector<Value> items;
    for (int64_t i = 0; i < n && !seq.items().empty(); ++i) {
      items.insert(items.end(), seq.items().begin(), seq.items().end());
    }
    in.Charge(static_cast<int64_t>(items.size()));
    return seq.kind() == Kind::kTuple ? Value::Tuple(std::move(items)) : Value::List(std::move(items));
  }
  OperandError(op, a, b);

  OperandError(op, a, b);
}

Value Divide([[maybe_unused]] Interpreter& in, const std::string& op, const Value& a,
           const Value& b) {
  const bool numbers = a.is_number() && b.is_number();
  [[maybe_unused]] const bool floats =
      numbers && (a.kind() == Kind::kFloat || b.kind() == Kind::kFloat);
  if (!numbers) OperandError(op, a, b);
  if (b.float_value() == 0) Fail("division by zero");
  return Value::Float(a.float_value() / b.float_value());

  OperandError(op, a, b);
}

Value FloorDivMod([[maybe_unused]] Interpreter& in, const std::string& op, const Value& a,
           const Value& b) {
  const bool numbers = a.is_number() && b.is_number();
  [[maybe_unused]] const bool floats =
      numbers && (a.kind() == Kind::kFloat || b.kind() == Kind::kFloat);
  if (op == "%" && a.is_string()) return Value::String(PercentFormat(in, a.str(), b));
  if (!numbers) OperandError(op, a, b);
  if (floats) {
    // CPython's float_divmod.
    const double x = a.float_value(), y = b.float_value();
    if (y == 0) Fail("float divmod()");
    double mod = std::fmod(x, y);
    double div = (x - mod) / y;
    if (mod != 0) {
      if ((y < 0) != (mod < 0)) {
        mod += y;
        div -= 1.0;
      }
    } else {
      mod = std::copysign(0.0, y);
    }
    if (op == "%") return Value::Float(mod);
    double floordiv;
    if (div != 0) {
      floordiv = std::floor(div);
      if (div - floordiv > 0.5) floordiv += 1.0;
    } else {
      floordiv = std::copysign(0.0, x / y);
    }
    return Value::Float(floordiv);
  }
  const int64_t x = a.int_value(), y = b.int_value();
  if (y == 0) Fail("integer division or modulo by zero");
  if (x == INT64_MIN && y == -1) {
    if (op == "%") return Value::Int(0);
    Fail("integer overflow");
  }
  int64_t q = x / y, r = x % y;
  if (r != 0 && ((r < 0) != (y < 0))) {
    r += y;
    --q;
  }
  return Value::Int(op == "%" ? r : q);

  OperandError(op, a, b);
}

Value Power([[maybe_unused]] Interpreter& in, const std::string& op, const Value& a,
           const Value& b) {
  const bool numbers = a.is_number() && b.is_number();
  [[maybe_unused]] const bool floats =
      numbers && (a.kind() == Kind::kFloat || b.kind() == Kind::kFloat);
  if (!numbers) OperandError(op, a, b);
  if (!floats && b.int_value() >= 0) {
    int64_t result = 1, base = a.int_value(), e = b.int_value();
    while (e > 0) {
      if (e & 1) {
        if (__builtin_mul_overflow(result, base, &result)) Fail("integer overflow");
      }
      e >>= 1;
      if (e > 0 && __builtin_mul_overflow(base, base, &base)) Fail("integer overflow");
    }
    return Value::Int(result);
  }
  if (a.float_value() == 0 && b.float_value() < 0) {
    Fail("0.0 cannot be raised to a negative power");
  }
  const double r = std::pow(a.float_value(), b.float_value());
  if (std::isnan(r) && !std::isnan(a.float_value()) && !std::isnan(b.float_value())) {
    Fail("complex results are not supported");
  }
  return Value::Float(r);

  OperandError(op, a, b);
}

}  // namespace

Value Interpreter::BinaryOp(Interpreter& in, const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string s = in.Str(a);
    const std::string t = in.Str(b);
    in.CheckSize(s.size() + t.size());
    in.Charge(static_cast<int64_t>((s.size() + t.size()) / 64));
    return Value::String(s + t);
  }
  if (a.is_undefined()) FailUndefined(a);
  if (b.is_undefined()) FailUndefined(b);
  if (op == "+") return Add(in, op, a, b);
  if (op == "-") return Subtract(in, op, a, b);
  if (op == "*") return Multiply(in, op, a, b);
  if (op == "/") return Divide(in, op, a, b);
  if (op == "//" || op == "%") return FloorDivMod(in, op, a, b);
  if (op == "**") return Power(in, op, a, b);
  Fail("unknown operator " + op);
}

// ---- globals -------------------------------------------------------------------------------

std::shared_ptr<Scope> Interpreter::BuiltinScope() {
  static const std::shared_ptr<Scope>* scope = [] {
    auto s = std::make_shared<Scope>();
    s->vars["range"] = Value::Callable("range", [](Interpreter& in, CallArgs& args) {
      if (!args.keywords.empty()) Fail("range() takes no keyword arguments");
      std::vector<int64_t> p;
      for (const Value& v : args.positional) p.push_back(ToIndex(v, "range() argument"));
      if (p.empty() || p.size() > 3) Fail("range expected 1 to 3 arguments");
      const int64_t start = p.size() == 1 ? 0 : p[0];
      const int64_t stop = p.size() == 1 ? p[0] : p[1];
      const int64_t step = p.size() == 3 ? p[2] : 1;
      if (step == 0) Fail("range() arg 3 must not be zero");
      const __int128 span = step > 0 ? static_cast<__int128>(stop) - start : static_cast<__int128>(start) - stop;
      const __int128 astep = step > 0 ? step : -static_cast<__int128>(step);
      const __int128 n = span <= 0 ? 0 : (span + astep - 1) / astep;
      if (n > in.limits().max_range) {
        throw Error(Error::Kind::kLimit, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (" +
                                             std::to_string(in.limits().max_range) + ").");
      }
      std::vector<Value> out;
      for (int64_t i = 0; i < static_cast<int64_t>(n); ++i) out.push_back(Value::Int(start + i * step));
      in.Charge(static_cast<int64_t>(n));
      return Value::List(std::move(out));
    });
    s->vars["namespace"] = Value::Callable("namespace", [](Interpreter& in, CallArgs& args) {
      auto ns = in.NewNamespace();
      std::vector<std::pair<Value, Value>> items;
      for (const Value& v : args.positional) {
        if (!v.is_dict()) Fail("namespace() positional arguments must be dicts");
        for (const auto& kv : v.dict().items) items.push_back(kv);
      }
      for (const auto& [k, v] : args.keywords) items.emplace_back(Value::String(k), v);
      ns->attrs = Value::Dict(std::move(items)).dict();
      return Value::Namespace(ns);
    });
    s->vars["dict"] = Value::Callable("dict", [](Interpreter&, CallArgs& args) {
      std::vector<std::pair<Value, Value>> items;
      for (const Value& v : args.positional) {
        if (!v.is_dict()) Fail("dict() positional arguments must be dicts");
        for (const auto& kv : v.dict().items) items.push_back(kv);
      }
      for (const auto& [k, v] : args.keywords) items.emplace_back(Value::String(k), v);
      return Value::Dict(std::move(items));
    });
    s->vars["raise_exception"] = Value::Callable("raise_exception", [](Interpreter& in, CallArgs& args) -> Value {
      auto a = BindArgs(args, {"message"}, "raise_exception");
      throw Error(Error::Kind::kRaised, a[0] ? in.Str(*a[0]) : "raise_exception() was called");
    });
    s->vars["strftime_now"] = Value::Callable("strftime_now", [](Interpreter&, CallArgs& args) {
      auto a = BindArgs(args, {"format"}, "strftime_now");
      if (!a[0]) Fail("strftime_now() needs a format");
      const std::string& fmt = NeedString(*a[0], "format");
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[512];
      const size_t n = fmt.size() < 128 ? std::strftime(buf, sizeof(buf), fmt.c_str(), &tm) : 0;
      if (n == 0 && !fmt.empty()) Fail("strftime_now: the format is too long or empty output");
      return Value::String(std::string(buf, n));
    });
    return new std::shared_ptr<Scope>(std::move(s));
  }();
  return *scope;
}

}  // namespace tandem::jinja
