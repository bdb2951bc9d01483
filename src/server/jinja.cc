// Values and the Template entry points; the interpreter is in jinja_lex.cc,
// jinja_parse.cc, jinja_eval.cc and jinja_run.cc (jinja_ast.h).
#include "server/jinja.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>

#include "server/jinja_ast.h"

namespace kvx::server::jinja {

void Fail(const std::string& message, int line) {
  throw Error("chat template line " + std::to_string(line) + ": " + message);
}

namespace {

// Appends `s` quoted and escaped, stopping once `out` passes max_bytes (an
// escaped string can be six times longer than it is).
void AppendJsonString(std::string& out, const std::string& s, size_t max_bytes) {
  out += '"';
  for (unsigned char c : s) {
    if (out.size() > max_bytes) return;
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
  out += '"';
}

}  // namespace

void MarkedText::Append(const std::string& str, const Spans* marks, size_t begin, size_t end) {
  end = std::min(end, str.size());
  if (begin >= end) return;
  const size_t at = text.size();
  text.append(str, begin, end - begin);
  if (marks == nullptr) return;
  // The first mark that ends past `begin`, then every one that starts before `end`.
  auto it = std::upper_bound(marks->begin(), marks->end(), begin,
                             [](size_t b, const std::pair<size_t, size_t>& m) { return b < m.second; });
  for (; it != marks->end() && it->first < end; ++it) {
    const size_t from = at + std::max(it->first, begin) - begin, to = at + std::min(it->second, end) - begin;
    if (!data.empty() && data.back().second == from) {
      data.back().second = to;  // touching: one mark
    } else {
      data.emplace_back(from, to);
    }
  }
}

Value::Value(std::string s, Spans data) : Value(std::move(s)) {
  if (!data.empty()) data_ = std::make_shared<const Spans>(std::move(data));
}

bool Value::HoldsData() const {
  if (data_ != nullptr) return true;
  if (is_array()) return std::any_of(a().begin(), a().end(), [](const Value& v) { return v.HoldsData(); });
  if (is_object()) return std::any_of(o().begin(), o().end(), [](const auto& kv) { return kv.second.HoldsData(); });
  return false;
}

Value::Value(Array a) {
  for (const Value& x : a) depth_ = std::max(depth_, x.depth_ + 1);
  depth_ = std::max(depth_, 1);
  v_ = std::make_shared<Array>(std::move(a));
}

Value::Value(Object o) {
  for (const auto& [key, x] : o) depth_ = std::max(depth_, x.depth_ + 1);
  depth_ = std::max(depth_, 1);
  v_ = std::make_shared<Object>(std::move(o));
}

bool Value::Truthy() const {
  if (is_undefined() || is_none()) return false;
  if (is_bool()) return b();
  if (is_int()) return i() != 0;
  if (is_double()) return d() != 0;
  if (is_string()) return !s().empty();
  if (is_array()) return !a().empty();
  if (is_macro()) return true;
  return !o().empty();
}

std::string Value::Str(size_t max_bytes) const {
  if (is_string()) return s();
  std::string out;
  AppendStr(out, max_bytes);
  return out;
}

std::string Value::Json(size_t max_bytes) const {
  std::string out;
  AppendJson(out, max_bytes);
  return out;
}

void Value::AppendStr(std::string& out, size_t max_bytes) const {
  if (out.size() > max_bytes) return;
  if (is_undefined()) return;
  if (is_none()) {
    out += "None";
  } else if (is_bool()) {
    out += b() ? "True" : "False";
  } else if (is_int()) {
    out += std::to_string(i());
  } else if (is_double()) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", d());
    out += buf;
    if (std::string_view(buf).find_first_of(".e") == std::string_view::npos) out += ".0";
  } else if (is_string()) {
    out += s();
  } else if (is_macro()) {
    out += "<macro>";
  } else if (is_array()) {
    out += '[';
    for (size_t k = 0; k < a().size() && out.size() <= max_bytes; ++k) {
      if (k) out += ", ";
      const Value& x = a()[k];
      if (x.is_string()) out += "'" + x.s() + "'";
      else x.AppendStr(out, max_bytes);
    }
    out += ']';
  } else {
    out += '{';
    bool first = true;
    for (auto it = o().begin(); it != o().end() && out.size() <= max_bytes; ++it) {
      out += (first ? "'" : ", '") + it->first + "': ";
      if (it->second.is_string()) out += "'" + it->second.s() + "'";
      else it->second.AppendStr(out, max_bytes);
      first = false;
    }
    out += '}';
  }
}

void Value::AppendJson(std::string& out, size_t max_bytes) const {
  if (out.size() > max_bytes) return;
  if (is_undefined() || is_none() || is_macro()) {
    out += "null";
  } else if (is_bool()) {
    out += b() ? "true" : "false";
  } else if (is_number()) {
    AppendStr(out, max_bytes);
  } else if (is_string()) {
    AppendJsonString(out, s(), max_bytes);
  } else if (is_array()) {
    out += '[';
    for (size_t k = 0; k < a().size() && out.size() <= max_bytes; ++k) {
      if (k) out += ", ";
      a()[k].AppendJson(out, max_bytes);
    }
    out += ']';
  } else {
    out += '{';
    bool first = true;
    for (auto it = o().begin(); it != o().end() && out.size() <= max_bytes; ++it) {
      if (!first) out += ", ";
      AppendJsonString(out, it->first, max_bytes);
      out += ": ";
      it->second.AppendJson(out, max_bytes);
      first = false;
    }
    out += '}';
  }
}

bool Value::Equals(const Value& x, int64_t* work) const {
  auto spend = [&](int64_t n) {
    if (work != nullptr) *work += n;
  };
  spend(1);
  if (is_int() && x.is_int()) return i() == x.i();  // exact: doubles would merge large integers
  if (is_number() && x.is_number()) return d() == x.d();
  if (is_string() && x.is_string()) {
    spend(static_cast<int64_t>(std::min(s().size(), x.s().size()) / 256));
    return s() == x.s();
  }
  if (is_bool() && x.is_bool()) return b() == x.b();
  if ((is_none() || is_undefined()) && (x.is_none() || x.is_undefined())) return is_none() == x.is_none();
  if (is_array() && x.is_array()) {
    if (a().size() != x.a().size()) return false;
    for (size_t k = 0; k < a().size(); ++k) {
      if (!a()[k].Equals(x.a()[k], work)) return false;
    }
    return true;
  }
  if (is_object() && x.is_object()) return &o() == &x.o();
  if (is_macro() && x.is_macro()) return &macro() == &x.macro();
  return false;
}

const char* Value::TypeName() const {
  if (is_undefined()) return "undefined";
  if (is_none()) return "none";
  if (is_bool()) return "bool";
  if (is_number()) return "number";
  if (is_string()) return "string";
  if (is_array()) return "list";
  if (is_macro()) return "macro";
  return "dict";
}

Template::~Template() = default;

Result<std::shared_ptr<const Template>> Template::Parse(const std::string& source) {
  try {
    std::shared_ptr<Template> t(new Template());
    t->body_ = ParseTemplate(source);
    return std::shared_ptr<const Template>(std::move(t));
  } catch (const std::exception& e) {  // Error, or std::bad_alloc
    return InvalidArgument(e.what());
  }
}

Result<std::string> Template::Render(const Value::Object& context, const Limits& limits) const {
  KVX_ASSIGN_OR_RETURN(MarkedText out, RenderMarked(context, limits));
  return std::move(out.text);
}

Result<MarkedText> Template::RenderMarked(const Value::Object& context, const Limits& limits) const {
  try {
    Budget budget{limits};
    Scope s;
    s.budget = &budget;
    s.frames.push_back(context);
    s.frames.emplace_back();  // the template's own top-level sets
    MarkedText out;
    RunBody(body_, s, out);
    return out;
  } catch (const Error& e) {
    return Status(e.refusal ? StatusCode::kInvalidArgument : StatusCode::kInternal, e.what());
  } catch (const std::exception& e) {
    return Internal(std::string("chat template: ") + e.what());
  }
}

}  // namespace kvx::server::jinja
