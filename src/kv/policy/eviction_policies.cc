#include "kv/policy/eviction_policies.h"

namespace kvx::kv {

std::vector<ScorerMethod> ScorerMethods() {
  return {H2OMethod(), ScissorhandsMethod(), TovaMethod(), SnapKVMethod(), CakeMethod(), KeyNormMethod(), RandomMethod()};
}

namespace {

PolicyFactory FactoryFor(ScorerMethod m, const std::string& name) {
  return [m, name](const PolicyParams& params) { return ScoredEvictionPolicy::Create(name, params, m.defaults, m.make); };
}

// Ada-KV over any scorer: base=NAME picks it (default snapkv, Ada-SnapKV).
Result<std::unique_ptr<KVPolicy>> CreateAdaKV(const PolicyParams& params) {
  std::string base = "snapkv";
  if (auto it = params.find("base"); it != params.end()) base = it->second;
  std::vector<std::string> names;
  for (const ScorerMethod& m : ScorerMethods()) {
    names.push_back(m.name);
    if (m.name != base) continue;
    EvictionConfig d = m.defaults;
    d.heads = "adakv";
    d.continuous = false;  // Ada-KV compresses at the end of prefill
    auto make = [m, names](PolicyParamReader& r) {
      std::string b;
      r.Choice("base", &b, {m.name});  // marks base= as known
      return m.make(r);
    };
    return ScoredEvictionPolicy::Create("adakv", params, d, make);
  }
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  return InvalidArgument("policy adakv: base=" + base + " is not a scorer; choose one of " + list);
}

}  // namespace

void RegisterEvictionPolicies(PolicyRegistry& registry) {
  for (const ScorerMethod& m : ScorerMethods()) registry.Register(m.name, FactoryFor(m, m.name));
  ScorerMethod pyramid = SnapKVMethod();
  pyramid.defaults.layers = "pyramid";
  registry.Register("pyramidkv", FactoryFor(pyramid, "pyramidkv"));
  registry.Register("adakv", CreateAdaKV);
}

}  // namespace kvx::kv
