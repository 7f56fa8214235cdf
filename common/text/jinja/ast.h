// The syntax tree of a parsed template (parser.h builds it, interpreter.cc walks it). Plain
// structs: one Expr type and one Stmt type with a kind and the fields each kind uses.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/text/jinja/value.h"

namespace tandem::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  kConst,      // value
  kName,       // name
  kAttr,       // a.name: args[0] = object
  kItem,       // a[b]: args[0] = object, args[1] = key
  kSlice,      // a[b:c:d]: args[0] = object, args[1..3] = start/stop/step (null = absent)
  kCall,       // args[0] = callee, args[1..] = positional; kwargs; star/starstar
  kFilter,     // name, args[0] = subject (null in a filter block), args[1..]; kwargs
  kTest,       // name, args[0] = subject, args[1..]; kwargs; negated
  kNeg,        // -args[0]
  kPos,        // +args[0]
  kNot,        // not args[0]
  kBinary,     // op in name: + - * / // % ** ~ ; args[0], args[1]
  kAnd,        // args[0] and args[1]
  kOr,         // args[0] or args[1]
  kCompare,    // args[0] op[0] args[1] op[1] args[2] ...; ops: == != < <= > >= in notin
  kCond,       // args[1] if args[0] else args[2] (args[2] null = undefined)
  kList,       // [args...]
  kTuple,      // (args...)
  kDict,       // {args[0]: args[1], ...}
};

struct Expr {
  ExprKind kind = ExprKind::kConst;
  int line = 0;
  Value value;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // kCompare
  ExprPtr star;                  // *args in a call
  ExprPtr starstar;              // **kwargs in a call
  bool negated = false;          // kTest
  int height = 1;                // 1 + the tallest child's height (the parser bounds it)
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class StmtKind {
  kText,       // text
  kPrint,      // {{ expr }}
  kIf,         // conds[i] -> bodies[i]; else_body
  kFor,        // targets in expr [if cond]: body; else_body
  kSet,        // targets (or ns_attr) = expr
  kSetBlock,   // targets[0] = rendered body, through filter (may be null)
  kMacro,      // name(params with defaults): body
  kCallBlock,  // {% call(params) expr %}body: the body is `caller`
  kFilterBlock,  // {% filter f %}body: filter.args[0] is null, filled with the body's text
  kWith,       // {% with a = x, ... %}body
  kGeneration,   // transformers' {% generation %}body{% endgeneration %}: renders body
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null = required
};

struct Stmt {
  StmtKind kind = StmtKind::kText;
  int line = 0;
  std::string text;
  ExprPtr expr;
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
  Body body;
  Body else_body;
  std::vector<std::string> targets;  // loop/set names (several = tuple unpacking)
  bool unpack = false;               // the target was a tuple, even of one name
  std::string ns_attr;               // {% set ns.attr = ... %}: targets[0] = ns
  ExprPtr cond;                      // for ... if cond
  ExprPtr filter;                    // set block / filter block
  std::string name;                  // macro
  std::vector<MacroParam> params;    // macro / call block
  std::vector<std::pair<std::string, ExprPtr>> assigns;  // with
  bool recursive = false;
};

}  // namespace tandem::jinja
