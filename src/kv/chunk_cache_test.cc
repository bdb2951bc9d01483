#include "kv/chunk_cache.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvx::kv {
namespace {

// An image of `tokens` whose one table holds one page of `bytes` bytes, each `fill`.
KVManager::SequenceImage Image(const std::vector<int32_t>& tokens, size_t bytes, uint8_t fill, std::vector<uint8_t>* page) {
  page->assign(bytes, fill);
  KVManager::SequenceImage image;
  image.tokens = tokens;
  SequenceKV::TableImage table;
  table.length = static_cast<int>(tokens.size());
  table.full = {1};
  table.pages = {std::span<const uint8_t>(*page)};
  image.tables = {table};
  return image;
}

tier::BlockKey Key(uint64_t lo) { return tier::BlockKey{lo, 0}; }

TEST(ChunkCacheTest, KeepsItsOwnCopyAndComparesTokens) {
  ChunkCache cache(1000);
  std::vector<uint8_t> page;
  ASSERT_NE(cache.Insert(Key(1), Image({1, 2, 3}, 100, 7, &page)), nullptr);
  page.assign(page.size(), 0);  // the pool's page changes: the cache's copy does not
  const KVManager::SequenceImage* hit = cache.Find(Key(1), std::vector<int32_t>{1, 2, 3});
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(hit->tables[0].pages[0][0], 7);
  // Same key, other tokens (a collision): a miss.
  EXPECT_EQ(cache.Find(Key(1), std::vector<int32_t>{1, 2, 4}), nullptr);
  EXPECT_EQ(cache.Find(Key(2), std::vector<int32_t>{1, 2, 3}), nullptr);
  EXPECT_EQ(cache.stats().hits, 1);
  EXPECT_EQ(cache.stats().misses, 2);
  EXPECT_EQ(cache.stats().bytes, 100u);
}

TEST(ChunkCacheTest, EvictsTheLeastRecentlyUsedWithinItsBytes) {
  ChunkCache cache(300);
  std::vector<uint8_t> page;
  cache.Insert(Key(1), Image({1}, 100, 1, &page));
  cache.Insert(Key(2), Image({2}, 100, 2, &page));
  cache.Insert(Key(3), Image({3}, 100, 3, &page));
  ASSERT_NE(cache.Find(Key(1), std::vector<int32_t>{1}), nullptr);  // 2 is now the oldest
  cache.Insert(Key(4), Image({4}, 150, 4, &page));
  EXPECT_EQ(cache.Find(Key(2), std::vector<int32_t>{2}), nullptr);
  EXPECT_EQ(cache.Find(Key(3), std::vector<int32_t>{3}), nullptr);
  EXPECT_NE(cache.Find(Key(1), std::vector<int32_t>{1}), nullptr);
  EXPECT_NE(cache.Find(Key(4), std::vector<int32_t>{4}), nullptr);
  EXPECT_EQ(cache.stats().bytes, 250u);
  EXPECT_EQ(cache.stats().evictions, 2);
  // Larger than the whole cache: not kept, nothing evicted.
  EXPECT_EQ(cache.Insert(Key(5), Image({5}, 301, 5, &page)), nullptr);
  EXPECT_EQ(cache.stats().entries, 2);
  // Replacing a key frees its old bytes first.
  cache.Insert(Key(4), Image({4}, 50, 6, &page));
  EXPECT_EQ(cache.stats().bytes, 150u);
  EXPECT_EQ(cache.Find(Key(4), std::vector<int32_t>{4})->tables[0].pages[0][0], 6);
}

}  // namespace
}  // namespace kvx::kv
