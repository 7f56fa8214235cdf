#include "common/text/jinja/interpreter.h"

#include <algorithm>

#include "common/text/jinja/parser.h"

namespace tandem::jinja {

struct Interpreter::DepthGuard {
  explicit DepthGuard(Interpreter* in) : in(in) {
    if (++in->depth_ > in->limits_.max_depth) {
      throw Error(Error::Kind::kLimit, "the template nests or recurses deeper than " +
                                           std::to_string(in->limits_.max_depth) + " levels");
    }
  }
  ~DepthGuard() { --in->depth_; }
  Interpreter* in;
};

void FailUndefined(const Value& v) {
  Fail(v.undefined_hint().empty() ? "a value is undefined" : v.undefined_hint());
}

Interpreter::Interpreter(const Limits& limits, std::shared_ptr<Scope> globals)
    : limits_(limits), globals_(std::move(globals)) {}

Interpreter::~Interpreter() {
  // Namespaces are the only mutable values, so every reference cycle passes through one.
  for (auto& ns : namespaces_) ns->attrs.items.clear();
}

std::shared_ptr<NamespaceData> Interpreter::NewNamespace() {
  auto ns = std::make_shared<NamespaceData>();
  namespaces_.push_back(ns);
  return ns;
}

void Interpreter::Charge(int64_t n) {
  steps_ += n;
  if (steps_ > limits_.max_steps) {
    throw Error(Error::Kind::kLimit, "the template ran more than " +
                                         std::to_string(limits_.max_steps) + " steps");
  }
}

void Interpreter::ChargeFor(const Value& v) {
  switch (v.kind()) {
    case Kind::kString: Charge(static_cast<int64_t>(v.str().size() / 64)); break;
    case Kind::kList:
    case Kind::kTuple: Charge(static_cast<int64_t>(v.items().size())); break;
    case Kind::kDict: Charge(static_cast<int64_t>(v.dict().items.size())); break;
    default: break;
  }
}

std::string Interpreter::Str(const Value& v) {
  std::string s = v.Str(limits_.max_output_bytes);
  Charge(static_cast<int64_t>(s.size() / 64));
  return s;
}

void Interpreter::CheckSize(size_t bytes) const {
  if (bytes > limits_.max_output_bytes) {
    throw Error(Error::Kind::kLimit, "a string would exceed the template's size limit of " +
                                         std::to_string(limits_.max_output_bytes) + " bytes");
  }
}

void Interpreter::Append(std::string* out, const std::string& text) {
  CheckSize(out->size() + text.size());
  Charge(static_cast<int64_t>(text.size() / 64));
  *out += text;
}

std::string Interpreter::Run(const Body& body) {
  auto scope = std::make_shared<Scope>();
  scope->parent = globals_;
  std::string out;
  Exec(body, scope, &out);
  return out;
}

void Interpreter::Exec(const Body& body, const std::shared_ptr<Scope>& scope, std::string* out) {
  for (const StmtPtr& s : body) {
    try {
      ExecStmt(*s, scope, out);
    } catch (Error& e) {
      if (e.line() == 0) e.set_line(s->line);
      throw;
    }
  }
}

void Interpreter::ExecStmt(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string* out) {
  DepthGuard guard(this);
  Charge(1);
  switch (s.kind) {
    case StmtKind::kText: Append(out, s.text); return;
    case StmtKind::kPrint: Append(out, Str(Eval(*s.expr, scope))); return;
    case StmtKind::kIf:
      for (size_t i = 0; i < s.conds.size(); ++i) {
        if (Eval(*s.conds[i], scope).Truthy()) {
          Exec(s.bodies[i], scope, out);
          return;
        }
      }
      Exec(s.else_body, scope, out);
      return;
    case StmtKind::kFor: ExecFor(s, scope, out); return;
    case StmtKind::kSet: ExecSet(s, scope); return;
    case StmtKind::kSetBlock: {
      auto inner = std::make_shared<Scope>();
      inner->parent = scope;
      std::string text;
      Exec(s.body, inner, &text);
      Value v = Value::String(std::move(text));
      if (s.filter) {
        // The filter chain's innermost subject is null: the block's text.
        std::vector<const Expr*> chain;
        for (const Expr* f = s.filter.get(); f != nullptr; f = f->args[0].get()) chain.push_back(f);
        for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
          CallArgs args = EvalArgs(**it, 1, scope);
          v = ApplyFilter((*it)->name, v, args);
        }
      }
      scope->vars[s.targets[0]] = v;
      return;
    }
    case StmtKind::kMacro:
      scope->vars[s.name] = MakeMacro(s, scope, &s.body, &s.params, s.name);
      return;
    case StmtKind::kCallBlock: {
      // The macro is called with `caller` (the block body) as a keyword argument.
      const Expr& call = *s.expr;
      Value callee = Eval(*call.args[0], scope);
      CallArgs args = EvalArgs(call, 1, scope);
      args.keywords.emplace_back("caller", MakeMacro(s, scope, &s.body, &s.params, "caller"));
      Append(out, Str(Call(callee, args)));
      return;
    }
    case StmtKind::kFilterBlock: {
      std::string text;
      Exec(s.body, scope, &text);
      Value v = Value::String(std::move(text));
      std::vector<const Expr*> chain;
      for (const Expr* f = s.filter.get(); f != nullptr; f = f->args[0].get()) chain.push_back(f);
      for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
        CallArgs args = EvalArgs(**it, 1, scope);
        v = ApplyFilter((*it)->name, v, args);
      }
      Append(out, Str(v));
      return;
    }
    case StmtKind::kWith: {
      auto inner = std::make_shared<Scope>();
      inner->parent = scope;
      for (const auto& [name, expr] : s.assigns) inner->vars[name] = Eval(*expr, scope);
      Exec(s.body, inner, out);
      return;
    }
    case StmtKind::kGeneration: Exec(s.body, scope, out); return;
  }
}

void Interpreter::Assign(const std::vector<std::string>& targets, bool unpack, const Value& value,
                         Scope* scope) {
  if (!unpack) {
    scope->vars[targets[0]] = value;
    return;
  }
  std::vector<Value> items = Iterate(value);
  if (items.size() != targets.size()) {
    Fail(items.size() < targets.size()
             ? "not enough values to unpack (expected " + std::to_string(targets.size()) +
                   ", got " + std::to_string(items.size()) + ")"
             : "too many values to unpack (expected " + std::to_string(targets.size()) + ")");
  }
  for (size_t i = 0; i < targets.size(); ++i) scope->vars[targets[i]] = items[i];
}

void Interpreter::ExecSet(const Stmt& s, const std::shared_ptr<Scope>& scope) {
  Value v = Eval(*s.expr, scope);
  if (!s.ns_attr.empty()) {
    Value ns;
    for (Scope* sc = scope.get(); sc != nullptr; sc = sc->parent.get()) {
      auto it = sc->vars.find(s.targets[0]);
      if (it != sc->vars.end()) {
        ns = it->second;
        break;
      }
    }
    if (ns.kind() != Kind::kNamespace) {
      Fail("cannot assign attribute on non-namespace object '" + s.targets[0] + "'");
    }
    DictData& attrs = ns.ns().attrs;
    const Value key = Value::String(s.ns_attr);
    for (auto& [k, val] : attrs.items) {
      if (Equal(k, key)) {
        val = v;
        return;
      }
    }
    attrs.items.emplace_back(key, v);
    return;
  }
  Assign(s.targets, s.unpack, v, scope.get());
}

void Interpreter::ExecFor(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string* out) {
  std::vector<Value> items = Iterate(Eval(*s.expr, scope));
  Charge(static_cast<int64_t>(items.size()));
  if (s.cond) {
    std::vector<Value> kept;
    for (const Value& item : items) {
      auto inner = std::make_shared<Scope>();
      inner->parent = scope;
      Assign(s.targets, s.unpack, item, inner.get());
      if (Eval(*s.cond, inner).Truthy()) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    auto inner = std::make_shared<Scope>();
    inner->parent = scope;
    Exec(s.else_body, inner, out);
    return;
  }
  auto loop = std::make_shared<LoopData>();
  auto data = std::make_shared<ListData>();
  data->items = std::move(items);
  loop->items = data;
  // loop.depth is 1: only recursive loops (not supported) go deeper.
  const Value loop_value = Value::Loop(loop);
  for (size_t i = 0; i < data->items.size(); ++i) {
    loop->index0 = static_cast<int64_t>(i);
    auto inner = std::make_shared<Scope>();
    inner->parent = scope;
    Assign(s.targets, s.unpack, data->items[i], inner.get());
    inner->vars["loop"] = loop_value;
    Exec(s.body, inner, out);
  }
}

Value Interpreter::MakeMacro(const Stmt& s, const std::shared_ptr<Scope>& scope, const Body* body,
                             const std::vector<MacroParam>* params, const std::string& name) {
  // The macro sees its defining scope as it is when called (jinja2 resolves names then); a
  // weak reference, so that a scope holding its own macro is no cycle.
  std::weak_ptr<Scope> defining = scope;
  std::weak_ptr<Scope> globals = globals_;
  const int line = s.line;
  return Value::Callable(name, [defining, globals, body, params, name, line](
                                   Interpreter& in, CallArgs& args) -> Value {
    DepthGuard guard(&in);
    auto scope = std::make_shared<Scope>();
    scope->parent = defining.lock();
    if (!scope->parent) scope->parent = globals.lock();
    std::vector<Value> varargs;
    for (size_t i = 0; i < args.positional.size(); ++i) {
      if (i < params->size()) scope->vars[(*params)[i].name] = args.positional[i];
      else varargs.push_back(args.positional[i]);
    }
    std::vector<std::pair<Value, Value>> kwargs;
    for (auto& [key, value] : args.keywords) {
      bool is_param = false;
      for (size_t i = 0; i < params->size(); ++i) {
        if ((*params)[i].name != key) continue;
        if (i < args.positional.size()) {
          Fail("macro '" + name + "' got multiple values for argument '" + key + "'");
        }
        scope->vars[key] = value;
        is_param = true;
      }
      if (key == "caller") {
        scope->vars["caller"] = value;
      } else if (!is_param) {
        kwargs.emplace_back(Value::String(key), value);
      }
    }
    for (const MacroParam& p : *params) {
      if (scope->vars.count(p.name)) continue;
      scope->vars[p.name] = p.default_value
                                ? in.Eval(*p.default_value, scope)
                                : Value::Undefined("parameter '" + p.name + "' was not provided");
    }
    scope->vars["varargs"] = Value::Tuple(std::move(varargs));
    scope->vars["kwargs"] = Value::Dict(std::move(kwargs));
    std::string out;
    try {
      in.Exec(*body, scope, &out);
    } catch (Error& e) {
      if (e.line() == 0) e.set_line(line);
      throw;
    }
    return Value::String(std::move(out));
  });
}

CallArgs Interpreter::EvalArgs(const Expr& e, size_t first, const std::shared_ptr<Scope>& scope) {
  CallArgs args;
  for (size_t i = first; i < e.args.size(); ++i) args.positional.push_back(Eval(*e.args[i], scope));
  if (e.star) {
    for (Value& v : Iterate(Eval(*e.star, scope))) args.positional.push_back(std::move(v));
  }
  for (const auto& [name, expr] : e.kwargs) args.keywords.emplace_back(name, Eval(*expr, scope));
  if (e.starstar) {
    Value d = Eval(*e.starstar, scope);
    if (!d.is_dict()) Fail("argument after ** must be a mapping, not " + d.TypeName());
    for (const auto& [k, v] : d.dict().items) {
      if (!k.is_string()) Fail("keywords must be strings");
      args.keywords.emplace_back(k.str(), v);
    }
  }
  return args;
}

Value Interpreter::Eval(const Expr& e, const std::shared_ptr<Scope>& scope) {
  DepthGuard guard(this);
  Charge(1);
  try {
    switch (e.kind) {
      case ExprKind::kConst: return e.value;
      case ExprKind::kName:
        for (Scope* sc = scope.get(); sc != nullptr; sc = sc->parent.get()) {
          auto it = sc->vars.find(e.name);
          if (it != sc->vars.end()) return it->second;
        }
        return Value::Undefined("'" + e.name + "' is undefined");
      case ExprKind::kAttr: return GetAttr(Eval(*e.args[0], scope), e.name);
      case ExprKind::kItem: return GetItem(Eval(*e.args[0], scope), Eval(*e.args[1], scope));
      case ExprKind::kSlice: return EvalSlice(e, scope);
      case ExprKind::kCall: {
        Value callee = Eval(*e.args[0], scope);
        CallArgs args = EvalArgs(e, 1, scope);
        return Call(callee, args);
      }
      case ExprKind::kFilter: {
        Value subject = Eval(*e.args[0], scope);
        CallArgs args = EvalArgs(e, 1, scope);
        return ApplyFilter(e.name, subject, args);
      }
      case ExprKind::kTest: {
        Value subject = Eval(*e.args[0], scope);
        CallArgs args = EvalArgs(e, 1, scope);
        const bool result = ApplyTest(e.name, subject, args);
        return Value::Bool(e.negated ? !result : result);
      }
      case ExprKind::kNeg:
      case ExprKind::kPos: {
        Value v = Eval(*e.args[0], scope);
        if (v.is_undefined()) FailUndefined(v);
        if (!v.is_number()) {
          Fail(std::string("bad operand type for unary ") + (e.kind == ExprKind::kNeg ? "-" : "+") +
               ": '" + v.TypeName() + "'");
        }
        if (e.kind == ExprKind::kPos) return v.kind() == Kind::kBool ? Value::Int(v.int_value()) : v;
        if (v.kind() == Kind::kFloat) return Value::Float(-v.float_value());
        if (v.int_value() == INT64_MIN) Fail("integer overflow");
        return Value::Int(-v.int_value());
      }
      case ExprKind::kNot: return Value::Bool(!Eval(*e.args[0], scope).Truthy());
      case ExprKind::kAnd: {
        Value left = Eval(*e.args[0], scope);
        return left.Truthy() ? Eval(*e.args[1], scope) : left;
      }
      case ExprKind::kOr: {
        Value left = Eval(*e.args[0], scope);
        return left.Truthy() ? left : Eval(*e.args[1], scope);
      }
      case ExprKind::kBinary:
        return BinaryOp(*this, e.name, Eval(*e.args[0], scope), Eval(*e.args[1], scope));
      case ExprKind::kCompare: return EvalCompare(e, scope);
      case ExprKind::kCond:
        if (Eval(*e.args[0], scope).Truthy()) return Eval(*e.args[1], scope);
        if (e.args[2]) return Eval(*e.args[2], scope);
        return Value::Undefined("the inline if expression evaluated to false and no else section was defined");
      case ExprKind::kList:
      case ExprKind::kTuple: {
        std::vector<Value> items;
        items.reserve(e.args.size());
        for (const ExprPtr& a : e.args) items.push_back(Eval(*a, scope));
        return e.kind == ExprKind::kList ? Value::List(std::move(items)) : Value::Tuple(std::move(items));
      }
      case ExprKind::kDict: {
        std::vector<std::pair<Value, Value>> items;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value k = Eval(*e.args[i], scope);
          items.emplace_back(std::move(k), Eval(*e.args[i + 1], scope));
        }
        return Value::Dict(std::move(items));
      }
    }
  } catch (Error& err) {
    if (err.line() == 0) err.set_line(e.line);
    throw;
  }
  Fail("unknown expression");
}

// a[start:stop:step] on strings (by code point), lists and tuples, with Python's clamping.
Value Interpreter::EvalSlice(const Expr& e, const std::shared_ptr<Scope>& scope) {
  Value object = Eval(*e.args[0], scope);
  ChargeFor(object);
  std::optional<int64_t> part[3];
  for (int i = 0; i < 3; ++i) {
    if (!e.args[i + 1]) continue;
    Value v = Eval(*e.args[i + 1], scope);
    if (v.is_none()) continue;
    if (v.kind() != Kind::kInt && v.kind() != Kind::kBool) {
      Fail("slice indices must be integers or None");
    }
    part[i] = v.int_value();
  }
  const int64_t step = part[2].value_or(1);
  if (step == 0) Fail("slice step cannot be zero");
  auto slice = [&](int64_t n, auto&& take) {
    auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
      if (!v) return dflt;
      int64_t x = *v < 0 ? *v + n : *v;
      if (step > 0) return std::clamp<int64_t>(x, 0, n);
      return std::clamp<int64_t>(x, -1, n - 1);
    };
    const int64_t start = clamp(part[0], step > 0 ? 0 : n - 1);
    const int64_t stop = clamp(part[1], step > 0 ? n : -1);
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) take(i);
  };
  if (object.is_string()) {
    const std::u32string cps = DecodeUtf8(object.str());
    std::u32string out;
    slice(static_cast<int64_t>(cps.size()), [&](int64_t i) { out.push_back(cps[i]); });
    return Value::String(EncodeUtf8(out));
  }
  if (object.is_sequence()) {
    std::vector<Value> out;
    const auto& items = object.items();
    slice(static_cast<int64_t>(items.size()), [&](int64_t i) { out.push_back(items[i]); });
    Charge(static_cast<int64_t>(out.size()));
    return object.kind() == Kind::kTuple ? Value::Tuple(std::move(out))
                                         : Value::List(std::move(out));
  }
  if (object.is_undefined()) FailUndefined(object);
  Fail("'" + object.TypeName() + "' object is not subscriptable");
}

Value Interpreter::EvalCompare(const Expr& e, const std::shared_ptr<Scope>& scope) {
  Value left = Eval(*e.args[0], scope);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = Eval(*e.args[i + 1], scope);
    ChargeFor(left);
    ChargeFor(right);
    const std::string& op = e.ops[i];
    bool ok;
    if (op == "==") ok = Equal(left, right);
    else if (op == "!=") ok = !Equal(left, right);
    else if (op == "<") ok = Less(left, right);
    else if (op == "<=") ok = Less(left, right) || Equal(left, right);
    else if (op == ">") ok = Less(right, left);
    else if (op == ">=") ok = Less(right, left) || Equal(left, right);
    else if (op == "in") ok = Contains(right, left);
    else ok = !Contains(right, left);
    if (!ok) return Value::Bool(false);
    left = std::move(right);
  }
  return Value::Bool(true);
}

Value Interpreter::Call(const Value& callee, CallArgs& args) {
  if (callee.kind() == Kind::kCallable) return callee.callable().fn(*this, args);
  if (callee.is_undefined()) FailUndefined(callee);
  Fail("'" + callee.TypeName() + "' object is not callable");
}

std::vector<Value> Interpreter::Iterate(const Value& value) {
  switch (value.kind()) {
    case Kind::kUndefined: return {};
    case Kind::kList:
    case Kind::kTuple: return value.items();
    case Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& [k, v] : value.dict().items) keys.push_back(k);
      return keys;
    }
    case Kind::kString: {
      std::vector<Value> chars;
      for (char32_t c : DecodeUtf8(value.str())) {
        std::string s;
        AppendUtf8(&s, c);
        chars.push_back(Value::String(std::move(s)));
      }
      Charge(static_cast<int64_t>(chars.size()));
      return chars;
    }
    case Kind::kLoop: return value.loop().items->items;
    default: Fail("'" + value.TypeName() + "' object is not iterable");
  }
}

namespace {

Value LoopAttr(Interpreter& in, const Value& loop_value, const std::string& name) {
  LoopData& loop = loop_value.loop();
  const auto& items = loop.items->items;
  const int64_t n = static_cast<int64_t>(items.size());
  const int64_t i = loop.index0;
  if (name == "index") return Value::Int(i + 1);
  if (name == "index0") return Value::Int(i);
  if (name == "revindex") return Value::Int(n - i);
  if (name == "revindex0") return Value::Int(n - i - 1);
  if (name == "first") return Value::Bool(i == 0);
  if (name == "last") return Value::Bool(i == n - 1);
  if (name == "length") return Value::Int(n);
  if (name == "depth") return Value::Int(loop.depth0 + 1);
  if (name == "depth0") return Value::Int(loop.depth0);
  if (name == "previtem") {
    return i > 0 ? items[i - 1] : Value::Undefined("there is no previous item");
  }
  if (name == "nextitem") {
    return i + 1 < n ? items[i + 1] : Value::Undefined("there is no next item");
  }
  if (name == "cycle") {
    return Value::Callable("loop.cycle", [loop_value](Interpreter&, CallArgs& args) -> Value {
      if (args.positional.empty()) Fail("no items for cycling given");
      const size_t k = static_cast<size_t>(loop_value.loop().index0) % args.positional.size();
      return args.positional[k];
    });
  }
  if (name == "changed") {
    return Value::Callable("loop.changed", [loop_value](Interpreter&, CallArgs& args) -> Value {
      LoopData& l = loop_value.loop();
      bool changed = true;
      if (l.last_changed && l.last_changed->size() == args.positional.size()) {
        changed = false;
        for (size_t k = 0; k < args.positional.size(); ++k) {
          if (!Equal((*l.last_changed)[k], args.positional[k])) changed = true;
        }
      }
      if (changed) l.last_changed = args.positional;
      return Value::Bool(changed);
    });
  }
  (void)in;
  return Value::Undefined("'LoopContext' object has no attribute '" + name + "'");
}

}  // namespace

Value Interpreter::GetAttr(const Value& object, const std::string& name) {
  switch (object.kind()) {
    case Kind::kUndefined: FailUndefined(object);
    case Kind::kLoop: return LoopAttr(*this, object, name);
    case Kind::kNamespace: {
      const Value* v = object.ns().attrs.Find(Value::String(name));
      if (v != nullptr) return *v;
      return Value::Undefined("'Namespace' object has no attribute '" + name + "'");
    }
    case Kind::kDict: {
      Value method = StringMethod(object, name);  // dict methods come first, as in Python
      if (!method.is_undefined() || !method.undefined_hint().empty()) return method;
      const Value* v = object.dict().Find(Value::String(name));
      if (v != nullptr) return *v;
      return Value::Undefined("'dict object' has no attribute '" + name + "'");
    }
    case Kind::kString:
    case Kind::kList:
    case Kind::kTuple: {
      Value method = StringMethod(object, name);
      if (!method.is_undefined() || !method.undefined_hint().empty()) return method;
      return Value::Undefined("'" + object.TypeName() + " object' has no attribute '" + name + "'");
    }
    default:
      return Value::Undefined("'" + object.TypeName() + " object' has no attribute '" + name + "'");
  }
}

Value Interpreter::GetItem(const Value& object, const Value& key) {
  switch (object.kind()) {
    case Kind::kUndefined: FailUndefined(object);
    case Kind::kDict: {
      if (key.kind() == Kind::kList || key.kind() == Kind::kDict) {
        Fail("unhashable type: '" + key.TypeName() + "'");
      }
      const Value* v = object.dict().Find(key);
      if (v != nullptr) return *v;
      break;
    }
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kString: {
      if (key.kind() != Kind::kInt && key.kind() != Kind::kBool) break;
      int64_t i = key.int_value();
      if (object.is_string()) {
        ChargeFor(object);
        const std::u32string cps = DecodeUtf8(object.str());
        const int64_t n = static_cast<int64_t>(cps.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::Undefined("string index out of range");
        std::string s;
        AppendUtf8(&s, cps[i]);
        return Value::String(std::move(s));
      }
      const int64_t n = static_cast<int64_t>(object.items().size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::Undefined(object.TypeName() + " index out of range");
      return object.items()[i];
    }
    case Kind::kNamespace:
    case Kind::kLoop: break;
    default: break;
  }
  // jinja2 falls back to the attribute of that name.
  if (key.is_string()) return GetAttr(object, key.str());
  if (object.is_dict()) {
    return Value::Undefined("'dict object' has no attribute " + key.Repr(1 << 10));
  }
  return Value::Undefined("'" + object.TypeName() + " object' has no item " + key.Repr(1 << 10));
}

// ---- Template ------------------------------------------------------------------------------

StatusOr<Template> Template::Parse(std::string_view source) {
  TANDEM_ASSIGN_OR_RETURN(Body body, ParseTemplate(source));
  return Template(std::make_shared<const Body>(std::move(body)));
}

StatusOr<std::string> Template::Render(const std::vector<std::pair<std::string, Value>>& globals,
                                       const Limits& limits) const {
  auto scope = std::make_shared<Scope>();
  scope->parent = Interpreter::BuiltinScope();
  for (const auto& [name, value] : globals) scope->vars[name] = value;
  Interpreter in(limits, scope);
  try {
    return in.Run(*body_);
  } catch (const Error& e) {
    if (e.kind() == Error::Kind::kRaised) return InvalidArgument(e.what());
    return InvalidArgument("line " + std::to_string(e.line()) + ": " + e.what());
  } catch (const std::bad_alloc&) {
    return InvalidArgument("the template ran out of memory");
  }
}

}  // namespace tandem::jinja
