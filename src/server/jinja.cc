#include "server/jinja.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <stdexcept>

namespace kvx::server::jinja {

// Errors travel as this exception inside the interpreter and become an
// InvalidArgument at Parse/Render.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace {

[[noreturn]] void Fail(const std::string& message, int line) {
  throw Error("chat template line " + std::to_string(line) + ": " + message);
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

}  // namespace

bool Value::Truthy() const {
  if (is_undefined() || is_none()) return false;
  if (is_bool()) return b();
  if (is_int()) return i() != 0;
  if (is_double()) return d() != 0;
  if (is_string()) return !s().empty();
  if (is_array()) return !a().empty();
  return !o().empty();
}

std::string Value::Str() const {
  if (is_undefined()) return "";
  if (is_none()) return "None";
  if (is_bool()) return b() ? "True" : "False";
  if (is_int()) return std::to_string(i());
  if (is_double()) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", d());
    std::string s = buf;
    if (s.find_first_of(".e") == std::string::npos) s += ".0";
    return s;
  }
  if (is_string()) return s();
  if (is_array()) {
    std::string out = "[";
    for (size_t k = 0; k < a().size(); ++k) {
      out += (k ? ", " : "") + (a()[k].is_string() ? "'" + a()[k].s() + "'" : a()[k].Str());
    }
    return out + "]";
  }
  std::string out = "{";
  bool first = true;
  for (const auto& [key, v] : o()) {
    out += (first ? "'" : ", '") + key + "': " + (v.is_string() ? "'" + v.s() + "'" : v.Str());
    first = false;
  }
  return out + "}";
}

std::string Value::Json() const {
  if (is_undefined() || is_none()) return "null";
  if (is_bool()) return b() ? "true" : "false";
  if (is_int()) return std::to_string(i());
  if (is_double()) return Str();
  if (is_string()) return JsonString(s());
  if (is_array()) {
    std::string out = "[";
    for (size_t k = 0; k < a().size(); ++k) out += (k ? ", " : "") + a()[k].Json();
    return out + "]";
  }
  std::string out = "{";
  bool first = true;
  for (const auto& [key, v] : o()) {
    out += (first ? "" : ", ") + JsonString(key) + ": " + v.Json();
    first = false;
  }
  return out + "}";
}

bool Value::Equals(const Value& x) const {
  if (is_number() && x.is_number()) return d() == x.d();
  if (is_string() && x.is_string()) return s() == x.s();
  if (is_bool() && x.is_bool()) return b() == x.b();
  if ((is_none() || is_undefined()) && (x.is_none() || x.is_undefined())) return is_none() == x.is_none();
  if (is_array() && x.is_array()) {
    if (a().size() != x.a().size()) return false;
    for (size_t k = 0; k < a().size(); ++k) {
      if (!a()[k].Equals(x.a()[k])) return false;
    }
    return true;
  }
  if (is_object() && x.is_object()) return &o() == &x.o();
  return false;
}

const char* Value::TypeName() const {
  if (is_undefined()) return "undefined";
  if (is_none()) return "none";
  if (is_bool()) return "bool";
  if (is_number()) return "number";
  if (is_string()) return "string";
  if (is_array()) return "list";
  return "dict";
}

// ---------------------------------------------------------------- lexing

namespace {

struct Tok {
  enum Kind { kName, kString, kInt, kFloat, kOp, kEnd } kind = kEnd;
  std::string text;
  int64_t i = 0;
  double d = 0;
};

std::vector<Tok> Lex(const std::string& src, int line) {
  std::vector<Tok> out;
  size_t p = 0;
  while (p < src.size()) {
    const char c = src[p];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++p;
      continue;
    }
    Tok t;
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t q = p;
      while (q < src.size() && (std::isalnum(static_cast<unsigned char>(src[q])) || src[q] == '_')) ++q;
      t.kind = Tok::kName;
      t.text = src.substr(p, q - p);
      p = q;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t q = p;
      while (q < src.size() && std::isdigit(static_cast<unsigned char>(src[q]))) ++q;
      if (q + 1 < src.size() && src[q] == '.' && std::isdigit(static_cast<unsigned char>(src[q + 1]))) {
        ++q;
        while (q < src.size() && std::isdigit(static_cast<unsigned char>(src[q]))) ++q;
        t.kind = Tok::kFloat;
        t.d = std::stod(src.substr(p, q - p));
      } else {
        t.kind = Tok::kInt;
        t.i = std::stoll(src.substr(p, q - p));
      }
      p = q;
    } else if (c == '\'' || c == '"') {
      size_t q = p + 1;
      std::string s;
      while (q < src.size() && src[q] != c) {
        if (src[q] == '\\' && q + 1 < src.size()) {
          const char e = src[++q];
          s += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
        } else {
          s += src[q];
        }
        ++q;
      }
      if (q >= src.size()) Fail("unterminated string", line);
      t.kind = Tok::kString;
      t.text = std::move(s);
      p = q + 1;
    } else {
      static const char* kOps[] = {"//", "==", "!=", "<=", ">=", "(", ")", "[", "]", "{", "}", ",", ":", ".",
                                   "|", "~", "+", "-", "*", "/", "%", "<", ">", "="};
      bool found = false;
      for (const char* op : kOps) {
        const size_t n = std::char_traits<char>::length(op);
        if (src.compare(p, n, op) == 0) {
          t.kind = Tok::kOp;
          t.text = op;
          p += n;
          found = true;
          break;
        }
      }
      if (!found) Fail(std::string("unexpected character '") + c + "'", line);
    }
    out.push_back(std::move(t));
  }
  out.push_back(Tok{});
  return out;
}

}  // namespace

// ---------------------------------------------------------------- AST

struct Scope {
  std::vector<Value::Object> frames;
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

namespace {

void RunBody(const Body& body, Scope& s, std::string& out) {
  for (const auto& n : body) n->Run(s, out);
}

struct Literal : Expr {
  Value v;
  Value Eval(Scope&) const override { return v; }
};
struct Name : Expr {
  std::string name;
  Value Eval(Scope& s) const override { return s.Get(name); }
};
struct ListExpr : Expr {
  std::vector<ExprPtr> items;
  Value Eval(Scope& s) const override {
    Value::Array a;
    for (const auto& e : items) a.push_back(e->Eval(s));
    return Value(std::move(a));
  }
};
struct DictExpr : Expr {
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
  Value Eval(Scope& s) const override {
    Value::Object o;
    for (const auto& [k, v] : items) o[k->Eval(s).Str()] = v->Eval(s);
    return Value(std::move(o));
  }
};

Value Index(const Value& base, const Value& key, int line) {
  if (base.is_array() && key.is_int()) {
    int64_t k = key.i();
    const int64_t n = static_cast<int64_t>(base.a().size());
    if (k < 0) k += n;
    return k >= 0 && k < n ? base.a()[k] : Value();
  }
  if (base.is_string() && key.is_int()) {
    int64_t k = key.i();
    const int64_t n = static_cast<int64_t>(base.s().size());
    if (k < 0) k += n;
    return k >= 0 && k < n ? Value(base.s().substr(k, 1)) : Value();
  }
  if (base.is_object() && key.is_string()) {
    auto it = base.o().find(key.s());
    return it == base.o().end() ? Value() : it->second;
  }
  if (base.is_undefined()) return Value();
  (void)line;
  return Value();
}

struct Attr : Expr {
  ExprPtr base;
  std::string name;
  Value Eval(Scope& s) const override { return Index(base->Eval(s), Value(name), line); }
};
struct Subscript : Expr {
  ExprPtr base, key;
  Value Eval(Scope& s) const override { return Index(base->Eval(s), key->Eval(s), line); }
};
struct Slice : Expr {
  ExprPtr base, start, stop, step;
  Value Eval(Scope& s) const override {
    const Value b = base->Eval(s);
    const int64_t n = b.is_array() ? static_cast<int64_t>(b.a().size()) : b.is_string() ? static_cast<int64_t>(b.s().size()) : -1;
    if (n < 0) Fail("only lists and strings can be sliced", line);
    const int64_t st = step ? step->Eval(s).i() : 1;
    if (st == 0) Fail("slice step cannot be zero", line);
    auto norm = [&](const ExprPtr& e, int64_t dflt) {
      if (!e) return dflt;
      int64_t v = e->Eval(s).i();
      if (v < 0) v += n;
      return std::clamp<int64_t>(v, st > 0 ? 0 : -1, st > 0 ? n : n - 1);
    };
    const int64_t a = norm(start, st > 0 ? 0 : n - 1), z = norm(stop, st > 0 ? n : -1);
    Value::Array arr;
    std::string str;
    for (int64_t k = a; st > 0 ? k < z : k > z; k += st) {
      if (b.is_array()) arr.push_back(b.a()[k]);
      else str += b.s()[k];
    }
    return b.is_array() ? Value(std::move(arr)) : Value(std::move(str));
  }
};

struct Unary : Expr {
  std::string op;
  ExprPtr x;
  Value Eval(Scope& s) const override {
    const Value v = x->Eval(s);
    if (op == "not") return Value(!v.Truthy());
    if (v.is_int()) return Value(-v.i());
    if (v.is_double()) return Value(-v.d());
    Fail("unary - needs a number", line);
  }
};

bool Contains(const Value& hay, const Value& needle, int line) {
  if (hay.is_string() && needle.is_string()) return hay.s().find(needle.s()) != std::string::npos;
  if (hay.is_array()) {
    for (const Value& v : hay.a()) {
      if (v.Equals(needle)) return true;
    }
    return false;
  }
  if (hay.is_object() && needle.is_string()) return hay.o().count(needle.s()) != 0;
  if (hay.is_undefined()) return false;
  Fail(std::string("'in' needs a string, list or dict, not ") + hay.TypeName(), line);
}

struct Binary : Expr {
  std::string op;
  ExprPtr l, r;
  Value Eval(Scope& s) const override {
    if (op == "and") {
      Value a = l->Eval(s);
      return a.Truthy() ? r->Eval(s) : a;
    }
    if (op == "or") {
      Value a = l->Eval(s);
      return a.Truthy() ? a : r->Eval(s);
    }
    const Value a = l->Eval(s), b = r->Eval(s);
    if (op == "~") return Value(a.Str() + b.Str());
    if (op == "==") return Value(a.Equals(b));
    if (op == "!=") return Value(!a.Equals(b));
    if (op == "in") return Value(Contains(b, a, line));
    if (op == "not in") return Value(!Contains(b, a, line));
    if (op == "+" && a.is_string() && b.is_string()) return Value(a.s() + b.s());
    if (op == "+" && a.is_array() && b.is_array()) {
      Value::Array c = a.a();
      c.insert(c.end(), b.a().begin(), b.a().end());
      return Value(std::move(c));
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int cmp = 0;
      if (a.is_number() && b.is_number()) cmp = a.d() < b.d() ? -1 : a.d() > b.d() ? 1 : 0;
      else if (a.is_string() && b.is_string()) cmp = a.s().compare(b.s());
      else Fail(std::string("cannot compare ") + a.TypeName() + " and " + b.TypeName(), line);
      return Value(op == "<" ? cmp < 0 : op == ">" ? cmp > 0 : op == "<=" ? cmp <= 0 : cmp >= 0);
    }
    if (op == "*" && a.is_string() && b.is_int()) {
      std::string out;
      for (int64_t k = 0; k < b.i(); ++k) out += a.s();
      return Value(std::move(out));
    }
    if (!a.is_number() || !b.is_number()) {
      Fail(std::string("'") + op + "' needs numbers (or strings for +), not " + a.TypeName() + " and " + b.TypeName(), line);
    }
    if (a.is_int() && b.is_int() && op != "/") {
      const int64_t x = a.i(), y = b.i();
      if ((op == "//" || op == "%") && y == 0) Fail("division by zero", line);
      if (op == "+") return Value(x + y);
      if (op == "-") return Value(x - y);
      if (op == "*") return Value(x * y);
      if (op == "//") return Value(x / y - ((x % y != 0 && ((x < 0) != (y < 0))) ? 1 : 0));
      if (op == "%") return Value(((x % y) + y) % y);
    }
    const double x = a.d(), y = b.d();
    if (op == "+") return Value(x + y);
    if (op == "-") return Value(x - y);
    if (op == "*") return Value(x * y);
    if (y == 0) Fail("division by zero", line);
    if (op == "/") return Value(x / y);
    if (op == "//") return Value(std::floor(x / y));
    return Value(std::fmod(x, y));
  }
};

struct Cond : Expr {
  ExprPtr then, cond, otherwise;
  Value Eval(Scope& s) const override {
    if (cond->Eval(s).Truthy()) return then->Eval(s);
    return otherwise ? otherwise->Eval(s) : Value();
  }
};

std::string Strip(const std::string& s, const std::string& chars, bool left, bool right) {
  size_t a = 0, z = s.size();
  if (left) {
    while (a < z && chars.find(s[a]) != std::string::npos) ++a;
  }
  if (right) {
    while (z > a && chars.find(s[z - 1]) != std::string::npos) --z;
  }
  return s.substr(a, z - a);
}
const std::string kSpace = " \t\n\r\f\v";

std::string ReplaceAll(std::string s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) s.replace(p, from.size(), to);
  return s;
}

std::string Title(std::string s) {
  bool start = true;
  for (char& c : s) {
    c = start ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    start = !std::isalnum(static_cast<unsigned char>(c));
  }
  return s;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

Value Items(const Value& v) {
  Value::Array out;
  for (const auto& [k, x] : v.o()) out.push_back(Value(Value::Array{Value(k), x}));
  return Value(std::move(out));
}

// Filters and methods share these; `self` is the value filtered.
Value ApplyFilter(const std::string& name, const Value& self, const std::vector<Value>& args, int line) {
  auto arg = [&](size_t k) { return k < args.size() ? args[k] : Value(); };
  auto need_string = [&] {
    if (!self.is_string()) Fail("filter '" + name + "' needs a string, not " + self.TypeName(), line);
  };
  if (name == "trim") {
    need_string();
    return Value(Strip(self.s(), args.empty() ? kSpace : arg(0).Str(), true, true));
  }
  if (name == "length" || name == "count") {
    if (self.is_string()) return Value(static_cast<int64_t>(self.s().size()));
    if (self.is_array()) return Value(static_cast<int64_t>(self.a().size()));
    if (self.is_object()) return Value(static_cast<int64_t>(self.o().size()));
    Fail(std::string("length of ") + self.TypeName(), line);
  }
  if (name == "upper") return need_string(), Value(Upper(self.s()));
  if (name == "lower") return need_string(), Value(Lower(self.s()));
  if (name == "title") return need_string(), Value(Title(self.s()));
  if (name == "capitalize") {
    need_string();
    std::string s = Lower(self.s());
    if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
    return Value(std::move(s));
  }
  if (name == "default" || name == "d") {
    const bool boolean = arg(1).Truthy();
    return (self.is_undefined() || (boolean && !self.Truthy())) ? arg(0) : self;
  }
  if (name == "tojson") return Value(self.Json());
  if (name == "string") return Value(self.Str());
  if (name == "int") {
    if (self.is_number()) return Value(static_cast<int64_t>(self.d()));
    if (self.is_string()) {
      try {
        return Value(static_cast<int64_t>(std::stoll(self.s())));
      } catch (...) {
        return Value(static_cast<int64_t>(0));
      }
    }
    return Value(static_cast<int64_t>(0));
  }
  if (name == "join") {
    if (!self.is_array()) Fail("join needs a list", line);
    std::string out;
    for (size_t k = 0; k < self.a().size(); ++k) out += (k ? arg(0).Str() : "") + self.a()[k].Str();
    return Value(std::move(out));
  }
  if (name == "first" || name == "last") {
    if (!self.is_array()) Fail(name + " needs a list", line);
    if (self.a().empty()) return Value();
    return name == "first" ? self.a().front() : self.a().back();
  }
  if (name == "list") {
    if (self.is_array()) return self;
    if (self.is_string()) {
      Value::Array out;
      for (char c : self.s()) out.push_back(Value(std::string(1, c)));
      return Value(std::move(out));
    }
    Fail("list of " + std::string(self.TypeName()), line);
  }
  if (name == "replace") return need_string(), Value(ReplaceAll(self.s(), arg(0).Str(), arg(1).Str()));
  if (name == "items") {
    if (!self.is_object()) Fail("items needs a dict", line);
    return Items(self);
  }
  Fail("unsupported filter '" + name + "'", line);
}

bool IsKnownFilter(const std::string& name) {
  static const char* kFilters[] = {"trim", "length", "count", "upper", "lower", "title", "capitalize", "default", "d",
                                   "tojson", "string", "int", "join", "first", "last", "list", "replace", "items"};
  for (const char* f : kFilters) {
    if (name == f) return true;
  }
  return false;
}

struct Filter : Expr {
  ExprPtr x;
  std::string name;
  std::vector<ExprPtr> args;
  Value Eval(Scope& s) const override {
    std::vector<Value> a;
    for (const auto& e : args) a.push_back(e->Eval(s));
    return ApplyFilter(name, x->Eval(s), a, line);
  }
};

struct Test : Expr {
  ExprPtr x;
  std::string name;
  bool negate = false;
  ExprPtr arg;
  Value Eval(Scope& s) const override {
    const Value v = x->Eval(s);
    bool r = false;
    if (name == "defined") r = !v.is_undefined();
    else if (name == "undefined") r = v.is_undefined();
    else if (name == "none") r = v.is_none();
    else if (name == "string") r = v.is_string();
    else if (name == "number") r = v.is_number();
    else if (name == "mapping") r = v.is_object();
    else if (name == "iterable") r = v.is_array() || v.is_string() || v.is_object();
    else if (name == "sequence") r = v.is_array() || v.is_string();
    else if (name == "boolean") r = v.is_bool();
    else if (name == "true") r = v.is_bool() && v.b();
    else if (name == "false") r = v.is_bool() && !v.b();
    else if (name == "even" || name == "odd") r = v.is_int() && (v.i() % 2 == 0) == (name == "even");
    else if (name == "equalto" || name == "eq") r = arg && v.Equals(arg->Eval(s));
    else Fail("unsupported test '" + name + "'", line);
    return Value(r != negate);
  }
};

struct Call : Expr {
  ExprPtr callee;  // Name or Attr (a method)
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  Value Eval(Scope& s) const override {
    std::vector<Value> a;
    for (const auto& e : args) a.push_back(e->Eval(s));
    if (const auto* n = dynamic_cast<const Name*>(callee.get())) {
      if (n->name == "raise_exception") Fail("the template refused the messages: " + (a.empty() ? "" : a[0].Str()), line);
      if (n->name == "namespace") {
        Value::Object o;
        for (const auto& [k, e] : kwargs) o[k] = e->Eval(s);
        return Value::Namespace(std::move(o));
      }
      if (n->name == "range") {
        int64_t start = 0, stop = 0, step = 1;
        if (a.size() == 1) stop = a[0].i();
        if (a.size() >= 2) start = a[0].i(), stop = a[1].i();
        if (a.size() == 3) step = a[2].i();
        if (step == 0 || a.empty() || !a[0].is_int()) Fail("range needs integers and a non-zero step", line);
        Value::Array out;
        for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) out.push_back(Value(k));
        return Value(std::move(out));
      }
      Fail("unsupported function '" + n->name + "'", line);
    }
    const auto* m = dynamic_cast<const Attr*>(callee.get());
    if (m == nullptr) Fail("only functions and methods can be called", line);
    const Value self = m->base->Eval(s);
    const std::string& name = m->name;
    auto arg = [&](size_t k) { return k < a.size() ? a[k] : Value(); };
    if (self.is_string()) {
      const std::string& str = self.s();
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const std::string chars = a.empty() || a[0].is_none() ? kSpace : a[0].Str();
        return Value(Strip(str, chars, name != "rstrip", name != "lstrip"));
      }
      if (name == "startswith") return Value(str.rfind(arg(0).Str(), 0) == 0);
      if (name == "endswith") {
        const std::string x = arg(0).Str();
        return Value(str.size() >= x.size() && str.compare(str.size() - x.size(), x.size(), x) == 0);
      }
      if (name == "upper") return Value(Upper(str));
      if (name == "lower") return Value(Lower(str));
      if (name == "title") return Value(Title(str));
      if (name == "replace") return Value(ReplaceAll(str, arg(0).Str(), arg(1).Str()));
      if (name == "split") {
        Value::Array out;
        if (a.empty() || a[0].is_none()) {
          size_t p = 0;
          while (p < str.size()) {
            while (p < str.size() && kSpace.find(str[p]) != std::string::npos) ++p;
            size_t q = p;
            while (q < str.size() && kSpace.find(str[q]) == std::string::npos) ++q;
            if (q > p) out.push_back(Value(str.substr(p, q - p)));
            p = q;
          }
        } else {
          const std::string sep = a[0].Str();
          if (sep.empty()) Fail("empty separator", line);
          size_t p = 0;
          for (size_t q = str.find(sep); q != std::string::npos; q = str.find(sep, p)) {
            out.push_back(Value(str.substr(p, q - p)));
            p = q + sep.size();
          }
          out.push_back(Value(str.substr(p)));
        }
        return Value(std::move(out));
      }
    }
    if (self.is_object()) {
      if (name == "get") {
        auto it = self.o().find(arg(0).Str());
        return it != self.o().end() ? it->second : (a.size() > 1 ? a[1] : Value(Value::None{}));
      }
      if (name == "items") return Items(self);
      if (name == "keys" || name == "values") {
        Value::Array out;
        for (const auto& [k, v] : self.o()) out.push_back(name == "keys" ? Value(k) : v);
        return Value(std::move(out));
      }
    }
    Fail("unsupported method '" + name + "' on " + self.TypeName(), line);
  }
};

// ---------------------------------------------------------------- parsing expressions

class ExprParser {
 public:
  ExprParser(std::vector<Tok> toks, int line) : t_(std::move(toks)), line_(line) {}

  ExprPtr Parse() { return Ternary(); }
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
  template <class T>
  std::unique_ptr<T> Make() {
    auto e = std::make_unique<T>();
    e->line = line_;
    return e;
  }
  ExprPtr Ternary() {
    ExprPtr x = Or();
    if (IsName("if")) {
      ++p_;
      auto c = Make<Cond>();
      c->then = std::move(x);
      c->cond = Or();
      if (IsName("else")) {
        ++p_;
        c->otherwise = Ternary();
      }
      return c;
    }
    return x;
  }
  ExprPtr Bin(ExprPtr l, std::string op, ExprPtr r) {
    auto b = Make<Binary>();
    b->l = std::move(l);
    b->op = std::move(op);
    b->r = std::move(r);
    return b;
  }
  ExprPtr Or() {
    ExprPtr x = And();
    while (IsName("or")) {
      ++p_;
      x = Bin(std::move(x), "or", And());
    }
    return x;
  }
  ExprPtr And() {
    ExprPtr x = Not();
    while (IsName("and")) {
      ++p_;
      x = Bin(std::move(x), "and", Not());
    }
    return x;
  }
  ExprPtr Not() {
    if (IsName("not")) {
      ++p_;
      auto u = Make<Unary>();
      u->op = "not";
      u->x = Not();
      return u;
    }
    return Compare();
  }
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
        t->x = std::move(x);
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
            t->arg = Parse();
            Expect(")");
          } else {
            t->arg = Concat();
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
  ExprPtr Concat() {
    ExprPtr x = Add();
    while (IsOp("~")) {
      ++p_;
      x = Bin(std::move(x), "~", Add());
    }
    return x;
  }
  ExprPtr Add() {
    ExprPtr x = Mul();
    while (IsOp("+") || IsOp("-")) {
      const std::string op = Next().text;
      x = Bin(std::move(x), op, Mul());
    }
    return x;
  }
  ExprPtr Mul() {
    ExprPtr x = UnaryMinus();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const std::string op = Next().text;
      x = Bin(std::move(x), op, UnaryMinus());
    }
    return x;
  }
  ExprPtr UnaryMinus() {
    if (IsOp("-")) {
      ++p_;
      auto u = Make<Unary>();
      u->op = "-";
      u->x = UnaryMinus();
      return u;
    }
    return Filtered();
  }
  ExprPtr Filtered() {
    ExprPtr x = Postfix();
    while (IsOp("|")) {
      ++p_;
      auto f = Make<Filter>();
      f->x = std::move(x);
      f->name = ExpectName();
      if (!IsKnownFilter(f->name)) Fail("unsupported filter '" + f->name + "'", line_);
      if (IsOp("(")) {
        ++p_;
        while (!IsOp(")")) {
          if (Peek().kind == Tok::kName && IsOp("=", 1)) p_ += 2;  // keyword arguments by position
          f->args.push_back(Parse());
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
        a->base = std::move(x);
        a->name = ExpectName();
        x = std::move(a);
      } else if (IsOp("[")) {
        ++p_;
        ExprPtr start, stop, step;
        if (!IsOp(":")) start = Parse();
        if (IsOp(":")) {
          ++p_;
          auto sl = Make<Slice>();
          sl->base = std::move(x);
          sl->start = std::move(start);
          if (!IsOp("]") && !IsOp(":")) sl->stop = Parse();
          if (IsOp(":")) {
            ++p_;
            if (!IsOp("]")) sl->step = Parse();
          }
          Expect("]");
          x = std::move(sl);
        } else {
          Expect("]");
          auto sub = Make<Subscript>();
          sub->base = std::move(x);
          sub->key = std::move(start);
          x = std::move(sub);
        }
      } else if (IsOp("(")) {
        ++p_;
        auto c = Make<Call>();
        c->callee = std::move(x);
        while (!IsOp(")")) {
          if (Peek().kind == Tok::kName && IsOp("=", 1)) {
            std::string k = Next().text;
            ++p_;
            c->kwargs.emplace_back(std::move(k), Parse());
          } else {
            c->args.push_back(Parse());
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
            l->items.push_back(Parse());
            if (!IsOp("]")) Expect(",");
          }
          ++p_;
          return l;
        }
        if (t.text == "{") {
          auto d = Make<DictExpr>();
          while (!IsOp("}")) {
            ExprPtr k = Parse();
            Expect(":");
            d->items.emplace_back(std::move(k), Parse());
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
};

// ---------------------------------------------------------------- statements

struct TextNode : Node {
  std::string text;
  void Run(Scope&, std::string& out) const override { out += text; }
};
struct OutputNode : Node {
  ExprPtr x;
  void Run(Scope& s, std::string& out) const override { out += x->Eval(s).Str(); }
};
struct IfNode : Node {
  std::vector<std::pair<ExprPtr, Body>> branches;  // a null condition is the else
  void Run(Scope& s, std::string& out) const override {
    for (const auto& [c, body] : branches) {
      if (!c || c->Eval(s).Truthy()) {
        RunBody(body, s, out);
        return;
      }
    }
  }
};
struct ForNode : Node {
  std::vector<std::string> vars;
  ExprPtr iter;
  ExprPtr filter;  // {% for x in xs if cond %}
  Body body, otherwise;
  void Run(Scope& s, std::string& out) const override {
    Value seq = iter->Eval(s);
    if (seq.is_object()) seq = Items(seq);
    if (seq.is_undefined() || seq.is_none()) seq = Value(Value::Array{});
    if (!seq.is_array()) Fail(std::string("cannot loop over ") + seq.TypeName(), line);
    Value::Array items;
    for (const Value& v : seq.a()) {
      if (filter) {
        s.frames.emplace_back();
        Bind(s, v);
        const bool keep = filter->Eval(s).Truthy();
        s.frames.pop_back();
        if (!keep) continue;
      }
      items.push_back(v);
    }
    if (items.empty()) {
      RunBody(otherwise, s, out);
      return;
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < n; ++k) {
      s.frames.emplace_back();
      Bind(s, items[k]);
      Value::Object loop;
      loop["index"] = Value(k + 1);
      loop["index0"] = Value(k);
      loop["revindex"] = Value(n - k);
      loop["revindex0"] = Value(n - k - 1);
      loop["first"] = Value(k == 0);
      loop["last"] = Value(k == n - 1);
      loop["length"] = Value(n);
      loop["previtem"] = k > 0 ? items[k - 1] : Value();
      loop["nextitem"] = k + 1 < n ? items[k + 1] : Value();
      s.frames.back()["loop"] = Value(std::move(loop));
      RunBody(body, s, out);
      s.frames.pop_back();
    }
  }
  void Bind(Scope& s, const Value& v) const {
    if (vars.size() == 1) {
      s.frames.back()[vars[0]] = v;
      return;
    }
    if (!v.is_array() || v.a().size() != vars.size()) Fail("cannot unpack the loop item", line);
    for (size_t k = 0; k < vars.size(); ++k) s.frames.back()[vars[k]] = v.a()[k];
  }
};
struct SetNode : Node {
  std::string name, attr;  // attr: set ns.attr = ...
  ExprPtr x;
  void Run(Scope& s, std::string&) const override {
    Value v = x->Eval(s);
    if (attr.empty()) {
      s.frames.back()[name] = std::move(v);
      return;
    }
    Value ns = s.Get(name);
    if (!ns.is_namespace()) Fail("'" + name + "' is not a namespace(): only namespace attributes can be set", line);
    ns.o()[attr] = std::move(v);
  }
};

// A tag or text of the template, in order.
struct Piece {
  enum Kind { kText, kExpr, kStmt } kind;
  std::string text;
  int line;
};

std::vector<Piece> Split(const std::string& src) {
  std::vector<Piece> out;
  size_t p = 0;
  int line = 1;
  bool trim_next = false;      // a '-' closer: strip the next text's leading whitespace
  bool newline_next = false;   // trim_blocks: drop one newline after a block tag
  auto count_lines = [&](size_t a, size_t b) {
    for (size_t k = a; k < b; ++k) line += src[k] == '\n';
  };
  while (p <= src.size()) {
    size_t open = src.find('{', p);
    while (open != std::string::npos && open + 1 < src.size() && src[open + 1] != '{' && src[open + 1] != '%' &&
           src[open + 1] != '#') {
      open = src.find('{', open + 1);
    }
    if (open != std::string::npos && open + 1 >= src.size()) open = std::string::npos;
    std::string text = src.substr(p, open == std::string::npos ? std::string::npos : open - p);
    const int text_line = line;
    count_lines(p, open == std::string::npos ? src.size() : open);
    const bool starts_line = p == 0 || src[p - 1] == '\n' || (newline_next && p < src.size() && src[p] == '\n');
    if (trim_next) text = Strip(text, kSpace, true, false);
    else if (newline_next && !text.empty() && text[0] == '\n') text.erase(0, 1);
    trim_next = newline_next = false;
    if (open == std::string::npos) {
      if (!text.empty()) out.push_back({Piece::kText, text, text_line});
      break;
    }
    const char kind = src[open + 1];
    const bool minus = open + 2 < src.size() && src[open + 2] == '-';
    if (minus) {
      text = Strip(text, kSpace, false, true);
    } else if (kind == '%' || kind == '#') {
      // lstrip_blocks: spaces and tabs from the line start to a block tag.
      size_t k = text.size();
      while (k > 0 && (text[k - 1] == ' ' || text[k - 1] == '\t')) --k;
      if (k > 0 ? text[k - 1] == '\n' : starts_line) text.erase(k);
    }
    if (!text.empty()) out.push_back({Piece::kText, text, text_line});
    const std::string closer = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    size_t q = open + 2;
    char quote = 0;
    for (; q + 1 < src.size(); ++q) {
      if (kind != '#') {
        if (quote) {
          if (src[q] == '\\') ++q;
          else if (src[q] == quote) quote = 0;
          continue;
        }
        if (src[q] == '\'' || src[q] == '"') {
          quote = src[q];
          continue;
        }
      }
      if (src.compare(q, 2, closer) == 0) break;
    }
    if (q + 1 >= src.size()) Fail("a tag opened here is never closed", line);
    size_t body_start = open + 2 + (minus ? 1 : 0), body_end = q;
    const bool minus_close = body_end > body_start && src[body_end - 1] == '-';
    if (minus_close) --body_end;
    const int tag_line = line;
    count_lines(open, q + 2);
    if (kind != '#') {
      out.push_back({kind == '{' ? Piece::kExpr : Piece::kStmt, src.substr(body_start, body_end - body_start), tag_line});
    }
    trim_next = minus_close;
    newline_next = !minus_close && kind != '{';
    p = q + 2;
  }
  return out;
}

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
    Fail("unsupported construct '" + word + "'", line);
  }

  std::vector<Piece> pieces_;
  size_t k_ = 0;
};

}  // namespace

Template::~Template() = default;

Result<std::shared_ptr<const Template>> Template::Parse(const std::string& source) {
  try {
    std::shared_ptr<Template> t(new Template());
    Parser p(Split(source));
    std::string end;
    std::vector<Tok> toks;
    int line = 0;
    t->body_ = p.ParseBody({}, &end, &toks, &line);
    return std::shared_ptr<const Template>(std::move(t));
  } catch (const Error& e) {
    return InvalidArgument(e.what());
  }
}

Result<std::string> Template::Render(const Value::Object& context) const {
  try {
    Scope s;
    s.frames.push_back(context);
    s.frames.emplace_back();  // the template's own top-level sets
    std::string out;
    RunBody(body_, s, out);
    return out;
  } catch (const Error& e) {
    return InvalidArgument(e.what());
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("chat template: ") + e.what());
  }
}

}  // namespace kvx::server::jinja
