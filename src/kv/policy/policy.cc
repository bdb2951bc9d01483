#include "kv/policy/policy.h"

#include "kv/policy/demote_fate.h"
#include "kv/policy/head_typing.h"
#include "kv/policy/merge_fate.h"
#include "kv/policy/minicache.h"
#include "kv/policy/quest.h"
#include "kv/policy/eviction_policies.h"
#include "kv/policy/streaming_llm.h"
#include "kv/policy/think.h"

namespace kvx::kv {

// The built-in policies, registered on first use (a static registrar in a
// static library's object file would be dropped by the linker).
PolicyRegistry& PolicyRegistry::Global() {
  static PolicyRegistry* registry = [] {
    auto* r = new PolicyRegistry();
    r->Register("streamingllm", StreamingLLMPolicy::Create);
    r->Register("quest", QuestPolicy::Create);
    r->Register("duo", HeadTypingPolicy::CreateDuo);
    r->Register("razor", HeadTypingPolicy::CreateRazor);
    r->Register("minicache", MiniCachePolicy::Create);
    r->Register("think", ThinKPolicy::Create);
    RegisterMergePolicies(*r);  // fate=merge, kvmerger (merge_fate.h)
    RegisterDemotePolicies(*r);  // fate=demote, mikv (demote_fate.h)
    RegisterEvictionPolicies(*r);  // h2o, snapkv, ... (eviction_policies.h)
    return r;
  }();
  return *registry;
}

void PolicyRegistry::Register(std::string name, PolicyFactory factory) { factories_[std::move(name)] = std::move(factory); }

Result<std::unique_ptr<KVPolicy>> PolicyRegistry::Create(std::string_view name, const PolicyParams& params) const {
  auto it = factories_.find(name);
  if (it == factories_.end()) {
    std::string known;
    for (const auto& [n, f] : factories_) known += (known.empty() ? "" : ", ") + n;
    return InvalidArgument("unknown KV policy '" + std::string(name) + "'; known policies: " +
                           (known.empty() ? "none" : known));
  }
  return it->second(params);
}

std::vector<std::string> PolicyRegistry::Names() const {
  std::vector<std::string> names;
  for (const auto& [n, f] : factories_) names.push_back(n);
  return names;
}

}  // namespace kvx::kv
