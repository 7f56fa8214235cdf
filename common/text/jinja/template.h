// A small Jinja interpreter for chat templates: the subset of Jinja that Hugging Face chat
// templates use, rendered exactly as transformers' apply_chat_template renders them with jinja2
// (ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True), its `tojson` filter
// and `raise_exception` global). No Jinja library exists for C++ in Debian; this one is ours.
//
// Supported: {{ }}, {% %}, {# #}, whitespace control (- and +), raw; if/elif/else; for (tuple
// targets, `if` filter, else, loop.index/index0/revindex/revindex0/first/last/length/previtem/
// nextitem/depth/cycle/changed); set (names, tuples, ns.attr, block set with filters); macro
// and call blocks (caller, varargs, kwargs); filter blocks; with; transformers' generation tag;
// literals, all operators, tests and the filters, string/dict methods and globals listed in
// builtins.cc. Not supported (an error names them): include/extends/block/import, recursive
// loops, loop controls (break/continue: not enabled by transformers either).
//
// Undefined values behave as jinja2's default Undefined: they print as "", are false and
// iterate as empty; attributes, items, calls and arithmetic on them fail.
//
// Thread-safety: a Template is immutable after Parse; Render may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/base/status.h"
#include "common/text/jinja/value.h"

namespace tandem::jinja {

struct Stmt;

// Bounds on one render, so that a hostile template (a request may carry its own) cannot hang
// or exhaust the process: exceeding one is an error, never a crash.
struct Limits {
  int64_t max_steps = 5'000'000;         // nodes evaluated, plus bulk work (bytes copied / 64)
  size_t max_output_bytes = 16u << 20;   // the output, and any one string or printed value
  int max_depth = 256;                   // nested evaluation (macro recursion included)
  int64_t max_range = 100'000;           // range() length, as jinja2's sandbox (MAX_RANGE)
};

class Template {
 public:
  // Parses `source`. InvalidArgument "line N: ..." for a syntax error or unsupported tag.
  static StatusOr<Template> Parse(std::string_view source);

  // Renders with `globals` (name -> value: messages, add_generation_prompt, bos_token, ...),
  // which shadow the built-in globals (range, namespace, raise_exception, ...).
  // InvalidArgument for any error: raise_exception(msg) gives exactly `msg`; other errors
  // "line N: ..." (an undefined value used, a type error, a limit exceeded).
  StatusOr<std::string> Render(const std::vector<std::pair<std::string, Value>>& globals,
                               const Limits& limits = Limits()) const;

 private:
  explicit Template(std::shared_ptr<const std::vector<std::unique_ptr<Stmt>>> body)
      : body_(std::move(body)) {}
  std::shared_ptr<const std::vector<std::unique_ptr<Stmt>>> body_;
};

}  // namespace tandem::jinja
