// Tier: a store of tier blocks (block_format.h) by key, below the KV pool —
// a local disk directory (disk_tier.h), a shared Redis (redis_tier.h). A
// tier stores opaque bytes; whoever reads a block decodes and checks it
// (DecodeBlock) and reports a damaged one (DropCorrupt), so a corrupted
// value is dropped and counted, never served.
//
// Faults never reach the caller as failures: a tier that cannot write (disk
// full, Redis down or out of memory) refuses the Put, counts an error and
// logs one line when its state changes; a Get that cannot read is a miss.
// Put's Status is information (tests, metrics), never a reason to fail a
// request.
//
// Thread-safety: implementations are thread-safe (an I/O thread and the
// scheduler may call them concurrently); stats() is a consistent snapshot.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "kv/tier/block_key.h"
#include "util/status.h"

namespace kvx::kv::tier {

struct TierStats {
  uint64_t hits = 0;       // Gets that found a value
  uint64_t misses = 0;     // Gets that found none (or could not read)
  uint64_t puts = 0;       // values stored
  uint64_t bytes = 0;      // bytes the tier holds (as far as it knows: Redis counts what this process wrote)
  uint64_t blocks = 0;     // values the tier holds (same caveat)
  uint64_t evictions = 0;  // values removed to stay within the byte budget
  uint64_t errors = 0;     // failed reads/writes, refused writes, corrupted values dropped
  uint64_t pinned = 0;       // values pinned now (the host-RAM tier: "cache": "pin")
  uint64_t pins_broken = 0;  // pinned values evicted because nothing unpinned was left to make room
};

// Where a tier's state-change lines go ("kvx: disk tier ...: stopped writing:
// ..."); the default writes them to stderr.
using TierLog = std::function<void(const std::string& line)>;
TierLog StderrTierLog();

class Tier {
 public:
  virtual ~Tier() = default;
  // "disk /var/cache/kvx", "redis redis://127.0.0.1:6379/0".
  virtual std::string name() const = 0;
  // Stores `bytes` under `key` (replacing a value already there). Ok when
  // stored; otherwise the reason (the tier counted it and logged a state
  // change); callers go on either way.
  virtual Status Put(const BlockKey& key, std::string_view bytes) = 0;
  // The value under `key`, or nullopt (a miss: absent, or the tier cannot
  // read now).
  virtual std::optional<std::string> Get(const BlockKey& key) = 0;
  // Removes the value under `key` if there is one.
  virtual void Erase(const BlockKey& key) = 0;
  // A value Get returned failed its checks (DecodeBlock: DataLoss): erased
  // and counted as an error, so it is never read again.
  void DropCorrupt(const BlockKey& key);
  TierStats stats() const;
  // Called with every key the tier gives up on its own — evicted for its
  // budget, dropped as corrupt — so that a record of what it holds
  // (TierStore's known keys) follows it. Set before the tier is used; called
  // under the tier's lock (must not call the tier). Redis evicts without
  // telling: its keys are never reported.
  void SetOnDrop(std::function<void(const BlockKey&)> on_drop) { on_drop_ = std::move(on_drop); }

 protected:
  void Dropped(const BlockKey& key) {
    if (on_drop_) on_drop_(key);
  }
  std::function<void(const BlockKey&)> on_drop_;
  mutable std::mutex stats_mu_;
  TierStats stats_;  // guarded by stats_mu_; implementations update it through Count
  template <class F>
  void Count(F&& f) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    f(stats_);
  }
  // The tier's size as stats() reports it.
  void SetSize(uint64_t bytes, uint64_t blocks) {
    Count([&](TierStats& s) {
      s.bytes = bytes;
      s.blocks = blocks;
    });
  }
};

}  // namespace kvx::kv::tier
