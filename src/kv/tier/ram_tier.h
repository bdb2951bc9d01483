// RamTier: the host-RAM tier (`--cache-ram-bytes`): tier blocks in the
// storage format (block_format.h) in a map in this process's memory, above
// the disk and Redis tiers. Cheaper than the pool (no page slack, one
// allocation per block) and faster than disk; gone with the process.
//
// Budget: at most `max_bytes` of values, least recently used evicted first
// (LruIndex, the disk tier's logic). A value larger than the budget is
// refused and counted.
//
// Pins ("cache": "pin", through TierStore::Pin): a pinned block is evicted
// only when the budget holds nothing unpinned to evict for a Put; then its
// pin is given back (counted in pins_broken, one logged line per Put that
// broke pins) — the budget always wins, and a pin never fails a write.
//
// Thread-safety: thread-safe (one mutex over the index and the map; values
// are copied in and out with it released).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "kv/tier/lru_index.h"
#include "kv/tier/tier.h"

namespace kvx::kv::tier {

class RamTier final : public Tier {
 public:
  // InvalidArgument for a zero budget.
  static Result<std::unique_ptr<RamTier>> Open(uint64_t max_bytes, TierLog log = StderrTierLog());

  std::string name() const override { return "ram"; }
  Status Put(const BlockKey& key, std::string_view bytes) override;
  std::optional<std::string> Get(const BlockKey& key) override;
  void Erase(const BlockKey& key) override;
  // Pins or unpins `key` (held now or to come).
  void Pin(const BlockKey& key, bool on);
  bool Has(const BlockKey& key);
  uint64_t max_bytes() const { return index_.max_bytes(); }

 private:
  RamTier(uint64_t max_bytes, TierLog log) : index_(max_bytes), log_(std::move(log)) {}
  // REQUIRES: mu_ held.
  void CountSize();

  std::mutex mu_;
  LruIndex index_;
  // Shared so that a Get copies a value out with the lock released.
  std::unordered_map<BlockKey, std::shared_ptr<const std::string>, BlockKeyHash> values_;
  TierLog log_;
};

}  // namespace kvx::kv::tier
