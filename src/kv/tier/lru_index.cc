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

std::vector<BlockKey> LruIndex::EvictFor(uint64_t incoming, uint64_t* pins_broken) {
  std::vector<BlockKey> out;
  uint64_t freed = 0;
  for (const bool pinned_pass : {false, true}) {  // unpinned keys first, least recently used first
    for (auto it = lru_.rbegin(); it != lru_.rend() && used_ - freed + incoming > max_bytes_; ++it) {
      if ((pinned_.count(*it) != 0) != pinned_pass) continue;
      out.push_back(*it);
      freed += index_.at(*it).bytes;
    }
  }
  for (const BlockKey& victim : out) {
    if (pinned_.erase(victim) != 0 && pins_broken != nullptr) ++*pins_broken;
    Remove(victim);
  }
  return out;
}

void LruIndex::Pin(const BlockKey& key, bool on) {
  if (on) {
    pinned_.insert(key);
  } else {
    pinned_.erase(key);
  }
}

size_t LruIndex::pinned() const {
  size_t n = 0;
  for (const BlockKey& k : pinned_) n += index_.count(k);
  return n;
}

}  // namespace kvx::kv::tier
