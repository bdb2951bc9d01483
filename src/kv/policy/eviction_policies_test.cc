// Each policy's choice on a constructed case whose right answer is known.
#include <gtest/gtest.h>

#include <numeric>

#include "kv/policy/budget.h"
#include "kv/policy/eviction_test_util.h"

namespace kvx::kv {
namespace {

using testing::EvictionRig;

const KVLayout kLayout{2, 2, 16, 8};  // 2 layers, 2 kv heads, dim 16, page 8; 4 query heads

TEST(TovaTest, KeepsWhatTheLastQueryAttendsTo) {
  // Every query but the last favours positions 5..9; the last favours 40..44.
  // TOVA listens to the last query only (H2O would keep 5..9).
  EvictionRig rig("codec=f16,page=8;policy=tova,budget=6,mode=once", kLayout, 4);
  auto pattern = [](int, int, int32_t q, int32_t p) {
    if (q == 63) return p >= 40 && p < 45 ? 50.0 : 1.0;
    return p >= 5 && p < 10 ? 50.0 : 1.0;
  };
  ASSERT_TRUE(rig.Step(63, pattern, 63).ok());
  ASSERT_TRUE(rig.Step(1, pattern, 1).ok());
  ASSERT_TRUE(rig.manager().Compress(rig.seq()).ok());
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 2; ++h) EXPECT_EQ(rig.LiveSet(l, h), (std::set<int32_t>{40, 41, 42, 43, 44, 63}));
  }
}

TEST(TovaTest, AllHeadsOfALayerKeepTheSameTokens) {
  // Query heads 0-1 (kv head 0) like 10..14, heads 2-3 (kv head 1) like 30..34:
  // TOVA averages over the layer, so both kv heads keep the same set.
  EvictionRig rig("codec=f16,page=8;policy=tova,budget=11,mode=once", kLayout, 4);
  auto pattern = [](int, int h, int32_t, int32_t p) {
    if (h < 2) return p >= 10 && p < 15 ? 50.0 : 1.0;
    return p >= 30 && p < 35 ? 50.0 : 1.0;
  };
  ASSERT_TRUE(rig.Step(64, pattern, 1).ok());
  ASSERT_TRUE(rig.manager().Compress(rig.seq()).ok());
  EXPECT_EQ(rig.LiveSet(0, 0), rig.LiveSet(0, 1));
  EXPECT_TRUE(rig.LiveSet(0, 0).count(12) && rig.LiveSet(0, 0).count(32));
}

// The observation window (last 8 queries) attends to position 20 only.
double Window20(int, int, int32_t, int32_t p) { return p == 20 ? 100.0 : 0.01; }

TEST(SnapKVTest, KeepsWhatTheWindowAttendsToAndPoolingKeepsNeighbours) {
  {
    EvictionRig rig("codec=f16,page=8;policy=snapkv,budget=13,window=8,sinks=0,kernel=5", kLayout, 4);
    ASSERT_TRUE(rig.Step(64, Window20, 64).ok());
    EXPECT_EQ(rig.manager().kv(rig.seq()).LiveEntries(0, 0), 64);  // mode=once: nothing until asked
    ASSERT_TRUE(rig.manager().Compress(rig.seq()).ok());
    std::set<int32_t> want = {18, 19, 20, 21, 22};
    for (int p = 56; p < 64; ++p) want.insert(p);
    for (int l = 0; l < 2; ++l) {
      for (int h = 0; h < 2; ++h) EXPECT_EQ(rig.LiveSet(l, h), want);
    }
  }
  {  // kernel 1 (no pooling): the needle alone, the rest of the budget by ties (latest first)
    EvictionRig rig("codec=f16,page=8;policy=snapkv,budget=9,window=8,sinks=0,kernel=1", kLayout, 4);
    ASSERT_TRUE(rig.Step(64, Window20, 64).ok());
    ASSERT_TRUE(rig.manager().Compress(rig.seq()).ok());
    EXPECT_TRUE(rig.LiveSet(0, 0).count(20));
    EXPECT_FALSE(rig.LiveSet(0, 0).count(19));
  }
}

TEST(SnapKVTest, OnlyTheWindowVotes) {
  // Queries before the window favour 30; the window (last 8) favours 20.
  EvictionRig rig("codec=f16,page=8;policy=snapkv,budget=9,window=8,sinks=0,kernel=1", kLayout, 4);
  auto pattern = [](int, int, int32_t q, int32_t p) { return q >= 56 ? (p == 20 ? 100.0 : 0.01) : (p == 30 ? 100.0 : 0.01); };
  ASSERT_TRUE(rig.Step(64, pattern, 64).ok());
  ASSERT_TRUE(rig.manager().Compress(rig.seq()).ok());
  EXPECT_TRUE(rig.LiveSet(0, 0).count(20));
  EXPECT_FALSE(rig.LiveSet(0, 0).count(30));
}

TEST(BudgetTest, PyramidSumsToTheTotalAndDecreasesWithDepth) {
  const std::vector<int> b = PyramidBudgets(8, 256, 2048, 32, 20.0);
  EXPECT_EQ(std::accumulate(b.begin(), b.end(), 0), 8 * 256);
  for (size_t l = 1; l < b.size(); ++l) EXPECT_LE(b[l], b[l - 1]);
  EXPECT_GT(b.front(), 2 * b.back());
  // The reference's bounds: min = (C-w)/beta, max = 2(C-w) - min, plus w.
  EXPECT_NEAR(b.front(), 32 + 2 * 224 - 224 / 20.0, 1.5);
  EXPECT_NEAR(b.back(), 32 + 224 / 20.0, 1.5);
  // A short prompt (n < 2(C-w)) falls back to uniform, n <= C keeps all.
  EXPECT_EQ(PyramidBudgets(4, 256, 300, 32, 20.0), std::vector<int>(4, 256));
  EXPECT_EQ(PyramidBudgets(4, 256, 100, 32, 20.0), std::vector<int>(4, 100));
}

TEST(BudgetTest, CakeFollowsThePreferencesWithinCaps) {
  const std::vector<int> b = PreferenceBudgets({1.0, 3.0, 0.0, 4.0}, 100, 1000, 10);
  EXPECT_EQ(std::accumulate(b.begin(), b.end(), 0), 400);
  EXPECT_EQ(b[2], 10);  // no preference: the window only
  EXPECT_LT(b[0], b[1]);
  EXPECT_LT(b[1], b[3]);
  // Caps at n - w redistribute the excess.
  const std::vector<int> c = PreferenceBudgets({100.0, 1.0, 1.0}, 100, 150, 10);
  EXPECT_EQ(c[0], 150);
  EXPECT_EQ(std::accumulate(c.begin(), c.end(), 0), 300);
}

// layers=cake acts with any scorer that observes attention (SnapKV's and
// H2O's included: the recorder then keeps entropy and variance too), not
// only with CAKE's own.
TEST(BudgetTest, CakeLayersGiveTheDispersedLayerMoreWithAnyObservingScorer) {
  // Layer 0's window attention is flat (high entropy), layer 1's is peaked.
  for (const std::string policy : {"policy=cake", "policy=snapkv,layers=cake", "policy=h2o,mode=once,layers=cake"}) {
    SCOPED_TRACE(policy);
    EvictionRig rig("codec=f16,page=8;" + policy + ",budget=24,window=8,sinks=0", kLayout, 4);
    auto pattern = [](int l, int, int32_t q, int32_t p) { return l == 0 ? 1.0 + (p * 7 + q) % 5 : (p == 3 ? 1000.0 : 0.001); };
    ASSERT_TRUE(rig.Step(128, pattern, 128).ok());
    ASSERT_TRUE(rig.manager().Compress(rig.seq()).ok());
    const auto& b = rig.scored().last_stats().layer_budget;
    ASSERT_EQ(b.size(), 2u);
    EXPECT_EQ(b[0] + b[1], 48);
    EXPECT_GT(b[0], b[1]) << b[0] << " " << b[1];
    EXPECT_EQ(rig.manager().kv(rig.seq()).LiveEntries(0, 0), b[0]);
  }
}

TEST(AdaKVTest, APeakedHeadGivesEntriesToAFlatOne) {
  // kv head 0's queries (heads 0, 1) put everything on position 7; kv head 1's are flat.
  EvictionRig rig("codec=f16,page=8;policy=adakv,base=snapkv,budget=24,window=4,sinks=0,kernel=1", kLayout, 4);
  auto pattern = [](int, int h, int32_t, int32_t p) { return h < 2 ? (p == 7 ? 1e6 : 1e-3) : 1.0 + (p % 3); };
  ASSERT_TRUE(rig.Step(96, pattern, 96).ok());
  ASSERT_TRUE(rig.manager().Compress(rig.seq()).ok());
  for (int l = 0; l < 2; ++l) {
    const int peaked = rig.manager().kv(rig.seq()).LiveEntries(l, 0), flat = rig.manager().kv(rig.seq()).LiveEntries(l, 1);
    EXPECT_EQ(peaked + flat, 48);
    EXPECT_LT(peaked, flat);
    EXPECT_GE(peaked, 4 + static_cast<int>(0.2 * 20));  // window + the alpha safeguard
    EXPECT_TRUE(rig.LiveSet(l, 0).count(7));
  }
  // The same case without Ada-KV: equal budgets.
  EvictionRig uni("codec=f16,page=8;policy=snapkv,budget=24,window=4,sinks=0,kernel=1", kLayout, 4);
  ASSERT_TRUE(uni.Step(96, pattern, 96).ok());
  ASSERT_TRUE(uni.manager().Compress(uni.seq()).ok());
  EXPECT_EQ(uni.manager().kv(uni.seq()).LiveEntries(0, 0), 24);
}

TEST(KeyNormTest, KeepsTheLowNormKeys) {
  // Keys at positions divisible by 5 have norm 0.4, others 4.
  EvictionRig rig("codec=f16,page=8;policy=knorm,ratio=0.75", kLayout, 4);
  auto key = [](int, int, int32_t p, int) { return p % 5 == 0 ? 0.1f : 1.0f; };
  ASSERT_TRUE(rig.Step(80, nullptr, 0, key).ok());
  ASSERT_TRUE(rig.manager().Compress(rig.seq()).ok());
  std::set<int32_t> want;
  for (int p = 0; p < 80; p += 5) want.insert(p);
  for (int h = 0; h < 2; ++h) {
    const auto live = rig.LiveSet(1, h);
    EXPECT_EQ(live.size(), 20u);
    for (int32_t p : want) EXPECT_TRUE(live.count(p)) << p;
  }
  EXPECT_EQ(rig.policy().observer(), nullptr);  // no probabilities needed: fast kernels stay
}

TEST(RandomTest, IsSeededAndHeadsDiffer) {
  auto run = [](int seed) {
    EvictionRig rig("codec=f16,page=8;policy=random,ratio=0.5,seed=" + std::to_string(seed), kLayout, 4);
    EXPECT_TRUE(rig.Step(64, nullptr, 0).ok());
    EXPECT_TRUE(rig.manager().Compress(rig.seq()).ok());
    return std::vector<std::vector<int32_t>>{rig.Live(0, 0), rig.Live(0, 1), rig.Live(1, 0)};
  };
  const auto a = run(1), b = run(1), c = run(2);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a[0], a[1]);
  EXPECT_EQ(a[0].size(), 32u);
}

TEST(ScissorhandsTest, DropsTheRepeatedlyUnimportant) {
  // Over the history, positions 0..29 are always below 1/visible except 12 and 17.
  EvictionRig rig("codec=f16,page=8;policy=scissorhands,budget=10,window=8,sinks=0,mode=once,history=16", kLayout, 4);
  auto pattern = [](int, int, int32_t, int32_t p) { return p == 12 || p == 17 ? 40.0 : p >= 30 ? 2.0 : 0.1; };
  ASSERT_TRUE(rig.Step(40, pattern, 40).ok());
  ASSERT_TRUE(rig.manager().Compress(rig.seq()).ok());
  std::set<int32_t> want = {12, 17};
  for (int p = 32; p < 40; ++p) want.insert(p);
  EXPECT_EQ(rig.LiveSet(0, 0), want);
}

TEST(ScoredEvictionTest, PoolBytesFallAfterCompression) {
  for (const std::string codec : {"codec=f16,page=8", "codec=int4,page=8", "codec=kivi4,page=8,residual=8"}) {
    SCOPED_TRACE(codec);
    EvictionRig rig(codec + ";policy=random,ratio=0.5", KVLayout{2, 2, 32, 8}, 4);
    ASSERT_TRUE(rig.Step(256, nullptr, 0).ok());
    const uint64_t before = rig.manager().BytesInUse();
    ASSERT_TRUE(rig.manager().Compress(rig.seq()).ok());
    const uint64_t after = rig.manager().BytesInUse();
    // Half the entries leave; random holes in every page, so only compaction frees them.
    EXPECT_LT(after, before * 0.6) << before << " -> " << after;
    EXPECT_GE(LiveEntryFraction(rig.manager().kv(rig.seq())), 0.85);
    EXPECT_GT(rig.scored().last_stats().compactions, 0);
    ASSERT_TRUE(rig.manager().CheckInvariants().ok()) << rig.manager().CheckInvariants().ToString();
  }
}

TEST(ScoredEvictionTest, APromptThatFillsThePoolCanBeCompressed) {
  // The pool sized for exactly the context (n_ctx 256), one prefill chunk
  // fills it, and a continuous policy evicts scattered entries right after
  // the chunk: compaction writes a run's new pages before it frees the run,
  // so the derived budget holds that run (CompressionHeadroomBytes). Without
  // it `kvx bench --kv 'codec=f16;policy=tova,ratio=0.5' -p 512` failed with
  // "KV budget exhausted".
  for (const std::string policy : {"random,ratio=0.5,mode=continuous", "tova,ratio=0.5,mode=continuous", "h2o,ratio=0.5,mode=continuous"}) {
    SCOPED_TRACE(policy);
    EvictionRig rig("codec=f16,page=8;policy=" + policy, KVLayout{2, 2, 32, 8}, 4, 256);
    auto pattern = [](int, int, int32_t, int32_t p) { return p % 2 ? 50.0 : 1.0; };  // every other entry goes
    const Status st = rig.Step(256, pattern, 256);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_LE(rig.LiveSet(0, 0).size(), 160u);  // about half kept (window and sinks protected)
    ASSERT_TRUE(rig.manager().CheckInvariants().ok()) << rig.manager().CheckInvariants().ToString();
  }
}

TEST(ScoredEvictionTest, ParametersAreChecked) {
  auto bad = [](const std::string& policy) {
    auto r = ResolveKVSpec("codec=f16;" + policy, kLayout, 256, 1);
    return r.ok() ? std::string() : r.status().message();
  };
  EXPECT_EQ(bad("policy=snapkv,ratio=0.75,window=32"), "");
  EXPECT_NE(bad("policy=snapkv,ratio=1.5").find("ratio"), std::string::npos);
  EXPECT_NE(bad("policy=snapkv,ratio=0.5,budget=64").find("not both"), std::string::npos);
  EXPECT_NE(bad("policy=snapkv,budget=8,window=32").find("protected"), std::string::npos);
  EXPECT_NE(bad("policy=snapkv,kernel=4").find("odd"), std::string::npos);
  // A key refused where it does not act, saying why.
  for (const auto& [spec, why] : std::vector<std::pair<std::string, std::string>>{
           {"policy=h2o,windw=3", "'windw' does not apply to policy h2o; it takes: "},
           {"policy=snapkv,beta=10", "only layers=pyramid"},
           {"policy=cake,alpha=0.1", "only heads=adakv"},
           {"policy=pyramidkv,tau1=2", "only layers=cake"},
           {"policy=knorm,layers=cake", "observes no attention"}}) {
    EXPECT_NE(bad(spec).find(why), std::string::npos) << spec << ": " << bad(spec);
  }
  EXPECT_EQ(bad("policy=snapkv,heads=adakv,alpha=0.5"), "");
  EXPECT_NE(bad("policy=h2o,mode=sometimes").find("once"), std::string::npos);
  EXPECT_NE(bad("policy=snapkv,fate=shred").find("drop"), std::string::npos);
  EXPECT_NE(bad("policy=adakv,base=nope").find("snapkv"), std::string::npos);
  EXPECT_NE(bad("policy=pyramidkv,beta=0.5").find("beta"), std::string::npos);
  for (const std::string name : {"h2o", "scissorhands", "tova", "snapkv", "pyramidkv", "cake", "adakv", "knorm", "random"}) {
    EXPECT_EQ(bad("policy=" + name), "") << name;
  }
}

}  // namespace
}  // namespace kvx::kv
