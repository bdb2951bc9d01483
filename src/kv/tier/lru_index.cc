#include "kv/tier/lru_index.h"

namespace kvx::kv::tier {

std::optional<uint64_t> LruIndex::Bytes(const BlockKey& key) const {
  auto it = index_.find(key);
  if (it == index_.end()) return std::nullopt;
  return it->second.bytes;
}

void LruIndex::Touch(const BlockKey& key) {
  auto it = index_.find(key);
  if (it != index_.end()) lru_.splice(lru_.begin(), lru_, it->second.lru);
}

void LruIndex::Add(const BlockKey& key, uint64_t bytes) {
  Remove(key);
  lru_.push_front(key);
  index_[key] = Entry{bytes, lru_.begin()};
  used_ += bytes;
}

bool LruIndex::Remove(const BlockKey& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  used_ -= it->second.bytes;
  lru_.erase(it->second.lru);
  index_.erase(it);
  return true;
}

std::vector<BlockKey> LruIndex::EvictFor(uint64_t incoming) {
  std::vector<BlockKey> out;
  while (used_ + incoming > max_bytes_ && !lru_.empty()) {
    const BlockKey victim = lru_.back();  // a copy: Remove erases the list node
    Remove(victim);
    out.push_back(victim);
  }
  return out;
}

}  // namespace kvx::kv::tier
