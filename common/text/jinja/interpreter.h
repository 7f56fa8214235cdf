// The tree-walking evaluator behind Template::Render (template.h) and the built-in filters,
// tests, methods and globals it calls (builtins.cc). Internal to common/text/jinja.
//
// Scoping follows jinja2: the template body runs in a scope under the render's globals (which
// sit under the built-ins); each for-loop iteration, macro call, `with` and block `set` runs in
// a fresh child scope, so a `set` inside a loop is gone after the iteration (namespace() is the
// way out); `if` opens no scope. Errors are thrown as jinja::Error and carry the line of the
// innermost node being evaluated.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/text/jinja/ast.h"
#include "common/text/jinja/template.h"
#include "common/text/jinja/value.h"

namespace tandem::jinja {

struct Scope {
  std::shared_ptr<Scope> parent;
  std::unordered_map<std::string, Value> vars;
};

class Interpreter {
 public:
  Interpreter(const Limits& limits, std::shared_ptr<Scope> globals);
  ~Interpreter();  // breaks reference cycles through namespaces

  // Renders `body` in a child scope of the globals.
  std::string Run(const Body& body);

  const Limits& limits() const { return limits_; }
  // Counts `n` steps of work against Limits::max_steps.
  void Charge(int64_t n);
  // Charges for work proportional to `v`'s size (a string's bytes / 64, a container's items):
  // what comparing, searching, indexing or filtering it may cost.
  void ChargeFor(const Value& v);
  // Throws a kLimit Error when a string of `bytes` would exceed the size limit.
  void CheckSize(size_t bytes) const;

  Value Call(const Value& callee, CallArgs& args);
  Value ApplyFilter(const std::string& name, const Value& subject, CallArgs& args);
  bool ApplyTest(const std::string& name, const Value& subject, CallArgs& args);
  Value GetAttr(const Value& object, const std::string& name);
  Value GetItem(const Value& object, const Value& key);
  // The items a for loop (or list()) sees: list/tuple elements, dict keys, string characters;
  // Undefined is empty; anything else throws.
  std::vector<Value> Iterate(const Value& value);
  std::shared_ptr<NamespaceData> NewNamespace();
  // str(v), charged by its size.
  std::string Str(const Value& v);

  // Built-ins (builtins.cc).
  static std::shared_ptr<Scope> BuiltinScope();
  Value StringMethod(const Value& self, const std::string& name);  // Undefined if unknown
  static Value BinaryOp(Interpreter& in, const std::string& op, const Value& a, const Value& b);

 private:
  struct DepthGuard;

  void Exec(const Body& body, const std::shared_ptr<Scope>& scope, std::string* out);
  void ExecStmt(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string* out);
  void ExecFor(const Stmt& s, const std::shared_ptr<Scope>& scope, std::string* out);
  void ExecSet(const Stmt& s, const std::shared_ptr<Scope>& scope);
  Value MakeMacro(const Stmt& s, const std::shared_ptr<Scope>& scope, const Body* body,
                  const std::vector<MacroParam>* params, const std::string& name);
  Value Eval(const Expr& e, const std::shared_ptr<Scope>& scope);
  Value EvalCompare(const Expr& e, const std::shared_ptr<Scope>& scope);
  Value EvalSlice(const Expr& e, const std::shared_ptr<Scope>& scope);
  CallArgs EvalArgs(const Expr& e, size_t first, const std::shared_ptr<Scope>& scope);
  void Assign(const std::vector<std::string>& targets, bool unpack, const Value& value,
              Scope* scope);
  void Append(std::string* out, const std::string& text);

  Limits limits_;
  std::shared_ptr<Scope> globals_;
  int64_t steps_ = 0;
  int depth_ = 0;
  std::vector<std::shared_ptr<NamespaceData>> namespaces_;
};

// Python's `x in container` (str in str, element in list/tuple, key in dict).
bool Contains(const Value& container, const Value& item);
// Throws the UndefinedError an operation on `v` raises ("'x' is undefined").
[[noreturn]] void FailUndefined(const Value& v);

}  // namespace tandem::jinja
