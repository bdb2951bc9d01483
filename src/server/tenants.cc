#include "server/tenants.h"

#include <cctype>
#include <fstream>
#include <set>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvx::server {

namespace {

bool ValidTenantName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
  }
  return true;
}

}  // namespace

Status CheckApiKeys(const std::vector<ApiKey>& keys) {
  std::set<std::string_view> names, secrets;
  for (const ApiKey& k : keys) {
    if (k.key.empty()) {
      return InvalidArgument("the API key of tenant '" + k.tenant + "' is empty: an empty key would let every client in");
    }
    if (!ValidTenantName(k.tenant)) {
      return InvalidArgument("tenant name '" + k.tenant + "' must be 1-64 characters of A-Z, a-z, 0-9, _, - and .");
    }
    if (!names.insert(k.tenant).second) return InvalidArgument("tenant '" + k.tenant + "' is given two keys");
    if (!secrets.insert(k.key).second) {
      return InvalidArgument("tenant '" + k.tenant + "' has the same key as another tenant: give each its own");
    }
  }
  return Status::Ok();
}

Result<std::vector<ApiKey>> ReadApiKeys(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot read --api-keys file " + path);
  std::vector<ApiKey> keys;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    const std::string where = path + " line " + std::to_string(n);
    const size_t colon = line.find(':');
    if (colon == std::string::npos) return InvalidArgument(where + ": expected 'name:key'");
    keys.push_back({line.substr(0, colon), line.substr(colon + 1)});
    if (Status st = CheckApiKeys(keys); !st.ok()) return InvalidArgument(where + ": " + st.message());
  }
  if (keys.empty()) return InvalidArgument(path + " holds no 'name:key' line: give at least one key");
  return keys;
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Every byte of b is compared, whatever differed before: no early exit.
  unsigned diff = a.size() != b.size() ? 1u : 0u;
  for (size_t i = 0; i < b.size(); ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    diff |= x ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
}

uint64_t TenantSalt(std::string_view name) {
  if (name.empty()) return 0;
  return XXH3_64bits(name.data(), name.size()) | 1;  // never 0, the nameless tenant's
}

std::optional<Tenant> Tenants::Identify(std::string_view authorization, std::string_view user) const {
  if (keys_.empty()) return Tenant{std::string(user), TenantSalt(user)};
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization.substr(0, kBearer.size()) != kBearer) return std::nullopt;
  const std::string_view presented = authorization.substr(kBearer.size());
  const ApiKey* match = nullptr;
  for (const ApiKey& k : keys_) {  // all of them, whichever matches
    if (ConstantTimeEquals(presented, k.key)) match = &k;
  }
  if (match == nullptr) return std::nullopt;
  return Tenant{match->tenant, TenantSalt(match->tenant)};
}

}  // namespace kvx::server
