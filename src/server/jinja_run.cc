// The evaluator of statements: the AST's Run for if, for and set, over the
// expression evaluator of jinja_eval.cc (text and output nodes print there).
#include <algorithm>
#include <string>
#include <vector>

#include "server/jinja_ast.h"

namespace kvx::server::jinja {

void IfNode::Run(Scope& s, MarkedText& out) const {
  for (const auto& [c, body] : branches) {
    if (!c || c->Eval(s).Truthy()) {
      RunBody(body, s, out);
      return;
    }
  }
}

void ForNode::Run(Scope& s, MarkedText& out) const {
  Value seq = iter->Eval(s);
  if (seq.is_object()) seq = Items(s, seq, line);
  if (seq.is_undefined() || seq.is_none()) seq = Value(Value::Array{});
  if (!seq.is_array()) Fail(std::string("cannot loop over ") + seq.TypeName(), line);
  Value::Array items;
  for (const Value& v : seq.a()) {
    if (filter) {
      SpendSteps(s, 1, line);
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
    SpendSteps(s, kFrameSteps, line);
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

void MacroNode::Run(Scope& s, MarkedText&) const { s.frames.back()[name] = Value(this); }

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
  SpendSteps(caller, kFrameSteps, call_line);
  Scope inner{{Value::Object()}, &caller, caller.macro_depth + 1, caller.budget};
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
  MarkedText out;
  RunBody(body, inner, out);
  return Value(std::move(out));
}

void SetNode::Run(Scope& s, MarkedText&) const {
  Value v = x->Eval(s);
  if (attr.empty()) {
    s.frames.back()[name] = std::move(v);
    return;
  }
  Value ns = Lookup(s, name, line);
  if (!ns.is_namespace()) Fail("'" + name + "' is not a namespace(): only namespace attributes can be set", line);
  ns.o()[attr] = ForNamespace(v, line);
}

}  // namespace kvx::server::jinja
