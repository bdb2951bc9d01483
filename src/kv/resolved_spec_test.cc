// The spec path runs once: ResolveKVSpec builds each policy group once, and
// KVManager::Create adopts those instances instead of building them again
// (so a policy's file, heads=FILE, is read once).
#include "kv/resolved_spec.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "kv/kv_manager.h"
#include "kv/policy/counted_policy_test_util.h"
#include "kv/policy/head_typing.h"
#include "kv/policy/policy.h"

namespace kvx::kv {
namespace {

constexpr KVLayout kShape{2, 2, 16, 16};

using testing::CountedPolicy;

TEST(ResolvedKVSpecTest, EachPolicyIsBuiltOnceAndTheManagerAdoptsIt) {
  CountedPolicy::Register();
  CountedPolicy::built = 0;
  auto r = ResolveKVSpec("codec=f16;policy=test_counted;policy=test_counted", kShape, 64, 1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(CountedPolicy::built, 2);  // one per policy group
  ASSERT_EQ(r->policies.size(), 2u);
  const std::vector<const KVPolicy*> resolved = {r->policies[0].get(), r->policies[1].get()};
  auto m = KVManager::Create(std::move(*r));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(CountedPolicy::built, 2) << "KVManager::Create built the policies again";
  ASSERT_EQ((*m)->policies().size(), 2u);
  EXPECT_EQ((*m)->policies()[0].get(), resolved[0]);
  EXPECT_EQ((*m)->policies()[1].get(), resolved[1]);
  EXPECT_TRUE((*m)->spec().policies.empty());  // adopted, not copied
  EXPECT_EQ((*m)->spec().spec.policies.size(), 2u);
}

TEST(ResolvedKVSpecTest, APolicyFileIsReadOnce) {
  HeadTable t;
  t.method = "duo";
  t.n_layers = kShape.n_layers;
  t.n_kv_heads = kShape.n_kv_heads;
  t.scores = {0.1, 0.7, 0.9, 0.05};
  const std::string path = std::string(::testing::TempDir()) + "/resolved_spec_heads.json";
  ASSERT_TRUE(t.Save(path).ok());
  auto r = ResolveKVSpec("codec=f16;policy=duo,heads=" + path, kShape, 64, 1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // Gone after the resolution: a manager that read it again would fail.
  ASSERT_EQ(std::remove(path.c_str()), 0);
  auto m = KVManager::Create(std::move(*r));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ((*m)->policies().size(), 1u);
  EXPECT_EQ((*m)->policies()[0]->name(), "duo");
}

TEST(ResolvedKVSpecTest, SequencesGetTheResolvedLayers) {
  auto r = ResolveKVSpec("codec=int4,bits.1=k8v8", kShape, 64, 1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const std::vector<LayerCodec> layers = r->layers;
  ASSERT_EQ(layers.size(), 2u);
  auto m = KVManager::Create(std::move(*r));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const SeqId id = (*m)->AddSequence();
  for (int l = 0; l < kShape.n_layers; ++l) {
    EXPECT_EQ((*m)->kv(id).layer_codec(l).packed_page_bytes, layers[l].packed_page_bytes) << l;
    EXPECT_EQ((*m)->kv(id).layer_codec(l).params.k_bits, layers[l].params.k_bits) << l;
  }
}

// A sealed codec holds its newest tokens in f16 staging pages, so a short
// sequence can hold more than the full context packed: the derived budget is
// the peak over every length, and a context of two pages starts.
TEST(ResolvedKVSpecTest, TheDerivedBudgetHoldsEveryLengthUpToTheContext) {
  constexpr KVLayout kLayout{2, 2, 64, 16};
  constexpr int kCtx = 64;
  auto r = ResolveKVSpec("codec=kivi2,page=32,residual=0", kLayout, kCtx, 1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (int k = 1; k <= kCtx; ++k) {
    EXPECT_GE(r->budget_bytes, BudgetForContext(r->layout, r->layers, k)) << k << " tokens";
  }
}

}  // namespace
}  // namespace kvx::kv
