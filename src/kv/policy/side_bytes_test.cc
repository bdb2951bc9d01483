// Every byte a method keeps outside the pool is part of what a sequence
// keeps (KVManager::SideBytes, which kvx eval adds to the pool's bytes): the
// expected sizes are computed here from what each method stores, not from
// the accessors that report them.
#include <gtest/gtest.h>

#include "kv/policy/eviction_test_util.h"

namespace kvx::kv {
namespace {

using testing::EvictionRig;

const KVLayout kLayout{2, 2, 16, 8};  // 2 layers, 2 kv heads, dim 16, page 8; 4 query heads

uint64_t Pages(const SequenceKV& kv) {
  uint64_t pages = 0;
  for (int l = 0; l < kv.layout().n_layers; ++l) {
    for (int h = 0; h < kv.layout().n_kv_heads; ++h) pages += kv.table(l, h).num_pages();
  }
  return pages;
}

TEST(SideBytesTest, QuestsPageBoundsAreCounted) {
  EvictionRig rig("codec=f16,page=8;policy=quest,budget=16,dense_layers=0", kLayout, 4);
  ASSERT_TRUE(rig.Step(64, nullptr, 0).ok());  // the bounds are turned on after the first step
  ASSERT_TRUE(rig.Step(1, nullptr, 0).ok());
  // A min and a max key (f32) per page of every (layer, kv head).
  const uint64_t bounds = Pages(rig.manager().kv(rig.seq())) * 2 * kLayout.head_dim * sizeof(float);
  EXPECT_GT(bounds, 0u);
  EXPECT_GE(rig.manager().SideBytes(rig.seq()), bounds);
}

TEST(SideBytesTest, AScorersAttentionStatisticsAreCounted) {
  auto pattern = [](int, int, int32_t, int32_t p) { return 1.0 + p % 3; };
  for (const std::string policy : {"policy=h2o,budget=40,mode=once", "policy=snapkv,budget=40", "policy=cake,budget=40"}) {
    SCOPED_TRACE(policy);
    EvictionRig rig("codec=f16,page=8;" + policy, kLayout, 4);
    ASSERT_TRUE(rig.Step(64, pattern, 64).ok());
    // At least the attention sum of every position, per layer and query head.
    EXPECT_GE(rig.manager().SideBytes(rig.seq()), 64u * sizeof(float) * kLayout.n_layers * 4);
    ASSERT_TRUE(rig.manager().Compress(rig.seq()).ok());
    EXPECT_GE(rig.manager().SideBytes(rig.seq()), 64u * sizeof(float) * kLayout.n_layers * 4);
  }
}

// Scissorhands' exact history window (ring=1) keeps a row per recent step
// beside the summed statistics: after decode steps it holds more than the
// blend, at least the ring's rows.
TEST(SideBytesTest, TheHistoryRingIsCounted) {
  auto pattern = [](int, int, int32_t, int32_t p) { return 1.0 + p % 3; };
  uint64_t bytes[2];
  for (int ring = 0; ring < 2; ++ring) {
    EvictionRig rig("codec=f16,page=8;policy=scissorhands,budget=48,history=8,ring=" + std::to_string(ring), kLayout, 4);
    ASSERT_TRUE(rig.Step(40, pattern, 40).ok());
    for (int i = 0; i < 6; ++i) ASSERT_TRUE(rig.Step(1, pattern, 1).ok());
    bytes[ring] = rig.manager().SideBytes(rig.seq());
  }
  // Six one-query steps in the ring, each a sum and a low-hit row of ~46 positions per layer and query head.
  EXPECT_GE(bytes[1], bytes[0] + 6u * 2 * 40 * sizeof(float) * kLayout.n_layers * 4);
}

TEST(SideBytesTest, KeyNormKeepsNothingBesideThePool) {
  EvictionRig rig("codec=f16,page=8;policy=knorm,budget=16", kLayout, 4);
  ASSERT_TRUE(rig.Step(64, nullptr, 0).ok());
  ASSERT_TRUE(rig.manager().Compress(rig.seq()).ok());
  EXPECT_EQ(rig.manager().SideBytes(rig.seq()), 0u);
}

// kvx plan's bytes per token: what a sequence holds once its policies act.
TEST(SideBytesTest, SteadyStateBytesPerTokenFollowThePolicies) {
  auto bytes = [](const std::string& spec, int tokens) {
    auto r = ResolveKVSpec(spec, kLayout, 8192, 1);  // the specs' pages: 8 tokens
    EXPECT_TRUE(r.ok()) << spec << ": " << r.status().ToString();
    return r.ok() ? SteadyStateBytesPerToken(*r, r->policies, tokens) : 0.0;
  };
  const double f16 = bytes("codec=f16,page=8", 4096);
  EXPECT_GT(f16, 0);
  EXPECT_NEAR(bytes("codec=f16,page=8;policy=snapkv,ratio=0.5", 4096), 0.5 * f16, 1e-9 * f16);
  EXPECT_NEAR(bytes("codec=f16,page=8;policy=h2o,ratio=0.75", 4096), 0.25 * f16, 1e-9 * f16);
  EXPECT_NEAR(bytes("codec=f16,page=8;policy=streamingllm,sinks=4,window=1020", 4096), 0.25 * f16, 1e-9 * f16);
  EXPECT_NEAR(bytes("codec=f16,page=8;policy=streamingllm,sinks=4,window=1020", 512), f16, 1e-9 * f16);  // under the window
  // Quest evicts nothing and adds its bounds: 2 keys * 16 ch * 4 bytes per page of 8 tokens, 4 tables.
  EXPECT_NEAR(bytes("codec=f16,page=8;policy=quest,budget=16", 4096), f16 + 2 * 16 * 4 * 4 / 8.0, 1e-9 * f16);
  // MiKV keeps the evicted at int2: more than dropping them, less than keeping them at int4.
  const double int4 = bytes("codec=int4,page=8", 4096), h2o = bytes("codec=int4,page=8;policy=h2o,ratio=0.5,mode=once", 4096);
  const double mikv = bytes("codec=int4,page=8;policy=mikv,ratio=0.5", 4096);
  EXPECT_GT(mikv, h2o);
  EXPECT_LT(mikv, int4);
}

}  // namespace
}  // namespace kvx::kv
