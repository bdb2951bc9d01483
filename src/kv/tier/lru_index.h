// LruIndex: the byte budget and least-recently-used order of a tier's blocks
// (key -> size), shared by the tiers that keep their own budget: the disk
// tier (files) and the host-RAM tier (a map). It decides what to evict; the
// tier removes the values.
//
// Thread-safety: none; the owning tier calls it under its mutex.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kv/tier/block_key.h"

namespace kvx::kv::tier {

class LruIndex {
 public:
  explicit LruIndex(uint64_t max_bytes) : max_bytes_(max_bytes) {}

  // The size of `key`'s value, or nullopt when the index lacks it.
  std::optional<uint64_t> Bytes(const BlockKey& key) const;
  // Marks `key` most recently used (no-op when absent).
  void Touch(const BlockKey& key);
  // Adds `key` as the most recently used, replacing an entry of that key.
  void Add(const BlockKey& key, uint64_t bytes);
  // Forgets `key`; false when absent.
  bool Remove(const BlockKey& key);
  // The least recently used keys to remove so that `incoming` more bytes fit
  // the budget, removed from the index (the caller drops their values).
  // Pinned keys go only when no unpinned key is left to evict (least
  // recently used first); their pins go with them (counted in *pins_broken).
  std::vector<BlockKey> EvictFor(uint64_t incoming, uint64_t* pins_broken = nullptr);
  // Pins (or unpins) `key`, held now or to come: see EvictFor.
  void Pin(const BlockKey& key, bool on);
  // Pinned keys the index holds.
  size_t pinned() const;

  uint64_t used_bytes() const { return used_; }
  uint64_t max_bytes() const { return max_bytes_; }
  size_t size() const { return index_.size(); }

 private:
  struct Entry {
    uint64_t bytes = 0;
    std::list<BlockKey>::iterator lru;  // into lru_ (front = most recent)
  };
  const uint64_t max_bytes_;
  std::unordered_map<BlockKey, Entry, BlockKeyHash> index_;
  std::list<BlockKey> lru_;
  std::unordered_set<BlockKey, BlockKeyHash> pinned_;
  uint64_t used_ = 0;
};

}  // namespace kvx::kv::tier
