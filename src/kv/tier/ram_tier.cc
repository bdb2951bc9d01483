#include "kv/tier/ram_tier.h"

namespace kvx::kv::tier {

Result<std::unique_ptr<RamTier>> RamTier::Open(uint64_t max_bytes) {
  if (max_bytes == 0) return InvalidArgument("the host-RAM tier's budget must be at least 1 byte (--cache-ram-bytes)");
  return std::unique_ptr<RamTier>(new RamTier(max_bytes));
}

void RamTier::CountSize() { SetSize(index_.used_bytes(), index_.size()); }

Status RamTier::Put(const BlockKey& key, std::string_view bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes.size() > index_.max_bytes()) {
    Count([](TierStats& s) { ++s.errors; });
    return ResourceExhausted("a block of " + std::to_string(bytes.size()) + " bytes is larger than the host-RAM tier's " +
                             std::to_string(index_.max_bytes()) + " bytes");
  }
  if (index_.Remove(key)) values_.erase(key);
  for (const BlockKey& victim : index_.EvictFor(bytes.size())) {
    values_.erase(victim);
    Count([](TierStats& s) { ++s.evictions; });
  }
  index_.Add(key, bytes.size());
  values_[key] = std::string(bytes);
  CountSize();
  Count([](TierStats& s) { ++s.puts; });
  return Status::Ok();
}

std::optional<std::string> RamTier::Get(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = values_.find(key);
  if (it == values_.end()) {
    Count([](TierStats& s) { ++s.misses; });
    return std::nullopt;
  }
  index_.Touch(key);
  Count([](TierStats& s) { ++s.hits; });
  return it->second;
}

void RamTier::Erase(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (index_.Remove(key)) values_.erase(key);
  CountSize();
}

}  // namespace kvx::kv::tier
