#include "kv/tier/tier.h"

#include <cstdio>

namespace kvx::kv::tier {

TierLog StderrTierLog() {
  return [](const std::string& line) { std::fprintf(stderr, "kvx: %s\n", line.c_str()); };
}

void Tier::DropCorrupt(const BlockKey& key) {
  Erase(key);
  Count([](TierStats& s) { ++s.errors; });
  Dropped(key);
}

TierStats Tier::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

}  // namespace kvx::kv::tier
