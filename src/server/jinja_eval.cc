// The evaluator of expressions: the AST's Eval, with the filters, tests,
// functions and methods the subset supports (statements: jinja_run.cc).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "server/jinja_ast.h"

namespace kvx::server::jinja {

namespace {

std::string Amount(size_t bytes) {
  const size_t mib = size_t{1} << 20;
  return bytes % mib == 0 ? std::to_string(bytes / mib) + " MiB" : std::to_string(bytes) + " bytes";
}

size_t Remaining(const Scope& s) { return s.budget->limits.max_bytes - s.budget->bytes; }

// n * each, saturated (a count from a hostile template may be near 2^64).
size_t Times(uint64_t n, size_t each) {
  size_t r;
  return __builtin_mul_overflow(n, each, &r) ? SIZE_MAX : r;
}

}  // namespace

void SpendSteps(Scope& s, int64_t steps, int line) {
  Budget& b = *s.budget;
  b.steps += steps;
  if (b.steps > b.limits.max_steps) {
    Fail("the template ran more than " + std::to_string(b.limits.max_steps) +
             " steps (its step budget; an endless loop?)", line);
  }
}

void SpendBytes(Scope& s, size_t bytes, int line) {
  Budget& b = *s.budget;
  if (bytes > b.limits.max_bytes - b.bytes) {
    Fail("the template built more than " + Amount(b.limits.max_bytes) +
             " of strings, lists and dicts (its byte budget, output included)", line);
  }
  b.bytes += bytes;
}

void SpendScan(Scope& s, size_t bytes, int line) { SpendSteps(s, static_cast<int64_t>(bytes / 256), line); }

// The bytes of `n` data marks (charged once built: there is at most one per
// two bytes, and the bytes were charged before).
size_t MarkBytes(size_t n) { return n * sizeof(Spans::value_type); }

void Emit(Scope& s, MarkedText& out, const std::string& text, const Spans* data, int line) {
  SpendBytes(s, text.size(), line);
  const size_t marks = out.data.size();
  out.Append(text, data);
  SpendBytes(s, MarkBytes(out.data.size() - marks), line);
}

Value Lookup(Scope& s, const std::string& name, int line) {
  int64_t visited = 0;
  for (const Scope* scope = &s; scope != nullptr; scope = scope->caller) {
    for (auto it = scope->frames.rbegin(); it != scope->frames.rend(); ++it) {
      ++visited;
      if (auto f = it->find(name); f != it->end()) {
        SpendSteps(s, visited / 4, line);  // a small map's lookup: a quarter of a step
        return f->second;
      }
    }
  }
  SpendSteps(s, visited / 4, line);
  return Value();
}

Value Expr::Eval(Scope& s) const {
  Nested nested(s.budget->depth, kMaxEvalDepth, "evaluation", line);
  SpendSteps(s, 1, line);
  Value v = Evaluate(s);
  if (v.depth() > kMaxValueDepth) {
    Fail("lists and dicts nested more than " + std::to_string(kMaxValueDepth) + " deep", line);
  }
  return v;
}

void RunBody(const Body& body, Scope& s, MarkedText& out) {
  if (body.empty()) return;
  Nested nested(s.budget->depth, kMaxEvalDepth, "evaluation", body.front()->line);
  for (const auto& n : body) {
    SpendSteps(s, 1, n->line);
    n->Run(s, out);
  }
}

namespace {

const Value kUndefined;
constexpr size_t kMaxMessageBytes = 1000;  // of a raise_exception message

// `v` as {{ }} prints it: a string's own bytes, or the text built into `buf`
// (charged). Where the text goes into a string or the output, Printout
// instead: it keeps the data marks.
const std::string& Printed(Scope& s, const Value& v, std::string& buf, int line) {
  if (v.is_string()) return v.s();
  buf = v.Str(Remaining(s));
  SpendBytes(s, buf.size(), line);
  return buf;
}

// `v` as {{ }} prints it, with its data marks: a string's own bytes and
// marks, or the text built (charged) for anything else, all of it data when
// the value holds any. Refers to `v`, which must outlive it.
class Printout {
 public:
  Printout(Scope& s, const Value& v, int line) : text_(&Printed(s, v, own_, line)) {
    if (v.is_string()) {
      data_ = v.data();
    } else if (!own_.empty() && v.HoldsData()) {
      own_data_ = {{0, own_.size()}};
      data_ = &own_data_;
    }
  }
  Printout(const Printout&) = delete;
  Printout& operator=(const Printout&) = delete;
  const std::string& text() const { return *text_; }
  const Spans* data() const { return data_; }

 private:
  std::string own_;
  Spans own_data_;
  const std::string* text_;
  const Spans* data_ = nullptr;
};

// A string built with marks, the marks charged.
Value Marked(Scope& s, MarkedText m, int line) {
  SpendBytes(s, MarkBytes(m.data.size()), line);
  return Value(std::move(m));
}

Value Concat(Scope& s, const std::string& x, const Spans* x_data, const std::string& y, const Spans* y_data, int line) {
  SpendBytes(s, x.size() + y.size(), line);
  MarkedText r;
  r.text.reserve(x.size() + y.size());
  r.Append(x, x_data);
  r.Append(y, y_data);
  return Marked(s, std::move(r), line);
}

// A string built from `str`, charged before it is; `data`: the marks of a
// string of the same length it was made from (a change of case).
Value NewString(Scope& s, std::string str, int line, const Spans* data = nullptr) {
  SpendBytes(s, str.size() + (data ? MarkBytes(data->size()) : 0), line);
  return Value(std::move(str), data ? *data : Spans());
}

// v.s()[begin, end), with its marks; its marks charged when given a scope
// (its bytes are the caller's to charge).
Value Substring(const Value& v, size_t begin, size_t end, Scope* s = nullptr, int line = 0) {
  MarkedText m;
  m.Append(v.s(), v.data(), begin, end);
  if (s != nullptr) SpendBytes(*s, MarkBytes(m.data.size()), line);
  return Value(std::move(m));
}

// strip / lstrip / rstrip / trim of a string value, charged.
Value StripValue(Scope& s, const Value& v, const std::string& chars, bool left, bool right, int line) {
  const auto [a, z] = StripBounds(v.s(), chars, left, right);
  SpendBytes(s, z - a, line);
  return Substring(v, a, z, &s, line);
}

// A list of `n` elements about to be built.
void SpendElements(Scope& s, uint64_t n, int line) {
  SpendBytes(s, Times(n, kElementBytes), line);
  SpendSteps(s, static_cast<int64_t>(n), line);  // n * kElementBytes fit: n is small
}

bool Equal(Scope& s, const Value& a, const Value& b, int line) {
  int64_t work = 0;
  const bool r = a.Equals(b, &work);
  SpendSteps(s, work, line);
  return r;
}

int64_t Int(const Value& v, const char* what, int line) {
  if (!v.is_int()) Fail(std::string(what) + " needs integers, not " + v.TypeName(), line);
  return v.i();
}

// Integer arithmetic as Python does it, but in 64 bits: what Python would
// make a big integer is an error here, never a wrap or a trap.
int64_t Arithmetic(const std::string& op, int64_t x, int64_t y, int line) {
  int64_t r = 0;
  bool overflow = false;
  if (op == "+") {
    overflow = __builtin_add_overflow(x, y, &r);
  } else if (op == "-") {
    overflow = __builtin_sub_overflow(x, y, &r);
  } else if (op == "*") {
    overflow = __builtin_mul_overflow(x, y, &r);
  } else if (op == "**") {  // y >= 0; by squaring: a square that overflows is needed by the result
    r = 1;
    for (int64_t e = y, b = x; e > 0 && !overflow; e >>= 1) {
      if (e & 1) overflow = __builtin_mul_overflow(r, b, &r);
      if (e > 1 && !overflow) overflow = __builtin_mul_overflow(b, b, &b);
    }
  } else {  // "//" or "%", rounding toward negative infinity
    if (y == 0) Fail("division by zero", line);
    if (y == -1) {  // INT64_MIN / -1 traps (SIGFPE) in C++
      if (op == "%") return 0;
      overflow = __builtin_sub_overflow(int64_t{0}, x, &r);
    } else if (op == "//") {
      r = x / y - ((x % y != 0 && ((x < 0) != (y < 0))) ? 1 : 0);
    } else {
      r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
    }
  }
  if (overflow) {
    Fail("integer overflow in " + std::to_string(x) + " " + op + " " + std::to_string(y) +
             " (template integers are 64-bit)", line);
  }
  return r;
}

Value Index(const Value& base, const Value& key) {
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
    return k >= 0 && k < n ? Substring(base, static_cast<size_t>(k), static_cast<size_t>(k) + 1) : Value();
  }
  if (base.is_object() && key.is_string()) {
    auto it = base.o().find(key.s());
    return it == base.o().end() ? Value() : it->second;
  }
  return Value();
}

// A needle searched for in linear time (Knuth-Morris-Pratt), whatever the
// needle and the text hold: std::string::find is O(text * needle) on a
// needle like 'aa...ab' in a text of 'aaaa...', minutes in one step.
class Searcher {
 public:
  Searcher(Scope& s, const std::string& needle, int line) : needle_(needle) {
    SpendBytes(s, Times(needle.size(), sizeof(size_t)), line);  // the table, freed after
    SpendScan(s, needle.size(), line);
    fallback_.assign(needle.size(), 0);
    for (size_t i = 1, k = 0; i < needle.size(); ++i) {
      while (k > 0 && needle[i] != needle[k]) k = fallback_[k - 1];
      if (needle[i] == needle[k]) ++k;
      fallback_[i] = k;
    }
  }
  // The first match in `text` at or after `from`, or npos; charged for the
  // bytes it scanned.
  size_t Find(Scope& s, const std::string& text, size_t from, int line) const {
    const size_t m = needle_.size();
    if (m == 0) return from <= text.size() ? from : std::string::npos;
    size_t i = from, k = 0;
    for (; i < text.size() && k < m; ++i) {
      while (k > 0 && text[i] != needle_[k]) k = fallback_[k - 1];
      if (text[i] == needle_[k]) ++k;
    }
    SpendScan(s, i - from, line);
    return k == m ? i - m : std::string::npos;
  }

 private:
  const std::string& needle_;
  std::vector<size_t> fallback_;  // per prefix: the longest proper border's length
};

bool Contains(Scope& s, const Value& hay, const Value& needle, int line) {
  if (hay.is_string() && needle.is_string()) {
    return Searcher(s, needle.s(), line).Find(s, hay.s(), 0, line) != std::string::npos;
  }
  if (hay.is_array()) {
    for (const Value& v : hay.a()) {
      if (Equal(s, v, needle, line)) return true;
    }
    return false;
  }
  if (hay.is_object() && needle.is_string()) return hay.o().count(needle.s()) != 0;
  if (hay.is_undefined()) return false;
  Fail(std::string("'in' needs a string, list or dict, not ") + hay.TypeName(), line);
}

// In one pass, charged as it grows (replacing in place is quadratic). The
// bytes kept keep their marks; each `to` brings its own.
Value ReplaceAll(Scope& s, const Value& self, const std::string& from, const Printout& to, int line) {
  const std::string& str = self.s();
  if (from.empty()) return NewString(s, str, line, self.data());
  const Searcher searcher(s, from, line);
  MarkedText out;
  size_t p = 0;
  for (size_t q = searcher.Find(s, str, 0, line); q != std::string::npos; q = searcher.Find(s, str, p, line)) {
    SpendBytes(s, q - p + to.text().size(), line);
    out.Append(str, self.data(), p, q);
    out.Append(to.text(), to.data());
    p = q + from.size();
  }
  SpendBytes(s, str.size() - p, line);
  out.Append(str, self.data(), p);
  return Marked(s, std::move(out), line);
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


Value Split(Scope& s, const Value& self, const Value& sep_arg, int line) {
  const std::string& str = self.s();
  Value::Array out;
  auto piece = [&](size_t p, size_t q) {
    SpendElements(s, 1, line);
    SpendBytes(s, q - p, line);
    out.push_back(Substring(self, p, q, &s, line));
  };
  if (sep_arg.is_undefined() || sep_arg.is_none()) {
    size_t p = 0;
    while (p < str.size()) {
      while (p < str.size() && kSpace.find(str[p]) != std::string::npos) ++p;
      size_t q = p;
      while (q < str.size() && kSpace.find(str[q]) == std::string::npos) ++q;
      if (q > p) piece(p, q);
      p = q;
    }
  } else {
    std::string buf;
    const std::string& sep = Printed(s, sep_arg, buf, line);
    if (sep.empty()) Fail("empty separator", line);
    const Searcher searcher(s, sep, line);
    size_t p = 0;
    for (size_t q = searcher.Find(s, str, 0, line); q != std::string::npos; q = searcher.Find(s, str, p, line)) {
      piece(p, q);
      p = q + sep.size();
    }
    piece(p, str.size());
  }
  return Value(std::move(out));
}

// Filters and methods share these; `self` is the value filtered.
Value ApplyFilter(Scope& s, const std::string& name, const Value& self, const std::vector<Value>& args, int line) {
  auto arg = [&](size_t k) -> const Value& { return k < args.size() ? args[k] : kUndefined; };
  std::string buf0;
  auto arg_text = [&](size_t k, std::string& buf) -> const std::string& { return Printed(s, arg(k), buf, line); };
  auto need_string = [&] {
    if (!self.is_string()) Fail("filter '" + name + "' needs a string, not " + self.TypeName(), line);
  };
  if (name == "trim") {
    need_string();
    return StripValue(s, self, args.empty() ? kSpace : arg_text(0, buf0), true, true, line);
  }
  if (name == "length" || name == "count") {
    if (self.is_string()) return Value(static_cast<int64_t>(self.s().size()));
    if (self.is_array()) return Value(static_cast<int64_t>(self.a().size()));
    if (self.is_object()) return Value(static_cast<int64_t>(self.o().size()));
    Fail(std::string("length of ") + self.TypeName(), line);
  }
  if (name == "upper") return need_string(), NewString(s, Upper(self.s()), line, self.data());
  if (name == "lower") return need_string(), NewString(s, Lower(self.s()), line, self.data());
  if (name == "title") return need_string(), NewString(s, Title(self.s()), line, self.data());
  if (name == "capitalize") {
    need_string();
    std::string str = Lower(self.s());
    if (!str.empty()) str[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(str[0])));
    return NewString(s, std::move(str), line, self.data());
  }
  if (name == "default" || name == "d") {
    const bool boolean = arg(1).Truthy();
    return (self.is_undefined() || (boolean && !self.Truthy())) ? arg(0) : self;
  }
  if (name == "tojson") {
    std::string json = self.Json(Remaining(s));
    const Spans all = {{0, json.size()}};
    const bool data = self.HoldsData() && !json.empty();  // before json is moved from
    return NewString(s, std::move(json), line, data ? &all : nullptr);
  }
  if (name == "string") {
    if (self.is_string()) return self;
    const Printout printed(s, self, line);
    return Value(printed.text(), printed.data() ? *printed.data() : Spans());  // all or nothing: one mark
  }
  if (name == "int") {
    if (self.is_int()) return self;
    if (self.is_double()) {
      // Converting a double outside int64's range (or NaN) is undefined in C++.
      const double d = self.d();
      if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) {
        Fail("int of " + self.Str() + ": out of the integer range (64-bit)", line);
      }
      return Value(static_cast<int64_t>(d));
    }
    if (self.is_string()) {
      try {
        return Value(static_cast<int64_t>(std::stoll(self.s())));
      } catch (const std::out_of_range&) {
        Fail("int of '" + self.s().substr(0, 40) + "': out of the integer range (64-bit)", line);
      } catch (...) {
        return Value(static_cast<int64_t>(0));
      }
    }
    return Value(static_cast<int64_t>(0));
  }
  if (name == "join") {
    if (!self.is_array()) Fail("join needs a list", line);
    SpendSteps(s, static_cast<int64_t>(self.a().size()), line);
    const Printout sep(s, arg(0), line);
    MarkedText out;
    for (size_t k = 0; k < self.a().size(); ++k) {
      if (k) Emit(s, out, sep.text(), sep.data(), line);
      const Printout item(s, self.a()[k], line);
      Emit(s, out, item.text(), item.data(), line);
    }
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
      SpendElements(s, self.s().size(), line);
      Value::Array out;
      for (size_t k = 0; k < self.s().size(); ++k) out.push_back(Substring(self, k, k + 1, &s, line));
      return Value(std::move(out));
    }
    Fail("list of " + std::string(self.TypeName()), line);
  }
  if (name == "replace") {
    need_string();
    const Printout to(s, arg(1), line);
    return ReplaceAll(s, self, arg_text(0, buf0), to, line);
  }
  if (name == "items") {
    if (!self.is_object()) Fail("items needs a dict", line);
    return Items(s, self, line);
  }
  Fail("unsupported filter '" + name + "'", line);
}


}  // namespace

Value Items(Scope& s, const Value& v, int line) {
  SpendElements(s, 3 * v.o().size(), line);  // the pairs and their two elements
  Value::Array out;
  for (const auto& [k, x] : v.o()) out.push_back(Value(Value::Array{Value(k), x}));
  return Value(std::move(out));
}

// A value a namespace attribute may hold (jinja.h, kNamespaceDepth).
const Value& ForNamespace(const Value& v, int line) {
  if (v.depth() >= kNamespaceDepth) {
    Fail("a namespace attribute cannot hold a namespace, or lists and dicts nested " +
             std::to_string(kNamespaceDepth) + " deep", line);
  }
  return v;
}

bool IsKnownFilter(const std::string& name) {
  static const char* kFilters[] = {"trim", "length", "count", "upper", "lower", "title", "capitalize", "default", "d",
                                   "tojson", "string", "int", "join", "first", "last", "list", "replace", "items"};
  for (const char* f : kFilters) {
    if (name == f) return true;
  }
  return false;
}

// ---------------------------------------------------------------- expressions

Value Literal::Evaluate(Scope&) const { return v; }
Value Name::Evaluate(Scope& s) const { return Lookup(s, name, line); }
Value ListExpr::Evaluate(Scope& s) const {
  SpendElements(s, items.size(), line);
  Value::Array a;
  for (const auto& e : items) a.push_back(e->Eval(s));
  return Value(std::move(a));
}

Value DictExpr::Evaluate(Scope& s) const {
  Value::Object o;
  for (const auto& [k, v] : items) {
    const Value key_value = k->Eval(s);
    const Printout key(s, key_value, line);
    // Keys lose marks: data cannot become one (it could come back out of
    // items() unmarked).
    if (key.data() != nullptr) Fail("a dict key made from message content", line);
    SpendBytes(s, key.text().size() + kElementBytes, line);
    o[key.text()] = v->Eval(s);
  }
  return Value(std::move(o));
}

Value Attr::Evaluate(Scope& s) const { return Index(base->Eval(s), Value(name)); }
Value Subscript::Evaluate(Scope& s) const { return Index(base->Eval(s), key->Eval(s)); }
Value Slice::Evaluate(Scope& s) const {
  const Value b = base->Eval(s);
  const int64_t n = b.is_array() ? static_cast<int64_t>(b.a().size()) : b.is_string() ? static_cast<int64_t>(b.s().size()) : -1;
  if (n < 0) Fail("only lists and strings can be sliced", line);
  const int64_t st = step ? Int(step->Eval(s), "a slice", line) : 1;
  if (st == 0) Fail("slice step cannot be zero", line);
  auto norm = [&](const ExprPtr& e, int64_t dflt) {
    if (!e) return dflt;
    int64_t v = Int(e->Eval(s), "a slice", line);
    if (v < 0) v += n;
    return std::clamp<int64_t>(v, st > 0 ? 0 : -1, st > 0 ? n : n - 1);
  };
  const int64_t a = norm(start, st > 0 ? 0 : n - 1), z = norm(stop, st > 0 ? n : -1);
  // In 128 bits: a + k * st must not overflow on the way past the end.
  const __int128 span = st > 0 ? z - a : a - z, stride = st > 0 ? st : -static_cast<__int128>(st);
  const int64_t count = span <= 0 ? 0 : static_cast<int64_t>((span + stride - 1) / stride);
  auto at = [&](int64_t k) { return static_cast<size_t>(a + static_cast<__int128>(k) * st); };
  if (b.is_string()) {
    SpendBytes(s, static_cast<size_t>(count), line);
    MarkedText str;
    for (int64_t k = 0; k < count; ++k) str.Append(b.s(), b.data(), at(k), at(k) + 1);
    return Marked(s, std::move(str), line);
  }
  SpendElements(s, static_cast<uint64_t>(count), line);
  Value::Array arr;
  for (int64_t k = 0; k < count; ++k) arr.push_back(b.a()[at(k)]);
  return Value(std::move(arr));
}

Value Unary::Evaluate(Scope& s) const {
  const Value v = x->Eval(s);
  if (op == "not") return Value(!v.Truthy());
  if (v.is_int()) return Value(Arithmetic("-", 0, v.i(), line));
  if (v.is_double()) return Value(-v.d());
  Fail("unary - needs a number", line);
}

Value Binary::Evaluate(Scope& s) const {
  if (op == "and") {
    Value a = l->Eval(s);
    return a.Truthy() ? r->Eval(s) : a;
  }
  if (op == "or") {
    Value a = l->Eval(s);
    return a.Truthy() ? a : r->Eval(s);
  }
  const Value a = l->Eval(s), b = r->Eval(s);
  if (op == "~") {
    const Printout x(s, a, line), y(s, b, line);
    return Concat(s, x.text(), x.data(), y.text(), y.data(), line);
  }
  if (op == "==") return Value(Equal(s, a, b, line));
  if (op == "!=") return Value(!Equal(s, a, b, line));
  if (op == "in") return Value(Contains(s, b, a, line));
  if (op == "not in") return Value(!Contains(s, b, a, line));
  if (op == "+" && a.is_string() && b.is_string()) return Concat(s, a.s(), a.data(), b.s(), b.data(), line);
  if (op == "+" && a.is_array() && b.is_array()) {
    SpendElements(s, a.a().size() + b.a().size(), line);
    Value::Array c = a.a();
    c.insert(c.end(), b.a().begin(), b.a().end());
    return Value(std::move(c));
  }
  if (op == "<" || op == ">" || op == "<=" || op == ">=") {
    int cmp = 0;
    if (a.is_int() && b.is_int()) {
      cmp = a.i() < b.i() ? -1 : a.i() > b.i() ? 1 : 0;
    } else if (a.is_number() && b.is_number()) {
      cmp = a.d() < b.d() ? -1 : a.d() > b.d() ? 1 : 0;
    } else if (a.is_string() && b.is_string()) {
      SpendScan(s, std::min(a.s().size(), b.s().size()), line);
      cmp = a.s().compare(b.s());
    } else {
      Fail(std::string("cannot compare ") + a.TypeName() + " and " + b.TypeName(), line);
    }
    return Value(op == "<" ? cmp < 0 : op == ">" ? cmp > 0 : op == "<=" ? cmp <= 0 : cmp >= 0);
  }
  if (op == "*" && a.is_string() && b.is_int()) {
    const uint64_t times = b.i() > 0 ? static_cast<uint64_t>(b.i()) : 0;
    SpendBytes(s, Times(times, a.s().size()), line);  // before building: 'x' * 10**9 allocates nothing
    MarkedText out;
    out.text.reserve(a.s().size() * times);
    for (uint64_t k = 0; k < times; ++k) out.Append(a.s(), a.data());
    return Marked(s, std::move(out), line);
  }
  if (!a.is_number() || !b.is_number()) {
    Fail(std::string("'") + op + "' needs numbers (or strings for +), not " + a.TypeName() + " and " + b.TypeName(), line);
  }
  if (a.is_int() && b.is_int() && op != "/" && !(op == "**" && b.i() < 0)) return Value(Arithmetic(op, a.i(), b.i(), line));
  const double x = a.d(), y = b.d();
  if (op == "+") return Value(x + y);
  if (op == "-") return Value(x - y);
  if (op == "*") return Value(x * y);
  if (op == "**") return Value(std::pow(x, y));
  if (y == 0) Fail("division by zero", line);
  if (op == "/") return Value(x / y);
  if (op == "//") return Value(std::floor(x / y));
  return Value(std::fmod(x, y));
}

Value Cond::Evaluate(Scope& s) const {
  if (cond->Eval(s).Truthy()) return then->Eval(s);
  return otherwise ? otherwise->Eval(s) : Value();
}

Value Filter::Evaluate(Scope& s) const {
  std::vector<Value> a;
  for (const auto& e : args) a.push_back(e->Eval(s));
  return ApplyFilter(s, name, x->Eval(s), a, line);
}

Value Test::Evaluate(Scope& s) const {
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
  else if (name == "equalto" || name == "eq") r = arg && Equal(s, v, arg->Eval(s), line);
  else Fail("unsupported test '" + name + "'", line);
  return Value(r != negate);
}

Value Call::Evaluate(Scope& s) const {
  std::vector<Value> a;
  for (const auto& e : args) a.push_back(e->Eval(s));
  if (const auto* n = dynamic_cast<const Name*>(callee.get())) {
    if (const Value f = Lookup(s, n->name, line); f.is_macro()) {
      std::vector<std::pair<std::string, Value>> kw;
      for (const auto& [k, e] : kwargs) kw.emplace_back(k, e->Eval(s));
      return f.macro().Call(s, std::move(a), std::move(kw), line);
    }
    if (n->name == "raise_exception") {
      std::string why = a.empty() ? "" : a[0].Str(kMaxMessageBytes);
      if (why.size() > kMaxMessageBytes) why = why.substr(0, kMaxMessageBytes) + "...";  // it goes to the client
      Error e("chat template line " + std::to_string(line) + ": the template refused the messages: " + why);
      e.refusal = true;
      throw e;
    }
    if (n->name == "namespace") {
      Value::Object o;
      for (const auto& [k, e] : kwargs) {
        SpendBytes(s, k.size() + kElementBytes, line);
        o[k] = ForNamespace(e->Eval(s), line);
      }
      return Value::Namespace(std::move(o));
    }
    if (n->name == "range") {
      if (a.empty() || a.size() > 3) Fail("range takes 1 to 3 integers", line);
      const int64_t start = a.size() == 1 ? 0 : Int(a[0], "range", line);
      const int64_t stop = Int(a[a.size() == 1 ? 0 : 1], "range", line);
      const int64_t step = a.size() == 3 ? Int(a[2], "range", line) : 1;
      if (step == 0) Fail("range step cannot be zero", line);
      // In 128 bits: a hostile template's bounds must not overflow the count.
      const __int128 span = step > 0 ? static_cast<__int128>(stop) - start : static_cast<__int128>(start) - stop;
      const __int128 stride = step > 0 ? step : -static_cast<__int128>(step);
      const uint64_t len = span <= 0 ? 0 : static_cast<uint64_t>((span + stride - 1) / stride);
      SpendElements(s, len, line);
      Value::Array out;
      for (uint64_t k = 0; k < len; ++k) out.push_back(Value(static_cast<int64_t>(start + static_cast<__int128>(k) * step)));
      return Value(std::move(out));
    }
    Fail("unsupported function '" + n->name + "'", line);
  }
  const auto* m = dynamic_cast<const Attr*>(callee.get());
  if (m == nullptr) Fail("only functions and methods can be called", line);
  const Value self = m->base->Eval(s);
  const std::string& name = m->name;
  auto arg = [&](size_t k) -> const Value& { return k < a.size() ? a[k] : kUndefined; };
  std::string buf0;
  auto arg_text = [&](size_t k, std::string& buf) -> const std::string& { return Printed(s, arg(k), buf, line); };
  if (self.is_string()) {
    const std::string& str = self.s();
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const std::string& chars = a.empty() || a[0].is_none() ? kSpace : arg_text(0, buf0);
      return StripValue(s, self, chars, name != "rstrip", name != "lstrip", line);
    }
    if (name == "startswith" || name == "endswith") {
      const std::string& x = arg_text(0, buf0);
      SpendScan(s, x.size(), line);
      if (str.size() < x.size()) return Value(false);
      return Value(str.compare(name == "startswith" ? 0 : str.size() - x.size(), x.size(), x) == 0);
    }
    if (name == "upper") return NewString(s, Upper(str), line, self.data());
    if (name == "lower") return NewString(s, Lower(str), line, self.data());
    if (name == "title") return NewString(s, Title(str), line, self.data());
    if (name == "replace") {
      const Printout to(s, arg(1), line);
      return ReplaceAll(s, self, arg_text(0, buf0), to, line);
    }
    if (name == "split") return Split(s, self, arg(0), line);
  }
  if (self.is_object()) {
    if (name == "get") {
      auto it = self.o().find(arg_text(0, buf0));
      return it != self.o().end() ? it->second : (a.size() > 1 ? a[1] : Value(Value::None{}));
    }
    if (name == "items") return Items(s, self, line);
    if (name == "keys" || name == "values") {
      SpendElements(s, self.o().size(), line);
      Value::Array out;
      for (const auto& [k, v] : self.o()) out.push_back(name == "keys" ? Value(k) : v);
      return Value(std::move(out));
    }
  }
  Fail("unsupported method '" + name + "' on " + self.TypeName(), line);
}

// ---------------------------------------------------------------- printing

void TextNode::Run(Scope& s, MarkedText& out) const { Emit(s, out, text, nullptr, line); }
void OutputNode::Run(Scope& s, MarkedText& out) const {
  const Value v = x->Eval(s);
  const Printout printed(s, v, line);
  Emit(s, out, printed.text(), printed.data(), line);
}

}  // namespace kvx::server::jinja
