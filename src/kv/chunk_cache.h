// ChunkCache: the KV of text chunks computed on their own (positions
// 0..n-1, no BOS), kept in RAM for chunk reuse (engine/chunk_assembly.h,
// docs/kv-reuse.md): a RAG prompt that puts the same documents in another
// order, after other instructions, takes each document's KV from here and
// repairs the cross-chunk attention instead of recomputing it.
//
// An entry is the chunk's sequence as KVManager::ExportSequence gives it
// (every page's bytes in the spec's codec, the tokens and positions): the
// form KVManager::ImportSequence takes back and the tiers' block format
// stores (kv/tier/block_format.h), held in buffers of its own. Entries are
// named by tier::ChunkKey (the tokens, model and spec fingerprints, tenant
// salt); a lookup also compares the tokens, so a key collision can never
// serve another chunk's KV.
//
// Bounded: the entries' page bytes stay within `max_bytes`; inserting past it
// evicts the least recently used entries first; an entry larger than the
// whole budget is not kept.
//
// Thread-safety: not thread-safe (one engine's thread uses it).
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/kv_manager.h"
#include "kv/tier/block_key.h"

namespace kvx::kv {

// A sequence image that owns its page bytes.
struct OwnedSequenceImage {
  KVManager::SequenceImage image;  // its page spans point into `bytes`
  std::vector<std::vector<uint8_t>> bytes;  // one buffer per table
  uint64_t page_bytes = 0;
};
// Copies the pages `image` points to (into the pool) into buffers of its own.
OwnedSequenceImage CopySequenceImage(const KVManager::SequenceImage& image);

struct ChunkCacheStats {
  int64_t hits = 0, misses = 0, insertions = 0, evictions = 0;
  uint64_t bytes = 0;  // page bytes held now
  int64_t entries = 0;
};

class ChunkCache {
 public:
  explicit ChunkCache(uint64_t max_bytes) : max_bytes_(max_bytes) {}
  ChunkCache(const ChunkCache&) = delete;
  ChunkCache& operator=(const ChunkCache&) = delete;

  // The entry of `key` if it holds exactly `tokens` (then it becomes the
  // most recently used), else nullptr. Valid until the next Insert.
  const KVManager::SequenceImage* Find(const tier::BlockKey& key, std::span<const int32_t> tokens);
  // Whether Find would hit, without counting or touching the order.
  bool Holds(const tier::BlockKey& key, std::span<const int32_t> tokens) const;
  // Keeps `image` (its tokens are the chunk) under `key`, replacing an entry
  // of that key; evicts the least recently used entries until the bytes
  // fit. Returns the kept entry (valid until the next Insert), nullptr when
  // it is larger than the whole cache (then nothing was evicted).
  const KVManager::SequenceImage* Insert(const tier::BlockKey& key, const KVManager::SequenceImage& image);

  const ChunkCacheStats& stats() const { return stats_; }
  uint64_t max_bytes() const { return max_bytes_; }

 private:
  struct Entry {
    tier::BlockKey key;
    OwnedSequenceImage owned;
  };
  void Erase(std::list<Entry>::iterator it);

  uint64_t max_bytes_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<tier::BlockKey, std::list<Entry>::iterator, tier::BlockKeyHash> index_;
  ChunkCacheStats stats_;
};

}  // namespace kvx::kv
