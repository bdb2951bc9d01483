// The chat-template interpreter's insides (server/jinja.h is its interface),
// shared by its three parts: the lexer (jinja_lex.cc: a template into text
// and tags, a tag into tokens), the parser (jinja_parse.cc: tags into the
// AST below) and the evaluator (jinja_eval.cc: the AST's Eval, filters,
// tests, functions and methods, printing; jinja_run.cc: if, for and set).
// Only those files include it.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "server/jinja.h"

namespace kvx::server::jinja {

// Errors travel as this exception inside the interpreter and become a Status
// at Parse/Render (jinja.h says which).
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
  bool refusal = false;  // raise_exception: the template refused the caller's input
};
[[noreturn]] void Fail(const std::string& message, int line);

// One level of recursion counted in `counter` while alive; past `limit` it
// fails: "<what> nested more than <limit> deep".
class Nested {
 public:
  Nested(int& counter, int limit, const char* what, int line) : counter_(counter) {
    if (++counter_ > limit) {
      --counter_;
      Fail(std::string(what) + " nested more than " + std::to_string(limit) + " deep", line);
    }
  }
  ~Nested() { --counter_; }
  Nested(const Nested&) = delete;
  Nested& operator=(const Nested&) = delete;

 private:
  int& counter_;
};

// ---------------------------------------------------------------- lexing (jinja_lex.cc)

struct Tok {
  enum Kind { kName, kString, kInt, kFloat, kOp, kEnd } kind = kEnd;
  std::string text;
  int64_t i = 0;
  double d = 0;
};
// The tokens of one tag's body (a kEnd token last); `line` for errors.
std::vector<Tok> Lex(const std::string& src, int line);

struct Piece {
  enum Kind { kText, kExpr, kStmt } kind;
  std::string text;
  int line;
};

// The template as text and tags, with '-' trimming, trim_blocks and
// lstrip_blocks applied to the text; comments dropped.
std::vector<Piece> Split(const std::string& src);

inline const std::string kSpace = " \t\n\r\f\v";
// `s` without the leading (left) and/or trailing (right) characters in
// `chars`; StripBounds gives where that is in `s`, [first, second).
std::string Strip(const std::string& s, const std::string& chars, bool left, bool right);
std::pair<size_t, size_t> StripBounds(const std::string& s, const std::string& chars, bool left, bool right);

// ---------------------------------------------------------------- the AST (evaluated in jinja_eval.cc and jinja_run.cc)

// What a render has spent so far (jinja.h's Limits), shared by the macro
// calls' scopes.
struct Budget {
  Limits limits;
  int64_t steps = 0;
  size_t bytes = 0;
  int depth = 0;  // expressions and blocks being evaluated
};

struct Scope {
  std::vector<Value::Object> frames;
  // A macro body's scope reads its caller's variables through this (no copy:
  // a call costs the same however many variables the caller holds).
  const Scope* caller = nullptr;
  int macro_depth = 0;  // macro calls in progress: a template's recursion is bounded
  Budget* budget = nullptr;
};
// The innermost binding of `name` (undefined when none); the frames it looks
// through are charged (macro recursion times nested loops can make many).
Value Lookup(Scope& s, const std::string& name, int line);

struct Expr {
  virtual ~Expr() = default;
  // Evaluate, with the render's depth and steps counted and the result's
  // nesting checked.
  Value Eval(Scope& s) const;
  int line = 0;
  int depth = 1;  // of the tree below, this node included (bounded by kMaxNesting)

 protected:
  virtual Value Evaluate(Scope& s) const = 0;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Node {
  virtual ~Node() = default;
  virtual void Run(Scope& s, MarkedText& out) const = 0;
  int line = 0;
};
using Body = std::vector<std::unique_ptr<Node>>;
void RunBody(const Body& body, Scope& s, MarkedText& out);
// Charge the render's budget (jinja.h's Limits): `steps` steps; `bytes` about
// to be built (before building them, so nothing is allocated past the
// budget); a scan of `bytes` bytes (a step per 256).
void SpendSteps(Scope& s, int64_t steps, int line);
void SpendBytes(Scope& s, size_t bytes, int line);
void SpendScan(Scope& s, size_t bytes, int line);
// `text` (with data marks `data`, or none) appended to `out`, charged.
void Emit(Scope& s, MarkedText& out, const std::string& text, const Spans* data, int line);
// A dict's items as [key, value] pairs (charged); a value a namespace
// attribute may hold (jinja.h, kNamespaceDepth), or a template error.
Value Items(Scope& s, const Value& v, int line);
const Value& ForNamespace(const Value& v, int line);
inline constexpr int kMaxMacroDepth = 64;
// Steps a loop iteration or a macro call costs: each makes a frame of
// variables (and a loop object), about ten times an expression's work.
inline constexpr int64_t kFrameSteps = 8;
// What one element of a list or dict is charged.
inline constexpr size_t kElementBytes = sizeof(Value) + 16;

// Expressions.
struct Literal : Expr {
  Value v;
  Value Evaluate(Scope&) const override;
};
struct Name : Expr {
  std::string name;
  Value Evaluate(Scope& s) const override;
};
struct ListExpr : Expr {
  std::vector<ExprPtr> items;
  Value Evaluate(Scope& s) const override;
};
struct DictExpr : Expr {
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
  Value Evaluate(Scope& s) const override;
};
struct Attr : Expr {
  ExprPtr base;
  std::string name;
  Value Evaluate(Scope& s) const override;
};
struct Subscript : Expr {
  ExprPtr base, key;
  Value Evaluate(Scope& s) const override;
};
struct Slice : Expr {
  ExprPtr base, start, stop, step;
  Value Evaluate(Scope& s) const override;
};
struct Unary : Expr {
  std::string op;
  ExprPtr x;
  Value Evaluate(Scope& s) const override;
};
struct Binary : Expr {
  std::string op;
  ExprPtr l, r;
  Value Evaluate(Scope& s) const override;
};
struct Cond : Expr {
  ExprPtr then, cond, otherwise;
  Value Evaluate(Scope& s) const override;
};
struct Filter : Expr {
  ExprPtr x;
  std::string name;
  std::vector<ExprPtr> args;
  Value Evaluate(Scope& s) const override;
};
struct Test : Expr {
  ExprPtr x;
  std::string name;
  bool negate = false;
  ExprPtr arg;
  Value Evaluate(Scope& s) const override;
};
struct Call : Expr {
  ExprPtr callee;  // Name or Attr (a method)
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  Value Evaluate(Scope& s) const override;
};
bool IsKnownFilter(const std::string& name);

// Statements.
struct TextNode : Node {
  std::string text;
  void Run(Scope&, MarkedText& out) const override;
};
struct OutputNode : Node {
  ExprPtr x;
  void Run(Scope& s, MarkedText& out) const override;
};
struct IfNode : Node {
  std::vector<std::pair<ExprPtr, Body>> branches;  // a null condition is the else
  void Run(Scope& s, MarkedText& out) const override;
};
struct ForNode : Node {
  std::vector<std::string> vars;
  ExprPtr iter;
  ExprPtr filter;  // {% for x in xs if cond %}
  Body body, otherwise;
  void Run(Scope& s, MarkedText& out) const override;
  void Bind(Scope& s, const Value& v) const;
};
// {% macro name(params) %}body{% endmacro %}: Run binds `name` in the
// current frame; Call runs the body with the arguments bound.
struct MacroNode : Node {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // per param; null: none
  Body body;
  void Run(Scope& s, MarkedText&) const override;
  Value Call(Scope& caller, std::vector<Value> args, std::vector<std::pair<std::string, Value>> kwargs,
             int call_line) const;
};
struct SetNode : Node {
  std::string name, attr;  // attr: set ns.attr = ...
  ExprPtr x;
  void Run(Scope& s, MarkedText&) const override;
};

// ---------------------------------------------------------------- parsing (jinja_parse.cc)

// The template's nodes (throws Error).
Body ParseTemplate(const std::string& source);

}  // namespace kvx::server::jinja
