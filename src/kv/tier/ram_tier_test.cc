// The host-RAM tier: values back byte for byte, the budget kept by evicting
// the least recently used (the LruIndex the disk tier shares), a value
// larger than the budget refused and counted.
#include "kv/tier/ram_tier.h"

#include <gtest/gtest.h>

namespace kvx::kv::tier {
namespace {

BlockKey Key(uint64_t i) { return BlockKey{i, ~i}; }

TEST(RamTierTest, KeepsTheBudgetByEvictingTheLeastRecentlyUsed) {
  auto tier = RamTier::Open(300).value();
  ASSERT_TRUE(tier->Put(Key(1), std::string(100, 'a')).ok());
  ASSERT_TRUE(tier->Put(Key(2), std::string(100, 'b')).ok());
  ASSERT_TRUE(tier->Put(Key(3), std::string(100, 'c')).ok());
  EXPECT_EQ(tier->Get(Key(1)), std::string(100, 'a'));  // 1 is now the most recent
  ASSERT_TRUE(tier->Put(Key(4), std::string(100, 'd')).ok());  // evicts 2
  EXPECT_FALSE(tier->Get(Key(2)).has_value());
  EXPECT_TRUE(tier->Get(Key(1)).has_value());
  EXPECT_TRUE(tier->Get(Key(3)).has_value());
  const TierStats s = tier->stats();
  EXPECT_EQ(s.bytes, 300u);
  EXPECT_EQ(s.blocks, 3u);
  EXPECT_EQ(s.evictions, 1u);
  EXPECT_EQ(s.misses, 1u);
  ASSERT_TRUE(tier->Put(Key(3), std::string(50, 'e')).ok());  // a replaced value is not an eviction
  EXPECT_EQ(tier->Get(Key(3)), std::string(50, 'e'));
  EXPECT_EQ(tier->stats().bytes, 250u);
  EXPECT_FALSE(tier->Put(Key(5), std::string(301, 'f')).ok());
  EXPECT_EQ(tier->stats().errors, 1u);
  tier->DropCorrupt(Key(1));
  EXPECT_FALSE(tier->Get(Key(1)).has_value());
  EXPECT_EQ(tier->stats().errors, 2u);
  EXPECT_FALSE(RamTier::Open(0).ok());
}

}  // namespace
}  // namespace kvx::kv::tier
