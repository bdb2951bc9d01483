// Tenants: who a request belongs to. A tenant's prefix-cache entries,
// named sessions and session files are its own (docs/serving.md,
// "Tenants").
//
// With API keys (kvx serve --api-key KEY, --api-keys FILE of `name:key`
// lines) the key is the tenant: each key names one, and the request's
// `user` field changes nothing. Without keys tenancy is advisory: the
// tenant is the `user` field a client chooses (or none), so any client can
// claim any tenant.
//
// Keys are compared in constant time (the time depends on the configured
// key's length, never on how much of it a guess matched), every key is
// tried whichever matches, and no message names a key.
//
// Thread-safety: immutable after construction.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace kvx::server {

struct ApiKey {
  std::string tenant;  // the name it is known by (never the key)
  std::string key;
};

struct Tenant {
  std::string name;   // "" without keys and without a `user`
  uint64_t salt = 0;  // the scheduler's tenant_salt: 0 for the nameless tenant
};

// The keys of an --api-keys file: one `name:key` per line; blank lines and
// lines starting with '#' are skipped; names are 1-64 of [A-Za-z0-9_.-].
// InvalidArgument naming the line (never its key) for a malformed line, an
// empty name or key, or a name or key given twice; NotFound if unreadable.
Result<std::vector<ApiKey>> ReadApiKeys(const std::string& path);
// Refuses an empty key and a name or key given twice in `keys`.
Status CheckApiKeys(const std::vector<ApiKey>& keys);

// Whether a == b, in a time that depends only on b's length.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// The salt of the tenant called `name` (0 for "").
uint64_t TenantSalt(std::string_view name);

class Tenants {
 public:
  explicit Tenants(std::vector<ApiKey> keys) : keys_(std::move(keys)) {}

  bool keyed() const { return !keys_.empty(); }
  // With keys: the tenant whose key `authorization` ("Bearer KEY") carries,
  // or nullopt. Without keys: the tenant `user` names (advisory).
  std::optional<Tenant> Identify(std::string_view authorization, std::string_view user) const;

 private:
  std::vector<ApiKey> keys_;
};

}  // namespace kvx::server
