// The evaluator: the AST's Eval (expressions) and Run (statements), with
// the filters, tests, functions and methods the subset supports.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>
#include <vector>

#include "server/jinja_ast.h"

namespace kvx::server::jinja {

void CountWork(Scope& s, int line) {
  if (s.work != nullptr && ++*s.work > kMaxRenderWork) {
    Fail("the template ran more than " + std::to_string(kMaxRenderWork) + " statements (an endless loop?)", line);
  }
}

void RunBody(const Body& body, Scope& s, std::string& out) {
  for (const auto& n : body) {
    CountWork(s, n->line);
    n->Run(s, out);
    if (out.size() > kMaxRenderBytes) {
      Fail("the template's output passed " + std::to_string(kMaxRenderBytes >> 20) + " MiB", n->line);
    }
  }
}

namespace {

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

}  // namespace

bool IsKnownFilter(const std::string& name) {
  static const char* kFilters[] = {"trim", "length", "count", "upper", "lower", "title", "capitalize", "default", "d",
                                   "tojson", "string", "int", "join", "first", "last", "list", "replace", "items"};
  for (const char* f : kFilters) {
    if (name == f) return true;
  }
  return false;
}

// ---------------------------------------------------------------- expressions

Value Literal::Eval(Scope&) const { return v; }
Value Name::Eval(Scope& s) const { return s.Get(name); }
Value ListExpr::Eval(Scope& s) const {
  Value::Array a;
  for (const auto& e : items) a.push_back(e->Eval(s));
  return Value(std::move(a));
}

Value DictExpr::Eval(Scope& s) const {
  Value::Object o;
  for (const auto& [k, v] : items) o[k->Eval(s).Str()] = v->Eval(s);
  return Value(std::move(o));
}

Value Attr::Eval(Scope& s) const { return Index(base->Eval(s), Value(name), line); }
Value Subscript::Eval(Scope& s) const { return Index(base->Eval(s), key->Eval(s), line); }
Value Slice::Eval(Scope& s) const {
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

Value Unary::Eval(Scope& s) const {
  const Value v = x->Eval(s);
  if (op == "not") return Value(!v.Truthy());
  if (v.is_int()) return Value(-v.i());
  if (v.is_double()) return Value(-v.d());
  Fail("unary - needs a number", line);
}

Value Binary::Eval(Scope& s) const {
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

Value Cond::Eval(Scope& s) const {
  if (cond->Eval(s).Truthy()) return then->Eval(s);
  return otherwise ? otherwise->Eval(s) : Value();
}

Value Filter::Eval(Scope& s) const {
  std::vector<Value> a;
  for (const auto& e : args) a.push_back(e->Eval(s));
  return ApplyFilter(name, x->Eval(s), a, line);
}

Value Test::Eval(Scope& s) const {
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

Value Call::Eval(Scope& s) const {
  std::vector<Value> a;
  for (const auto& e : args) a.push_back(e->Eval(s));
  if (const auto* n = dynamic_cast<const Name*>(callee.get())) {
    if (const Value f = s.Get(n->name); f.is_macro()) {
      std::vector<std::pair<std::string, Value>> kw;
      for (const auto& [k, e] : kwargs) kw.emplace_back(k, e->Eval(s));
      return f.macro().Call(s, std::move(a), std::move(kw), line);
    }
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
      // In 128 bits: a hostile template's bounds must not overflow the count.
      const __int128 span = step > 0 ? static_cast<__int128>(stop) - start : static_cast<__int128>(start) - stop;
      const __int128 stride = step > 0 ? step : -static_cast<__int128>(step);
      const int64_t len = span <= 0 ? 0 : static_cast<int64_t>(std::min<__int128>((span + stride - 1) / stride, kMaxRange + 1));
      if (len > kMaxRange) Fail("range of " + std::to_string(len) + " numbers (at most " + std::to_string(kMaxRange) + ")", line);
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

// ---------------------------------------------------------------- statements

void TextNode::Run(Scope&, std::string& out) const { out += text; }
void OutputNode::Run(Scope& s, std::string& out) const { out += x->Eval(s).Str(); }
void IfNode::Run(Scope& s, std::string& out) const {
  for (const auto& [c, body] : branches) {
    if (!c || c->Eval(s).Truthy()) {
      RunBody(body, s, out);
      return;
    }
  }
}

void ForNode::Run(Scope& s, std::string& out) const {
  Value seq = iter->Eval(s);
  if (seq.is_object()) seq = Items(seq);
  if (seq.is_undefined() || seq.is_none()) seq = Value(Value::Array{});
  if (!seq.is_array()) Fail(std::string("cannot loop over ") + seq.TypeName(), line);
  Value::Array items;
  for (const Value& v : seq.a()) {
    if (filter) {
      CountWork(s, line);
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
    CountWork(s, line);
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

void ForNode::Bind(Scope& s, const Value& v) const {
  if (vars.size() == 1) {
    s.frames.back()[vars[0]] = v;
    return;
  }
  if (!v.is_array() || v.a().size() != vars.size()) Fail("cannot unpack the loop item", line);
  for (size_t k = 0; k < vars.size(); ++k) s.frames.back()[vars[k]] = v.a()[k];
}

void MacroNode::Run(Scope& s, std::string&) const { s.frames.back()[name] = Value(this); }

Value MacroNode::Call(Scope& caller, std::vector<Value> args, std::vector<std::pair<std::string, Value>> kwargs,
                      int call_line) const {
  if (args.size() > params.size()) {
    Fail("macro '" + name + "' takes " + std::to_string(params.size()) + " argument(s), given " +
             std::to_string(args.size()), call_line);
  }
  // The body runs in the caller's scope plus a frame of its own: it reads the
  // caller's variables (namespaces included), and its sets end with it.
  if (caller.macro_depth >= kMaxMacroDepth) {
    Fail("macro '" + name + "' nested more than " + std::to_string(kMaxMacroDepth) + " calls deep (recursion?)",
         call_line);
  }
  Scope inner{caller.frames, caller.macro_depth + 1, caller.work};
  inner.frames.emplace_back();
  Value::Object& own = inner.frames.back();
  for (size_t k = 0; k < args.size(); ++k) own[params[k]] = std::move(args[k]);
  for (auto& [key, v] : kwargs) {
    const auto it = std::find(params.begin(), params.end(), key);
    if (it == params.end()) Fail("macro '" + name + "' has no parameter '" + key + "'", call_line);
    const size_t k = static_cast<size_t>(it - params.begin());
    if (k < args.size()) Fail("macro '" + name + "' got '" + key + "' twice", call_line);
    own[key] = std::move(v);
  }
  for (size_t k = 0; k < params.size(); ++k) {
    if (own.count(params[k]) == 0 && defaults[k]) own[params[k]] = defaults[k]->Eval(inner);
  }
  std::string out;
  RunBody(body, inner, out);
  return Value(std::move(out));
}

void SetNode::Run(Scope& s, std::string&) const {
  Value v = x->Eval(s);
  if (attr.empty()) {
    s.frames.back()[name] = std::move(v);
    return;
  }
  Value ns = s.Get(name);
  if (!ns.is_namespace()) Fail("'" + name + "' is not a namespace(): only namespace attributes can be set", line);
  ns.o()[attr] = std::move(v);
}

}  // namespace kvx::server::jinja
