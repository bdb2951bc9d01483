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
// //, %, **, ~, unary -, x if c else y; string methods strip, lstrip, rstrip,
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
// A sandbox: a template comes from a model file, so it is treated as hostile
// code (docs/serving.md, "Hostile chat templates"). Parsing bounds the
// nesting of expressions and blocks (kMaxNesting); a render bounds the depth
// of evaluation (kMaxEvalDepth), of values (kMaxValueDepth) and of macro
// calls, its steps and the bytes of every value it builds (Limits), and
// checks integer arithmetic (overflow is an error, not a wrap). Whatever the
// template, Parse and Render return an error naming the limit; they never
// crash, spin or allocate without bound.
//
// Data marks: strings made with Value::Data (a chat message's content) are
// the caller's data, not the template's text. Every string built from their
// bytes keeps those bytes marked (concatenation, printing, slices, strip,
// split, replace, join, case changes; a list or dict printed whole is all
// data when it holds any), so RenderMarked says which output bytes came
// from data: the tokenizer reads those as text, never as control tokens
// (server/chat_template.h). A dict key cannot be made of data (an error).
//
// Thread-safety: a parsed Template is immutable; Render is safe from many
// threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "util/status.h"

namespace kvx::server::jinja {

struct MacroNode;

// Byte ranges [first, second) of a string that are data: sorted, disjoint,
// not touching.
using Spans = std::vector<std::pair<size_t, size_t>>;

// A text and its data marks.
struct MarkedText {
  std::string text;
  Spans data;
  // Appends str[begin, end) with the marks `marks` (of str; null: none)
  // give it.
  void Append(const std::string& str, const Spans* marks, size_t begin = 0, size_t end = std::string::npos);
};

// Nesting of expressions (parentheses, operands, operator chains, filters,
// literals) and of blocks in the template's text: the parser recurses
// through it, and evaluating and freeing the tree do too.
inline constexpr int kMaxNesting = 100;
// Expressions and blocks being evaluated at once, macro calls included.
inline constexpr int kMaxEvalDepth = 1000;
// Lists and dicts nested in one value (printing, comparing and freeing it
// recurse). A namespace() counts as half of it, whatever it holds, since its
// attributes may change after it was put in a list; so it cannot hold
// another namespace, and no value can hold itself.
inline constexpr int kMaxValueDepth = 64;
inline constexpr int kNamespaceDepth = kMaxValueDepth / 2;

// What one render may spend; the defaults are far above what real chat
// templates need for a conversation of --max-body's default 8 MiB
// (jinja_sandbox_test.cc).
struct Limits {
  // Expression nodes evaluated, statements and loop iterations run, and the
  // elements (or 256-byte runs of a string) that comparisons, searches and
  // copies go through.
  int64_t max_steps = 4'000'000;
  // Bytes of the strings, lists and dicts built, output included, counted
  // when built (whether or not they are still held).
  size_t max_bytes = size_t{64} << 20;
};

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
  // Strings are shared, immutable: copying a value never copies its bytes.
  explicit Value(std::string s) : v_(std::make_shared<const std::string>(std::move(s))) {}
  explicit Value(const char* s) : Value(std::string(s)) {}
  // A string with data marks (none when `data` is empty).
  Value(std::string s, Spans data);
  explicit Value(MarkedText m) : Value(std::move(m.text), std::move(m.data)) {}
  // A string that is data through and through (see "Data marks" above).
  static Value Data(std::string s) {
    const size_t n = s.size();
    return n == 0 ? Value(std::move(s)) : Value(std::move(s), Spans{{0, n}});
  }
  explicit Value(Array a);
  explicit Value(Object o);
  // A {% macro %}: the node lives in the parsed Template, which outlives
  // every render.
  explicit Value(const MacroNode* m) : v_(m) {}
  // A namespace(): an object whose attributes `set` may change.
  static Value Namespace(Object o) {
    Value v(std::move(o));
    v.ns_ = true;
    v.depth_ = kNamespaceDepth;
    return v;
  }

  bool is_undefined() const { return std::holds_alternative<Undefined>(v_); }
  bool is_none() const { return std::holds_alternative<None>(v_); }
  bool is_bool() const { return std::holds_alternative<bool>(v_); }
  bool is_int() const { return std::holds_alternative<int64_t>(v_); }
  bool is_double() const { return std::holds_alternative<double>(v_); }
  bool is_number() const { return is_int() || is_double(); }
  bool is_string() const { return std::holds_alternative<std::shared_ptr<const std::string>>(v_); }
  bool is_array() const { return std::holds_alternative<std::shared_ptr<Array>>(v_); }
  bool is_object() const { return std::holds_alternative<std::shared_ptr<Object>>(v_); }
  bool is_namespace() const { return ns_; }
  bool is_macro() const { return std::holds_alternative<const MacroNode*>(v_); }

  bool b() const { return std::get<bool>(v_); }
  int64_t i() const { return std::get<int64_t>(v_); }
  double d() const { return is_int() ? static_cast<double>(i()) : std::get<double>(v_); }
  const std::string& s() const { return *std::get<std::shared_ptr<const std::string>>(v_); }
  Array& a() const { return *std::get<std::shared_ptr<Array>>(v_); }
  Object& o() const { return *std::get<std::shared_ptr<Object>>(v_); }
  const MacroNode& macro() const { return *std::get<const MacroNode*>(v_); }
  // A string's data marks; null when none of its bytes is data.
  const Spans* data() const { return data_.get(); }
  // Whether this value, or any value it holds, has data.
  bool HoldsData() const;

  // 0 for scalars, else 1 + the deepest element's (kNamespaceDepth for a
  // namespace()).
  int depth() const { return depth_; }

  bool Truthy() const;
  // As {{ }} prints it. Printing stops soon after `max_bytes` (the result is
  // then longer than max_bytes, and incomplete): a list holding one shared
  // string many times prints far more bytes than it holds.
  std::string Str(size_t max_bytes = SIZE_MAX) const;
  // As tojson prints it; stops like Str.
  std::string Json(size_t max_bytes = SIZE_MAX) const;
  // Adds to *work one per element or 256 bytes compared, when given.
  bool Equals(const Value& other, int64_t* work = nullptr) const;
  const char* TypeName() const;

 private:
  void AppendStr(std::string& out, size_t max_bytes) const;
  void AppendJson(std::string& out, size_t max_bytes) const;

  std::variant<Undefined, None, bool, int64_t, double, std::shared_ptr<const std::string>, std::shared_ptr<Array>,
               std::shared_ptr<Object>, const MacroNode*> v_;
  std::shared_ptr<const Spans> data_;
  int depth_ = 0;
  bool ns_ = false;
};

struct Node;

class Template {
 public:
  // InvalidArgument naming the construct and line for what the subset lacks
  // or the limit the source passes.
  static Result<std::shared_ptr<const Template>> Parse(const std::string& source);
  // Renders with `context` as the global variables. InvalidArgument when the
  // template refuses (raise_exception); Internal, naming the line, when it
  // fails otherwise (a limit, an overflow, a type or construct it cannot
  // evaluate): the template's fault, not the caller's.
  Result<std::string> Render(const Value::Object& context, const Limits& limits = Limits()) const;
  // The same, with the output's data marks.
  Result<MarkedText> RenderMarked(const Value::Object& context, const Limits& limits = Limits()) const;
  ~Template();

 private:
  Template() = default;
  std::vector<std::unique_ptr<Node>> body_;
};

}  // namespace kvx::server::jinja
