#include "kv/chunk_cache.h"

#include <algorithm>

namespace kvx::kv {

OwnedSequenceImage CopySequenceImage(const KVManager::SequenceImage& image) {
  OwnedSequenceImage owned;
  owned.image = image;
  owned.bytes.resize(image.tables.size());
  for (size_t t = 0; t < image.tables.size(); ++t) {
    SequenceKV::TableImage& table = owned.image.tables[t];
    size_t total = 0;
    for (const auto& page : table.pages) total += page.size();
    std::vector<uint8_t>& buffer = owned.bytes[t];
    buffer.resize(total);
    size_t at = 0;
    for (auto& page : table.pages) {
      std::copy(page.begin(), page.end(), buffer.begin() + static_cast<std::ptrdiff_t>(at));
      page = std::span<const uint8_t>(buffer.data() + at, page.size());
      at += page.size();
    }
    owned.page_bytes += total;
  }
  return owned;
}

const KVManager::SequenceImage* ChunkCache::Find(const tier::BlockKey& key, std::span<const int32_t> tokens) {
  const auto found = index_.find(key);
  if (found == index_.end() || !std::ranges::equal(found->second->owned.image.tokens, tokens)) {
    ++stats_.misses;
    return nullptr;
  }
  ++stats_.hits;
  lru_.splice(lru_.begin(), lru_, found->second);
  return &found->second->owned.image;
}

bool ChunkCache::Holds(const tier::BlockKey& key, std::span<const int32_t> tokens) const {
  const auto found = index_.find(key);
  return found != index_.end() && std::ranges::equal(found->second->owned.image.tokens, tokens);
}

const KVManager::SequenceImage* ChunkCache::Insert(const tier::BlockKey& key, const KVManager::SequenceImage& image) {
  if (const auto old = index_.find(key); old != index_.end()) Erase(old->second);
  OwnedSequenceImage owned = CopySequenceImage(image);
  if (owned.page_bytes > max_bytes_) return nullptr;
  while (stats_.bytes + owned.page_bytes > max_bytes_) {
    Erase(std::prev(lru_.end()));
    ++stats_.evictions;
  }
  stats_.bytes += owned.page_bytes;
  lru_.push_front(Entry{key, std::move(owned)});
  index_[key] = lru_.begin();
  ++stats_.insertions;
  stats_.entries = static_cast<int64_t>(lru_.size());
  return &lru_.front().owned.image;
}

void ChunkCache::Erase(std::list<Entry>::iterator it) {
  stats_.bytes -= it->owned.page_bytes;
  index_.erase(it->key);
  lru_.erase(it);
  stats_.entries = static_cast<int64_t>(lru_.size());
}

}  // namespace kvx::kv
