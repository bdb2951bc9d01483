// The parser: the template's tags into the AST (jinja_ast.h), expressions
// by recursive descent in Jinja's precedence order.
#include <algorithm>
#include <initializer_list>
#include <string>
#include <vector>

#include "server/jinja_ast.h"

namespace kvx::server::jinja {
namespace {

class ExprParser {
 public:
  ExprParser(std::vector<Tok> toks, int line) : t_(std::move(toks)), line_(line) {}

  ExprPtr Parse() {
    Nested n = Deeper();
    return Ternary();
  }
  const Tok& Peek(size_t k = 0) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  bool AtEnd() const { return Peek().kind == Tok::kEnd; }
  bool IsOp(const char* op, size_t k = 0) const { return Peek(k).kind == Tok::kOp && Peek(k).text == op; }
  bool IsName(const char* n, size_t k = 0) const { return Peek(k).kind == Tok::kName && Peek(k).text == n; }
  Tok Next() { return t_[std::min(p_++, t_.size() - 1)]; }
  void Expect(const char* op) {
    if (!IsOp(op)) Fail(std::string("expected '") + op + "' but found '" + Peek().text + "'", line_);
    ++p_;
  }
  std::string ExpectName() {
    if (Peek().kind != Tok::kName) Fail("expected a name, found '" + Peek().text + "'", line_);
    return Next().text;
  }

 private:
  // The parser recurses once per Deeper() alive.
  Nested Deeper() { return Nested(nesting_, kMaxNesting, "expressions", line_); }
  template <class T>
  std::unique_ptr<T> Make() {
    auto e = std::make_unique<T>();
    e->line = line_;
    return e;
  }
  // `child` (may be null), to be held by `parent`, whose depth it raises:
  // chains built by the loops below do not recurse here, but evaluating and
  // freeing them do.
  ExprPtr Adopt(Expr& parent, ExprPtr child) {
    if (child) {
      parent.depth = std::max(parent.depth, child->depth + 1);
      if (parent.depth > kMaxNesting) {
        Fail("expressions nested more than " + std::to_string(kMaxNesting) + " deep", line_);
      }
    }
    return child;
  }
  ExprPtr Ternary() {
    ExprPtr x = Or();
    if (IsName("if")) {
      ++p_;
      auto c = Make<Cond>();
      c->then = Adopt(*c, std::move(x));
      c->cond = Adopt(*c, Or());
      if (IsName("else")) {
        ++p_;
        Nested n = Deeper();
        c->otherwise = Adopt(*c, Ternary());
      }
      return c;
    }
    return x;
  }
  ExprPtr Bin(ExprPtr l, std::string op, ExprPtr r) {
    auto b = Make<Binary>();
    b->l = Adopt(*b, std::move(l));
    b->op = std::move(op);
    b->r = Adopt(*b, std::move(r));
    return b;
  }
  // One left-associative level: operands of the level `next`, joined by any
  // of `ops` (operator tokens, or the word operators and/or).
  ExprPtr LeftAssoc(std::initializer_list<const char*> ops, ExprPtr (ExprParser::*next)()) {
    ExprPtr x = (this->*next)();
    for (;;) {
      const char* hit = nullptr;
      for (const char* op : ops) {
        if (IsOp(op) || IsName(op)) hit = op;
      }
      if (hit == nullptr) return x;
      ++p_;
      x = Bin(std::move(x), hit, (this->*next)());
    }
  }
  // A prefix operator (not, unary -) applied to its own level `self`, else
  // the level `next`.
  ExprPtr Prefix(const char* op, ExprPtr (ExprParser::*self)(), ExprPtr (ExprParser::*next)()) {
    if (!IsOp(op) && !IsName(op)) return (this->*next)();
    ++p_;
    auto u = Make<Unary>();
    u->op = op;
    Nested n = Deeper();
    u->x = Adopt(*u, (this->*self)());
    return u;
  }
  ExprPtr Or() { return LeftAssoc({"or"}, &ExprParser::And); }
  ExprPtr And() { return LeftAssoc({"and"}, &ExprParser::Not); }
  ExprPtr Not() { return Prefix("not", &ExprParser::Not, &ExprParser::Compare); }
  ExprPtr Compare() {
    ExprPtr x = Concat();
    for (;;) {
      if (IsName("in")) {
        ++p_;
        x = Bin(std::move(x), "in", Concat());
      } else if (IsName("not") && IsName("in", 1)) {
        p_ += 2;
        x = Bin(std::move(x), "not in", Concat());
      } else if (IsName("is")) {
        ++p_;
        auto t = Make<Test>();
        if (IsName("not")) {
          ++p_;
          t->negate = true;
        }
        t->x = Adopt(*t, std::move(x));
        if (IsName("none") || IsName("None")) {
          ++p_;
          t->name = "none";
        } else if (IsName("true") || IsName("false")) {
          t->name = Next().text;
        } else {
          t->name = ExpectName();
        }
        if (t->name == "equalto" || t->name == "eq") {
          if (IsOp("(")) {
            ++p_;
            t->arg = Adopt(*t, Parse());
            Expect(")");
          } else {
            t->arg = Adopt(*t, Concat());
          }
        }
        x = std::move(t);
      } else {
        const char* ops[] = {"==", "!=", "<=", ">=", "<", ">"};
        const char* hit = nullptr;
        for (const char* op : ops) {
          if (IsOp(op)) hit = op;
        }
        if (hit == nullptr) return x;
        ++p_;
        x = Bin(std::move(x), hit, Concat());
      }
    }
  }
  ExprPtr Concat() { return LeftAssoc({"~"}, &ExprParser::Add); }
  ExprPtr Add() { return LeftAssoc({"+", "-"}, &ExprParser::Mul); }
  ExprPtr Mul() { return LeftAssoc({"*", "/", "//", "%"}, &ExprParser::Pow); }
  // Jinja's ** binds looser than unary minus (-2 ** 2 is 4) and groups left.
  ExprPtr Pow() { return LeftAssoc({"**"}, &ExprParser::UnaryMinus); }
  ExprPtr UnaryMinus() { return Prefix("-", &ExprParser::UnaryMinus, &ExprParser::Filtered); }
  ExprPtr Filtered() {
    ExprPtr x = Postfix();
    while (IsOp("|")) {
      ++p_;
      auto f = Make<Filter>();
      f->x = Adopt(*f, std::move(x));
      f->name = ExpectName();
      if (!IsKnownFilter(f->name)) Fail("unsupported filter '" + f->name + "'", line_);
      if (IsOp("(")) {
        ++p_;
        while (!IsOp(")")) {
          if (Peek().kind == Tok::kName && IsOp("=", 1)) p_ += 2;  // keyword arguments by position
          f->args.push_back(Adopt(*f, Parse()));
          if (!IsOp(")")) Expect(",");
        }
        ++p_;
      }
      x = std::move(f);
    }
    return x;
  }
  ExprPtr Postfix() {
    ExprPtr x = Primary();
    for (;;) {
      if (IsOp(".")) {
        ++p_;
        auto a = Make<Attr>();
        a->base = Adopt(*a, std::move(x));
        a->name = ExpectName();
        x = std::move(a);
      } else if (IsOp("[")) {
        ++p_;
        ExprPtr start, stop, step;
        if (!IsOp(":")) start = Parse();
        if (IsOp(":")) {
          ++p_;
          auto sl = Make<Slice>();
          sl->base = Adopt(*sl, std::move(x));
          sl->start = Adopt(*sl, std::move(start));
          if (!IsOp("]") && !IsOp(":")) sl->stop = Adopt(*sl, Parse());
          if (IsOp(":")) {
            ++p_;
            if (!IsOp("]")) sl->step = Adopt(*sl, Parse());
          }
          Expect("]");
          x = std::move(sl);
        } else {
          Expect("]");
          auto sub = Make<Subscript>();
          sub->base = Adopt(*sub, std::move(x));
          sub->key = Adopt(*sub, std::move(start));
          x = std::move(sub);
        }
      } else if (IsOp("(")) {
        ++p_;
        auto c = Make<Call>();
        c->callee = Adopt(*c, std::move(x));
        while (!IsOp(")")) {
          if (Peek().kind == Tok::kName && IsOp("=", 1)) {
            std::string k = Next().text;
            ++p_;
            c->kwargs.emplace_back(std::move(k), Adopt(*c, Parse()));
          } else {
            c->args.push_back(Adopt(*c, Parse()));
          }
          if (!IsOp(")")) Expect(",");
        }
        ++p_;
        x = std::move(c);
      } else {
        return x;
      }
    }
  }
  ExprPtr Primary() {
    const Tok t = Next();
    switch (t.kind) {
      case Tok::kString: {
        auto l = Make<Literal>();
        std::string s = t.text;
        while (Peek().kind == Tok::kString) s += Next().text;  // adjacent literals concatenate
        l->v = Value(std::move(s));
        return l;
      }
      case Tok::kInt: {
        auto l = Make<Literal>();
        l->v = Value(t.i);
        return l;
      }
      case Tok::kFloat: {
        auto l = Make<Literal>();
        l->v = Value(t.d);
        return l;
      }
      case Tok::kName: {
        auto l = Make<Literal>();
        if (t.text == "true" || t.text == "True") l->v = Value(true);
        else if (t.text == "false" || t.text == "False") l->v = Value(false);
        else if (t.text == "none" || t.text == "None") l->v = Value(Value::None{});
        else {
          auto n = Make<Name>();
          n->name = t.text;
          return n;
        }
        return l;
      }
      case Tok::kOp:
        if (t.text == "(") {
          ExprPtr x = Parse();
          Expect(")");
          return x;
        }
        if (t.text == "[") {
          auto l = Make<ListExpr>();
          while (!IsOp("]")) {
            l->items.push_back(Adopt(*l, Parse()));
            if (!IsOp("]")) Expect(",");
          }
          ++p_;
          return l;
        }
        if (t.text == "{") {
          auto d = Make<DictExpr>();
          while (!IsOp("}")) {
            ExprPtr k = Adopt(*d, Parse());
            Expect(":");
            d->items.emplace_back(std::move(k), Adopt(*d, Parse()));
            if (!IsOp("}")) Expect(",");
          }
          ++p_;
          return d;
        }
        Fail("unexpected '" + t.text + "'", line_);
      case Tok::kEnd: Fail("the expression ends too early", line_);
    }
    Fail("bad expression", line_);
  }

  std::vector<Tok> t_;
  size_t p_ = 0;
  int line_;
  int nesting_ = 0;
};

// ---------------------------------------------------------------- statements

class Parser {
 public:
  explicit Parser(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  // Parses nodes until a statement whose first word is in `ends` (returned
  // in *end, its tokens in *end_toks), or the end of input (ends empty).
  Body ParseBody(const std::vector<std::string>& ends, std::string* end, std::vector<Tok>* end_toks, int* end_line) {
    Body body;
    while (k_ < pieces_.size()) {
      const Piece& pc = pieces_[k_++];
      if (pc.kind == Piece::kText) {
        auto t = std::make_unique<TextNode>();
        t->text = pc.text;
        body.push_back(std::move(t));
        continue;
      }
      std::vector<Tok> toks = Lex(pc.text, pc.line);
      if (pc.kind == Piece::kExpr) {
        ExprParser ep(std::move(toks), pc.line);
        auto o = std::make_unique<OutputNode>();
        o->line = pc.line;
        o->x = ep.Parse();
        if (!ep.AtEnd()) Fail("unexpected '" + ep.Peek().text + "' in {{ }}", pc.line);
        body.push_back(std::move(o));
        continue;
      }
      if (toks.empty() || toks[0].kind != Tok::kName) Fail("a {% %} tag must start with a statement name", pc.line);
      const std::string word = toks[0].text;
      if (std::find(ends.begin(), ends.end(), word) != ends.end()) {
        *end = word;
        *end_toks = std::move(toks);
        *end_line = pc.line;
        return body;
      }
      body.push_back(Statement(word, std::move(toks), pc.line));
    }
    if (!ends.empty()) Fail("missing {% " + ends.back() + " %}", pieces_.empty() ? 1 : pieces_.back().line);
    return body;
  }

 private:
  std::unique_ptr<Node> Statement(const std::string& word, std::vector<Tok> toks, int line) {
    Nested nested(nesting_, kMaxNesting, "blocks", line);  // ParseBody and Statement recurse per block
    ExprParser ep(std::move(toks), line);
    ep.Next();  // the statement word
    auto done = [&] {
      if (!ep.AtEnd()) Fail("unexpected '" + ep.Peek().text + "' in {% " + word + " %}", line);
    };
    std::string end;
    std::vector<Tok> end_toks;
    int end_line = line;
    if (word == "if") {
      auto n = std::make_unique<IfNode>();
      n->line = line;
      ExprPtr cond = ep.Parse();
      done();
      for (;;) {
        Body b = ParseBody({"elif", "else", "endif"}, &end, &end_toks, &end_line);
        n->branches.emplace_back(std::move(cond), std::move(b));
        if (end == "endif") break;
        ExprParser e2(std::move(end_toks), end_line);
        e2.Next();
        if (end == "elif") {
          cond = e2.Parse();
        } else {
          cond = nullptr;
          Body b2 = ParseBody({"endif"}, &end, &end_toks, &end_line);
          n->branches.emplace_back(nullptr, std::move(b2));
          break;
        }
      }
      return n;
    }
    if (word == "for") {
      auto n = std::make_unique<ForNode>();
      n->line = line;
      n->vars.push_back(ep.ExpectName());
      while (ep.IsOp(",")) {
        ep.Next();
        n->vars.push_back(ep.ExpectName());
      }
      if (!ep.IsName("in")) Fail("expected 'in' in {% for %}", line);
      ep.Next();
      n->iter = ep.Parse();
      if (dynamic_cast<Cond*>(n->iter.get()) != nullptr) {  // "for x in xs if c": Parse took it as a ternary
        auto* c = static_cast<Cond*>(n->iter.get());
        if (c->otherwise) Fail("unexpected 'else' in {% for %}", line);
        n->filter = std::move(c->cond);
        n->iter = std::move(c->then);
      }
      if (ep.IsName("recursive")) Fail("unsupported construct 'for ... recursive'", line);
      done();
      n->body = ParseBody({"else", "endfor"}, &end, &end_toks, &end_line);
      if (end == "else") n->otherwise = ParseBody({"endfor"}, &end, &end_toks, &end_line);
      return n;
    }
    if (word == "set") {
      auto n = std::make_unique<SetNode>();
      n->line = line;
      n->name = ep.ExpectName();
      if (ep.IsOp(".")) {
        ep.Next();
        n->attr = ep.ExpectName();
      }
      if (!ep.IsOp("=")) Fail("unsupported construct '{% set %}' block (use {% set x = ... %})", line);
      ep.Next();
      n->x = ep.Parse();
      done();
      return n;
    }
    if (word == "macro") {
      auto n = std::make_unique<MacroNode>();
      n->line = line;
      n->name = ep.ExpectName();
      ep.Expect("(");
      while (!ep.IsOp(")")) {
        n->params.push_back(ep.ExpectName());
        ExprPtr def;
        if (ep.IsOp("=")) {
          ep.Next();
          def = ep.Parse();
        }
        n->defaults.push_back(std::move(def));
        if (!ep.IsOp(",")) break;
        ep.Next();
      }
      ep.Expect(")");
      done();
      n->body = ParseBody({"endmacro"}, &end, &end_toks, &end_line);
      return n;
    }
    if (word == "include" || word == "import" || word == "from" || word == "extends") {
      Fail("unsupported construct '" + word + "': a GGUF chat template is one string, with no other template to "
           "load; inline it (a {% macro %} can hold the shared part)", line);
    }
    Fail("unsupported construct '" + word + "'", line);
  }

  std::vector<Piece> pieces_;
  size_t k_ = 0;
  int nesting_ = 0;
};

}  // namespace

Body ParseTemplate(const std::string& source) {
  Parser p(Split(source));
  std::string end;
  std::vector<Tok> toks;
  int line = 0;
  return p.ParseBody({}, &end, &toks, &line);
}

}  // namespace kvx::server::jinja
