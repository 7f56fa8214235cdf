// The values a Jinja template computes with, modelled on the Python objects jinja2 uses: None,
// bool, int, float, str, list, tuple, dict (insertion-ordered), jinja2's Undefined, namespace
// objects, callables (macros, built-in functions, bound string/dict methods) and the `loop`
// object. Lists, tuples, dicts and strings are immutable and shared by reference (the sandbox
// transformers renders in forbids mutating them); a namespace is the one mutable object.
//
// Str() and Repr() print a value exactly as Python's str() and repr() do; ToJson() is
// json.dumps as transformers' `tojson` filter calls it. Values are not thread-safe to share
// while a render mutates a namespace; a Value built by the caller (FromJson, the constructors)
// may be shared by concurrent renders, which never mutate it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/base/status.h"

namespace tandem::jinja {

// A template error inside the interpreter: thrown by value operations and built-ins, caught at
// Template::Render (template.h), which returns it as a Status. `line` 0 = not yet known (the
// evaluator adds the line of the node being evaluated).
class Error : public std::runtime_error {
 public:
  enum class Kind { kRuntime, kRaised, kLimit };
  Error(Kind kind, std::string message, int line = 0)
      : std::runtime_error(message), kind_(kind), line_(line) {}
  Kind kind() const { return kind_; }
  int line() const { return line_; }
  void set_line(int line) { line_ = line; }

 private:
  Kind kind_;
  int line_;
};

[[noreturn]] void Fail(std::string message);  // throws Error(kRuntime)

// The deepest a list/dict value may nest: deeper values could overflow the stack of the
// recursive printers, comparisons and destructors.
inline constexpr int kMaxValueDepth = 128;

class Value;
struct CallArgs;
class Interpreter;

struct ListData {
  std::vector<Value> items;
  int depth = 1;  // 1 + the deepest element's depth
};
struct DictData {
  std::vector<std::pair<Value, Value>> items;  // insertion order, unique keys
  int depth = 1;
  const Value* Find(const Value& key) const;
};
struct NamespaceData {
  DictData attrs;
};
// A callable: its name (for messages) and its body. `self` is bound for methods.
struct CallableData {
  std::string name;
  std::function<Value(Interpreter&, CallArgs&)> fn;
};
// The `loop` variable of a for loop (its fields change as the loop advances).
struct LoopData {
  std::shared_ptr<const ListData> items;
  int64_t index0 = 0;
  int depth0 = 0;
  std::optional<std::vector<Value>> last_changed;  // loop.changed()
};

enum class Kind {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kTuple,
  kDict,
  kNamespace,
  kCallable,
  kLoop,
};

class Value {
 public:
  Value() = default;  // Undefined
  static Value Undefined(std::string hint = "");
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double d);
  static Value String(std::string s);
  // Throws Error when an element nests deeper than kMaxValueDepth.
  static Value List(std::vector<Value> items);
  static Value Tuple(std::vector<Value> items);
  static Value Dict(std::vector<std::pair<Value, Value>> items);  // later duplicates win
  static Value Namespace(std::shared_ptr<NamespaceData> ns);
  static Value Callable(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn);
  static Value Loop(std::shared_ptr<LoopData> loop);
  // JSON -> Value: objects are dicts (in the json's key order: ordered_json keeps the
  // document's, as Python does; json sorts them), arrays lists, integers ints (beyond int64:
  // floats). InvalidArgument when nested deeper than kMaxValueDepth.
  static StatusOr<Value> FromJson(const nlohmann::json& json);
  static StatusOr<Value> FromJson(const nlohmann::ordered_json& json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_int() const { return kind_ == Kind::kInt; }  // not bool
  bool is_number() const {
    return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool;
  }
  bool is_sequence() const { return kind_ == Kind::kList || kind_ == Kind::kTuple; }
  bool is_dict() const { return kind_ == Kind::kDict; }

  bool bool_value() const { return b_; }
  int64_t int_value() const { return kind_ == Kind::kBool ? (b_ ? 1 : 0) : i_; }
  double float_value() const { return kind_ == Kind::kFloat ? f_ : static_cast<double>(int_value()); }
  const std::string& str() const { return *s_; }               // kString
  const std::string& undefined_hint() const { return *s_; }    // kUndefined ("" = none)
  const std::vector<Value>& items() const { return list_->items; }  // kList, kTuple
  const std::shared_ptr<const ListData>& list_data() const { return list_; }
  const DictData& dict() const { return *dict_; }               // kDict
  NamespaceData& ns() const { return *ns_; }                    // kNamespace
  const CallableData& callable() const { return *callable_; }  // kCallable
  LoopData& loop() const { return *loop_; }                     // kLoop
  int depth() const;

  // Python truthiness.
  bool Truthy() const;
  // Python's type name ("str", "int", "dict", "NoneType", "Undefined", ...).
  std::string TypeName() const;
  // str(value) / repr(value) as Python prints them; `limit` bounds the result's size (Error
  // of kind kLimit beyond it).
  std::string Str(size_t limit) const;
  std::string Repr(size_t limit) const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::shared_ptr<const std::string> s_ = EmptyString();
  std::shared_ptr<const ListData> list_;
  std::shared_ptr<const DictData> dict_;
  std::shared_ptr<NamespaceData> ns_;
  std::shared_ptr<const CallableData> callable_;
  std::shared_ptr<LoopData> loop_;

  static const std::shared_ptr<const std::string>& EmptyString();
};

// Python ==. Never throws.
bool Equal(const Value& a, const Value& b);
// Python <: ints, floats and bools with each other, strings, lists/tuples lexicographically;
// anything else throws Error ("'<' not supported between ...").
bool Less(const Value& a, const Value& b);

// Positional and keyword arguments of a call.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;
};

// Binds `args` to the parameter names of built-in `what` (for messages) as Python would:
// positionals first, then keywords; throws Error on too many positionals, an unknown or
// repeated keyword. Missing parameters are nullopt.
std::vector<std::optional<Value>> BindArgs(const CallArgs& args,
                                           std::initializer_list<const char*> names,
                                           std::string_view what);

struct JsonOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // nullopt = one line
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};
// json.dumps(value, ...) as Python prints it. Throws Error for values JSON cannot hold
// (Undefined, callables, namespaces) and beyond `limit` bytes.
std::string ToJson(const Value& value, const JsonOptions& options, size_t limit);

// UTF-8 helpers (invalid bytes decode as U+FFFD, one per byte).
std::u32string DecodeUtf8(std::string_view s);
std::string EncodeUtf8(std::u32string_view s);
void AppendUtf8(std::string* out, char32_t c);
size_t CodePointCount(std::string_view s);
// Python's str.isspace() for one code point.
bool IsPythonSpace(char32_t c);

}  // namespace tandem::jinja
