// A Jinja-subset interpreter for chat templates (Hugging Face's
// `tokenizer.chat_template`, stored in GGUF metadata): no C++ Jinja library
// is packaged in Debian, and chat templates use a small part of the
// language. Rendering follows Hugging Face's apply_chat_template
// environment: trim_blocks and lstrip_blocks on.
//
// Supported: text; {{ expr }}, {% stmt %}, {# comments #}, with '-' trimming;
// statements if/elif/else/endif, for/endfor (loop.index, index0, first,
// last, length, revindex; `for a, b in x.items()`), set (also
// `set ns.attr = ...` on a namespace()); expressions: literals (strings,
// numbers, true/false/none in either case, lists, dicts), names, a.b, a[b],
// slices a[i:j], calls, filters (trim, length, upper, lower, capitalize,
// title, default, tojson, string, int, join, first, last, list, replace,
// items), tests (defined, undefined, none, string, number, mapping,
// iterable, sequence, true, false, even, odd, in `is` / `is not`),
// operators or, and, not, in, not in, ==, !=, <, <=, >, >=, +, -, *, /,
// //, %, ~, unary -, x if c else y; string methods strip, lstrip, rstrip,
// startswith, endswith, upper, lower, split, replace, title; dict methods
// get, items, keys, values; functions raise_exception(msg), namespace(...),
// range(n); macros ({% macro f(a, b=default) %}...{% endmacro %}, called as
// f(x, b=y): positional and keyword arguments, defaults evaluated at the
// call; the body sees the caller's variables, and its sets stay inside).
// Anything else (call and filter blocks, include/import/extends: a GGUF
// template is one string with nothing to load; unknown filters, tests or
// functions) is an InvalidArgument naming the construct and its line, at
// parse time when it can be seen there.
//
// Thread-safety: a parsed Template is immutable; Render is safe from many
// threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "util/status.h"

namespace kvx::server::jinja {

struct MacroNode;

class Value {
 public:
  using Array = std::vector<Value>;
  using Object = std::map<std::string, Value>;
  struct Undefined {};
  struct None {};

  Value() : v_(Undefined{}) {}
  explicit Value(None) : v_(None{}) {}
  explicit Value(bool b) : v_(b) {}
  explicit Value(int64_t i) : v_(i) {}
  explicit Value(int i) : v_(static_cast<int64_t>(i)) {}
  explicit Value(double d) : v_(d) {}
  explicit Value(std::string s) : v_(std::move(s)) {}
  explicit Value(const char* s) : v_(std::string(s)) {}
  explicit Value(Array a) : v_(std::make_shared<Array>(std::move(a))) {}
  explicit Value(Object o) : v_(std::make_shared<Object>(std::move(o))) {}
  // A {% macro %}: the node lives in the parsed Template, which outlives
  // every render.
  explicit Value(const MacroNode* m) : v_(m) {}
  // A namespace(): an object whose attributes `set` may change.
  static Value Namespace(Object o) {
    Value v(std::move(o));
    v.ns_ = true;
    return v;
  }

  bool is_undefined() const { return std::holds_alternative<Undefined>(v_); }
  bool is_none() const { return std::holds_alternative<None>(v_); }
  bool is_bool() const { return std::holds_alternative<bool>(v_); }
  bool is_int() const { return std::holds_alternative<int64_t>(v_); }
  bool is_double() const { return std::holds_alternative<double>(v_); }
  bool is_number() const { return is_int() || is_double(); }
  bool is_string() const { return std::holds_alternative<std::string>(v_); }
  bool is_array() const { return std::holds_alternative<std::shared_ptr<Array>>(v_); }
  bool is_object() const { return std::holds_alternative<std::shared_ptr<Object>>(v_); }
  bool is_namespace() const { return ns_; }
  bool is_macro() const { return std::holds_alternative<const MacroNode*>(v_); }

  bool b() const { return std::get<bool>(v_); }
  int64_t i() const { return std::get<int64_t>(v_); }
  double d() const { return is_int() ? static_cast<double>(i()) : std::get<double>(v_); }
  const std::string& s() const { return std::get<std::string>(v_); }
  Array& a() const { return *std::get<std::shared_ptr<Array>>(v_); }
  Object& o() const { return *std::get<std::shared_ptr<Object>>(v_); }
  const MacroNode& macro() const { return *std::get<const MacroNode*>(v_); }

  bool Truthy() const;
  // As {{ }} prints it.
  std::string Str() const;
  // As tojson prints it.
  std::string Json() const;
  bool Equals(const Value& other) const;
  const char* TypeName() const;

 private:
  std::variant<Undefined, None, bool, int64_t, double, std::string, std::shared_ptr<Array>, std::shared_ptr<Object>,
               const MacroNode*> v_;
  bool ns_ = false;
};

struct Node;

class Template {
 public:
  // InvalidArgument naming the construct and line for what the subset lacks.
  static Result<std::shared_ptr<const Template>> Parse(const std::string& source);
  // Renders with `context` as the global variables.
  Result<std::string> Render(const Value::Object& context) const;
  ~Template();

 private:
  Template() = default;
  std::vector<std::unique_ptr<Node>> body_;
};

}  // namespace kvx::server::jinja
