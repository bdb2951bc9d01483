#include "kv/tier/ram_tier.h"

namespace kvx::kv::tier {

Result<std::unique_ptr<RamTier>> RamTier::Open(uint64_t max_bytes, TierLog log) {
  if (max_bytes == 0) return InvalidArgument("the host-RAM tier's budget must be at least 1 byte (--cache-ram-bytes)");
  return std::unique_ptr<RamTier>(new RamTier(max_bytes, std::move(log)));
}

void RamTier::CountSize() {
  SetSize(index_.used_bytes(), index_.size());
  Count([&](TierStats& s) { s.pinned = index_.pinned(); });
}

Status RamTier::Put(const BlockKey& key, std::string_view bytes) {
  if (bytes.size() > index_.max_bytes()) {
    Count([](TierStats& s) { ++s.errors; });
    return ResourceExhausted("a block of " + std::to_string(bytes.size()) + " bytes is larger than the host-RAM tier's " +
                             std::to_string(index_.max_bytes()) + " bytes");
  }
  auto value = std::make_shared<const std::string>(bytes);  // copied before the lock: lookups need not wait
  std::lock_guard<std::mutex> lock(mu_);
  if (index_.Remove(key)) values_.erase(key);
  uint64_t pins_broken = 0;
  for (const BlockKey& victim : index_.EvictFor(bytes.size(), &pins_broken)) {
    values_.erase(victim);
    Count([](TierStats& s) { ++s.evictions; });
    Dropped(victim);
  }
  if (pins_broken > 0) {
    Count([&](TierStats& s) { s.pins_broken += pins_broken; });
    log_("host-RAM tier: its " + std::to_string(index_.max_bytes()) + " bytes hold only pinned blocks: gave back " +
         std::to_string(pins_broken) + " pin(s), least recently used first (raise --cache-ram-bytes or unpin)");
  }
  index_.Add(key, bytes.size());
  values_[key] = std::move(value);
  CountSize();
  Count([](TierStats& s) { ++s.puts; });
  return Status::Ok();
}

std::optional<std::string> RamTier::Get(const BlockKey& key) {
  std::shared_ptr<const std::string> value;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = values_.find(key);
    if (it == values_.end()) {
      Count([](TierStats& s) { ++s.misses; });
      return std::nullopt;
    }
    index_.Touch(key);
    value = it->second;
  }
  Count([](TierStats& s) { ++s.hits; });
  return *value;  // copied with the lock released (a Put may replace the value meanwhile: this one stays whole)
}

void RamTier::Pin(const BlockKey& key, bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  index_.Pin(key, on);
  CountSize();
}

bool RamTier::Has(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return values_.count(key) != 0;
}

void RamTier::Erase(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (index_.Remove(key)) values_.erase(key);
  CountSize();
}

}  // namespace kvx::kv::tier
