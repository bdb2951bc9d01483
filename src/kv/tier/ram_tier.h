// RamTier: the host-RAM tier (`--cache-ram-bytes`): tier blocks in the
// storage format (block_format.h) in a map in this process's memory, above
// the disk and Redis tiers. Cheaper than the pool (no page slack, one
// allocation per block) and faster than disk; gone with the process.
//
// Budget: at most `max_bytes` of values, least recently used evicted first
// (LruIndex, the disk tier's logic). A value larger than the budget is
// refused and counted.
//
// Thread-safety: thread-safe (one mutex).
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
  static Result<std::unique_ptr<RamTier>> Open(uint64_t max_bytes);

  std::string name() const override { return "ram"; }
  Status Put(const BlockKey& key, std::string_view bytes) override;
  std::optional<std::string> Get(const BlockKey& key) override;
  void Erase(const BlockKey& key) override;

 private:
  explicit RamTier(uint64_t max_bytes) : index_(max_bytes) {}
  // REQUIRES: mu_ held.
  void CountSize();

  std::mutex mu_;
  LruIndex index_;
  std::unordered_map<BlockKey, std::string, BlockKeyHash> values_;
};

}  // namespace kvx::kv::tier
