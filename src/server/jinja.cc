// Values and the Template entry points; the interpreter is in jinja_lex.cc,
// jinja_parse.cc and jinja_eval.cc (jinja_ast.h).
#include "server/jinja.h"

#include <cstdio>
#include <string>

#include "server/jinja_ast.h"

namespace kvx::server::jinja {

void Fail(const std::string& message, int line) {
  throw Error("chat template line " + std::to_string(line) + ": " + message);
}

namespace {

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
  if (is_macro()) return true;
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
  if (is_macro()) return "<macro>";
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
  if (is_macro()) return "null";
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
  } catch (const Error& e) {
    return InvalidArgument(e.what());
  }
}

Result<std::string> Template::Render(const Value::Object& context) const {
  try {
    int64_t work = 0;
    Scope s;
    s.work = &work;
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
