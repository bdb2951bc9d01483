#include "kv/policy/eviction_fate.h"

namespace kvx::kv {

EvictionFateRegistry& EvictionFateRegistry::Global() {
  static EvictionFateRegistry registry;
  return registry;
}

namespace {
const FateRegistrar kRegistered("drop", [](PolicyParamReader&) -> Result<std::unique_ptr<EvictionFate>> {
  return std::unique_ptr<EvictionFate>(new DropFate());
});
}  // namespace

void EvictionFateRegistry::Register(std::string name, FateFactory factory) {
  factories_[std::move(name)] = std::move(factory);
}

Result<std::unique_ptr<EvictionFate>> EvictionFateRegistry::Create(std::string_view name,
                                                                   PolicyParamReader& params) const {
  auto it = factories_.find(name);
  if (it == factories_.end()) {
    std::string known;
    for (const auto& [n, f] : factories_) known += (known.empty() ? "" : ", ") + n;
    return InvalidArgument("policy " + params.policy() + ": unknown fate '" + std::string(name) +
                           "' for evicted entries; known fates: " + known);
  }
  return it->second(params);
}

std::vector<std::string> EvictionFateRegistry::Names() const {
  std::vector<std::string> names;
  for (const auto& [n, f] : factories_) names.push_back(n);
  return names;
}

Status DropFate::Apply(KVManager& manager, SeqId seq, int layer, int kv_head, const std::vector<int>& evicted,
                       const std::vector<int>& /*kept*/) {
  return manager.kv(seq).RemoveEntries(layer, kv_head, evicted);
}

}  // namespace kvx::kv
