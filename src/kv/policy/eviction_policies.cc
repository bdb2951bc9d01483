#include "kv/policy/eviction_policies.h"

#include <map>

namespace kvx::kv {
namespace {

std::map<std::string, ScorerMethod, std::less<>>& Scorers() {
  static std::map<std::string, ScorerMethod, std::less<>> scorers;
  return scorers;
}

std::string ScorerList() {
  std::string list;
  for (const auto& [name, m] : Scorers()) list += (list.empty() ? "" : ", ") + name;
  return list;
}

// Ada-KV over any scorer: base=NAME picks it (default snapkv, Ada-SnapKV).
Result<std::unique_ptr<KVPolicy>> CreateAdaKV(PolicyParamReader& r) {
  std::string base = "snapkv";
  std::vector<std::string> names;
  for (const auto& [name, m] : Scorers()) names.push_back(name);
  r.Choice("base", &base, names);
  KVX_ASSIGN_OR_RETURN(ScorerMethod m, FindScorerMethod(base));
  EvictionConfig d = m.defaults;
  d.heads = "adakv";
  d.continuous = false;  // Ada-KV compresses at the end of prefill
  return ScoredEvictionPolicy::Create("adakv", r, d, m.make);
}

const PolicyRegistrar kAdaKV("adakv", CreateAdaKV);

}  // namespace

std::vector<ScorerMethod> ScorerMethods() {
  std::vector<ScorerMethod> out;
  for (const auto& [name, m] : Scorers()) out.push_back(m);
  return out;
}

Result<ScorerMethod> FindScorerMethod(std::string_view name) {
  auto it = Scorers().find(name);
  if (it == Scorers().end()) {
    return InvalidArgument("'" + std::string(name) + "' is not a scorer; choose one of " + ScorerList());
  }
  return it->second;
}

PolicyFactory ScoredPolicyFactory(std::string policy, std::string scorer, std::function<void(EvictionConfig&)> adjust) {
  return [policy, scorer, adjust](PolicyParamReader& r) -> Result<std::unique_ptr<KVPolicy>> {
    KVX_ASSIGN_OR_RETURN(ScorerMethod m, FindScorerMethod(scorer));
    if (adjust) adjust(m.defaults);
    return ScoredEvictionPolicy::Create(policy, r, m.defaults, m.make);
  };
}

ScorerRegistrar::ScorerRegistrar(ScorerMethod method) {
  PolicyRegistry::Global().Register(method.name, ScoredPolicyFactory(method.name, method.name));
  Scorers()[method.name] = std::move(method);
}

}  // namespace kvx::kv
