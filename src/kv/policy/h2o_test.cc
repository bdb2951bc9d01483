#include <gtest/gtest.h>

#include "kv/policy/eviction_test_util.h"

namespace kvx::kv {
namespace {

using testing::EvictionRig;

// Planted heavy hitters: every query gives positions 10, 20 and 30 twenty
// times the weight of any other entry.
double Heavy(int, int, int32_t, int32_t pos) { return pos == 10 || pos == 20 || pos == 30 ? 20.0 : 1.0; }

TEST(H2OTest, PlantedHeavyHittersSurviveAPromptCompression) {
  // budget 16 per head: 4 recent + 12 heavy; no sinks so only the scores decide.
  EvictionRig rig("codec=f16,page=8;policy=h2o,budget=16,window=4,sinks=0,mode=once", KVLayout{2, 2, 16, 8}, 4);
  ASSERT_TRUE(rig.Step(64, Heavy, 64).ok());
  ASSERT_TRUE(rig.manager().Compress(rig.seq()).ok());
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 2; ++h) {
      const auto live = rig.LiveSet(l, h);
      EXPECT_EQ(live.size(), 16u);
      for (int32_t p : {10, 20, 30, 60, 61, 62, 63}) EXPECT_TRUE(live.count(p)) << "position " << p << " evicted";
    }
  }
  ASSERT_TRUE(rig.manager().CheckInvariants().ok()) << rig.manager().CheckInvariants().ToString();
  EXPECT_TRUE(rig.manager().entries_removed(rig.seq()));
}

TEST(H2OTest, ContinuousDecodeKeepsTheBudgetAndTheHeavyHitter) {
  EvictionRig rig("codec=f16,page=8;policy=h2o,budget=24,sinks=4", KVLayout{1, 2, 16, 8}, 2);
  // The default window is half the budget (the paper's heavy/recent split).
  ASSERT_TRUE(rig.Step(40, Heavy, 40).ok());
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(rig.Step(1, Heavy, 1).ok());
    for (int h = 0; h < 2; ++h) ASSERT_LE(rig.manager().kv(rig.seq()).LiveEntries(0, h), 24);
  }
  for (int h = 0; h < 2; ++h) {
    const auto live = rig.LiveSet(0, h);
    for (int32_t p : {0, 1, 2, 3, 10, 20, 30, 139}) EXPECT_TRUE(live.count(p)) << "position " << p << " evicted";
  }
  // Compaction keeps the pages at least half full.
  EXPECT_GE(LiveEntryFraction(rig.manager().kv(rig.seq())), 0.5);
  ASSERT_TRUE(rig.manager().CheckInvariants().ok()) << rig.manager().CheckInvariants().ToString();
}

}  // namespace
}  // namespace kvx::kv
