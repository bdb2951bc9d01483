// CompressedCache: the scheduler's cache of sequences a KV policy changed,
// which the radix prefix cache (kv/radix_cache.h) cannot hold: their pages
// no longer hold the token prefix their block hashes name, so they can only
// be reused whole (KVManager::ForkPrefix of the whole sequence: every page
// shared, copied on write).
//
// An entry is a manager sequence the cache owns, keyed by (tenant salt, the
// exact tokens it holds, its kind):
//   kAtMoment    compressed by a policy that compresses once
//                (KVPolicy::compresses_once) at the end of its tokens: the
//                compression moment is part of the key, so a request hits
//                only an entry compressed exactly where it would compress
//                (SCBench's "compress the shared context once, ask many");
//   kContinuous  a sequence a continuous policy (H2O, TOVA, ...) evicted
//                from while it ran: any request whose tokens extend it may
//                continue from it (there is no moment to agree on).
// The spec is the engine's: one scheduler, one spec, so entries of another
// spec cannot meet (and none goes to the KV tiers, which key blocks by
// tokens alone).
//
// Eviction: least recently used first, when more than `max_entries` are
// kept or the scheduler needs room (after the radix cache gave its pages).
//
// Thread-safety: not thread-safe; the scheduler's thread calls it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kv/kv_manager.h"
#include "util/status.h"

namespace kvx::engine {

class CompressedCache {
 public:
  enum class Kind { kAtMoment, kContinuous };

  // REQUIRES: `kv` outlives the cache; max_entries >= 1.
  CompressedCache(kv::KVManager* kv, int max_entries);
  ~CompressedCache();  // releases every entry
  CompressedCache(const CompressedCache&) = delete;
  CompressedCache& operator=(const CompressedCache&) = delete;

  struct Hit {
    kv::SeqId seq = -1;  // the entry (still the cache's: fork it)
    int tokens = 0;      // its length (0: no hit)
  };
  // kAtMoment: the entry holding exactly tokens[0, moment), compressed at
  // its end. kContinuous: the longest entry whose tokens are a prefix of
  // `tokens`. Either leaves at least one token of `tokens` to compute (the
  // request's logits come from it). Touches the hit (LRU).
  Hit Lookup(uint64_t salt, std::span<const int32_t> tokens, Kind kind, int moment = 0);

  // Keeps a copy-on-write fork of sequence `seq` (which stays the
  // caller's) unless an entry of that kind already holds its tokens. True
  // when a new entry was made; ResourceExhausted when the fork's partial
  // page does not fit (nothing kept).
  Result<bool> KeepFork(kv::SeqId seq, Kind kind);
  // Takes ownership of `seq` (a finished sequence): kept as an entry, or
  // released when an entry of that kind holds its tokens already. True
  // when kept.
  bool Adopt(kv::SeqId seq, Kind kind);

  // Releases the least recently used entry; false when there is none.
  bool EvictOne();
  // Releases every entry; how many there were.
  int Clear();
  int size() const { return static_cast<int>(entries_.size()); }

 private:
  struct Entry {
    kv::SeqId seq = -1;
    Kind kind = Kind::kAtMoment;
    uint64_t tick = 0;
  };
  bool Holds(kv::SeqId seq, Kind kind) const;
  void Add(kv::SeqId seq, Kind kind);

  kv::KVManager* kv_;
  int max_entries_;
  std::vector<Entry> entries_;
  uint64_t tick_ = 0;
};

}  // namespace kvx::engine
