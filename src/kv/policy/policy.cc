#include "kv/policy/policy.h"

#include "kv/policy/params.h"

namespace kvx::kv {

// Empty until the registrars in the policies' own files run (static
// initialization; kvx_kv is linked whole-archive so none is dropped).
PolicyRegistry& PolicyRegistry::Global() {
  static PolicyRegistry registry;
  return registry;
}

void PolicyRegistry::Register(std::string name, PolicyFactory factory) { factories_[std::move(name)] = std::move(factory); }

Result<std::unique_ptr<KVPolicy>> PolicyRegistry::Build(std::string_view name, PolicyParamReader& reader) const {
  auto it = factories_.find(name);
  if (it == factories_.end()) {
    std::string known;
    for (const auto& [n, f] : factories_) known += (known.empty() ? "" : ", ") + n;
    return InvalidArgument("unknown KV policy '" + std::string(name) + "'; known policies: " +
                           (known.empty() ? "none" : known));
  }
  auto policy = it->second(reader);
  // A factory that failed may not have read every key: its error (or the
  // reader's first parse error) says what is wrong, not the unread keys.
  if (!policy.ok()) return reader.error().ok() ? policy.status() : reader.error();
  KVX_RETURN_IF_ERROR(reader.Finish());
  return policy;
}

Result<std::unique_ptr<KVPolicy>> PolicyRegistry::Create(std::string_view name, const PolicyParams& params) const {
  PolicyParamReader reader(std::string(name), params);
  return Build(name, reader);
}

Result<PolicyParams> PolicyRegistry::KeyExamples(std::string_view name, const PolicyParams& params) const {
  PolicyParamReader reader(std::string(name), params);
  KVX_RETURN_IF_ERROR(Build(name, reader).status());
  return reader.examples();
}

std::vector<std::string> PolicyRegistry::Names() const {
  std::vector<std::string> names;
  for (const auto& [n, f] : factories_) names.push_back(n);
  return names;
}

}  // namespace kvx::kv
