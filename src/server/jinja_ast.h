// The chat-template interpreter's insides (server/jinja.h is its interface),
// shared by its three parts: the lexer (jinja_lex.cc: a template into text
// and tags, a tag into tokens), the parser (jinja_parse.cc: tags into the
// AST below) and the evaluator (jinja_eval.cc: the AST's Eval/Run, filters,
// tests, functions and methods). Only those files include it.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "server/jinja.h"

namespace kvx::server::jinja {

// Errors travel as this exception inside the interpreter and become an
// InvalidArgument at Parse/Render.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] void Fail(const std::string& message, int line);

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
// `s` without the leading (left) and/or trailing (right) characters in `chars`.
std::string Strip(const std::string& s, const std::string& chars, bool left, bool right);

// ---------------------------------------------------------------- the AST (evaluated in jinja_eval.cc)

struct Scope {
  std::vector<Value::Object> frames;
  int macro_depth = 0;  // macro calls in progress: a template's recursion is bounded
  // Statements run so far in this render, shared with the macro calls' scopes:
  // a template from a (possibly hostile) GGUF cannot make a request spin.
  int64_t* work = nullptr;
  Value Get(const std::string& name) const {
    for (auto it = frames.rbegin(); it != frames.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return Value();
  }
};

struct Expr {
  virtual ~Expr() = default;
  virtual Value Eval(Scope& s) const = 0;
  int line = 0;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Node {
  virtual ~Node() = default;
  virtual void Run(Scope& s, std::string& out) const = 0;
  int line = 0;
};
using Body = std::vector<std::unique_ptr<Node>>;
void RunBody(const Body& body, Scope& s, std::string& out);
// One unit of a render's work (a statement, a loop item); fails past kMaxRenderWork.
void CountWork(Scope& s, int line);
// A render's limits: statements run (loop iterations and macro calls
// included), text produced, and range() lengths.
inline constexpr int64_t kMaxRenderWork = 1'000'000;
inline constexpr size_t kMaxRenderBytes = size_t{64} << 20;
inline constexpr int64_t kMaxRange = 1'000'000;
inline constexpr int kMaxMacroDepth = 64;

// Expressions.
struct Literal : Expr {
  Value v;
  Value Eval(Scope&) const override;
};
struct Name : Expr {
  std::string name;
  Value Eval(Scope& s) const override;
};
struct ListExpr : Expr {
  std::vector<ExprPtr> items;
  Value Eval(Scope& s) const override;
};
struct DictExpr : Expr {
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
  Value Eval(Scope& s) const override;
};
struct Attr : Expr {
  ExprPtr base;
  std::string name;
  Value Eval(Scope& s) const override;
};
struct Subscript : Expr {
  ExprPtr base, key;
  Value Eval(Scope& s) const override;
};
struct Slice : Expr {
  ExprPtr base, start, stop, step;
  Value Eval(Scope& s) const override;
};
struct Unary : Expr {
  std::string op;
  ExprPtr x;
  Value Eval(Scope& s) const override;
};
struct Binary : Expr {
  std::string op;
  ExprPtr l, r;
  Value Eval(Scope& s) const override;
};
struct Cond : Expr {
  ExprPtr then, cond, otherwise;
  Value Eval(Scope& s) const override;
};
struct Filter : Expr {
  ExprPtr x;
  std::string name;
  std::vector<ExprPtr> args;
  Value Eval(Scope& s) const override;
};
struct Test : Expr {
  ExprPtr x;
  std::string name;
  bool negate = false;
  ExprPtr arg;
  Value Eval(Scope& s) const override;
};
struct Call : Expr {
  ExprPtr callee;  // Name or Attr (a method)
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  Value Eval(Scope& s) const override;
};
bool IsKnownFilter(const std::string& name);

// Statements.
struct TextNode : Node {
  std::string text;
  void Run(Scope&, std::string& out) const override;
};
struct OutputNode : Node {
  ExprPtr x;
  void Run(Scope& s, std::string& out) const override;
};
struct IfNode : Node {
  std::vector<std::pair<ExprPtr, Body>> branches;  // a null condition is the else
  void Run(Scope& s, std::string& out) const override;
};
struct ForNode : Node {
  std::vector<std::string> vars;
  ExprPtr iter;
  ExprPtr filter;  // {% for x in xs if cond %}
  Body body, otherwise;
  void Run(Scope& s, std::string& out) const override;
  void Bind(Scope& s, const Value& v) const;
};
// {% macro name(params) %}body{% endmacro %}: Run binds `name` in the
// current frame; Call runs the body with the arguments bound.
struct MacroNode : Node {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // per param; null: none
  Body body;
  void Run(Scope& s, std::string&) const override;
  Value Call(Scope& caller, std::vector<Value> args, std::vector<std::pair<std::string, Value>> kwargs,
             int call_line) const;
};
struct SetNode : Node {
  std::string name, attr;  // attr: set ns.attr = ...
  ExprPtr x;
  void Run(Scope& s, std::string&) const override;
};

// ---------------------------------------------------------------- parsing (jinja_parse.cc)

// The template's nodes (throws Error).
Body ParseTemplate(const std::string& source);

}  // namespace kvx::server::jinja
