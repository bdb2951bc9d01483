#include "kv/policy/merge_fate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "kv/kv_manager.h"
#include "kv/policy/params.h"

namespace kvx::kv {
namespace {

// One layer, one kv head, head_dim 4, page 4: appends rows k[i], v[i] at positions 0..n-1.
std::unique_ptr<KVManager> Manager(const std::string& spec, SeqId* seq, const std::vector<std::vector<float>>& k,
                                   const std::vector<std::vector<float>>& v) {
  auto r = ResolveKVSpec(spec, KVLayout{1, 1, static_cast<int>(k[0].size()), 4}, 64, 1);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  auto m = std::move(KVManager::Create(std::move(*r))).value();
  *seq = m->AddSequence();
  const int n = static_cast<int>(k.size());
  std::vector<int32_t> toks(n, 1), pos(n);
  std::iota(pos.begin(), pos.end(), 0);
  std::vector<float> kf, vf;
  for (int i = 0; i < n; ++i) kf.insert(kf.end(), k[i].begin(), k[i].end()), vf.insert(vf.end(), v[i].begin(), v[i].end());
  const StepRequest req{*seq, toks, pos};
  EXPECT_TRUE(m->BeginStep({&req, 1}).ok());
  EXPECT_TRUE(m->kv(*seq).Append(0, n, pos.data(), kf.data(), vf.data()).ok());
  EXPECT_TRUE(m->CommitStep().ok());
  return m;
}

std::vector<float> Key(const SequenceKV& kv, int slot, std::vector<float>* v = nullptr, int32_t* pos = nullptr) {
  const size_t D = static_cast<size_t>(kv.layout().head_dim);
  std::vector<float> k(D), vv(D);
  int32_t p;
  kv.ReadEntry(0, 0, slot, k.data(), vv.data(), &p);
  if (v != nullptr) *v = vv;
  if (pos != nullptr) *pos = p;
  return k;
}

std::unique_ptr<EvictionFate> MakeFate(const PolicyParams& params) {
  PolicyParamReader r("test", params);
  auto f = MergeFate::Create(r);
  EXPECT_TRUE(f.ok());
  EXPECT_TRUE(r.Finish().ok());
  return std::move(f).value();
}

TEST(MergeFateTest, EvictedEntryFoldsIntoItsMostSimilarKeptNeighbour) {
  // Kept: three orthogonal keys. Evicted: slot 3, close to slot 1's key;
  // slot 4, pointing away from every kept key (cosine <= 0).
  const std::vector<std::vector<float>> k = {
      {1, 0, 0, 0}, {0, 1, 0, 0}, {0, 0, 1, 0}, {0.1f, 0.9f, 0, 0.1f}, {0, 0, 0, -1}};
  const std::vector<std::vector<float>> v = {{1, 1, 1, 1}, {2, 2, 2, 2}, {3, 3, 3, 3}, {10, 10, 10, 10}, {7, 7, 7, 7}};
  SeqId a;
  auto m = Manager("codec=f32,page=4", &a, k, v);
  auto fate = MakeFate({{"merge_min_sim", "0.5"}});
  ASSERT_TRUE(fate->Apply(*m, a, 0, 0, {3, 4}, {0, 1, 2}).ok());
  const double cs = 0.9 / std::sqrt(0.01 + 0.81 + 0.01), w = (cs + 1) / 2;
  std::vector<float> v1;
  const std::vector<float> k1 = Key(m->kv(a), 1, &v1);
  for (int c = 0; c < 4; ++c) {
    EXPECT_NEAR(k1[c], (k[1][c] + w * k[3][c]) / (1 + w), 1e-6) << c;
    EXPECT_NEAR(v1[c], (2 + w * 10) / (1 + w), 1e-5) << c;
  }
  EXPECT_EQ(Key(m->kv(a), 0), k[0]);  // the others unchanged
  EXPECT_EQ(Key(m->kv(a), 2), k[2]);
  int32_t p3;
  Key(m->kv(a), 3, nullptr, &p3);
  EXPECT_EQ(p3, kDeadPosition);
  EXPECT_EQ(m->kv(a).Length(0, 0), 4);  // slot 4 (below merge_min_sim: dropped, merged nowhere) left with its page
  EXPECT_EQ(static_cast<MergeFate*>(fate.get())->merged(), 1);
  EXPECT_EQ(m->kv(a).LiveEntries(0, 0), 3);
  m->MarkEntriesRemoved(a);  // as the policy does after its fate
  EXPECT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants().ToString();
}

// D2O's EMA threshold (merge_ema=beta): the first eviction merges what is
// at least as similar as its evictions' mean best cosine; later ones
// compare with beta x the old threshold + (1 - beta) x their own mean, not
// with their mean alone; a released sequence starts over.
TEST(MergeFateTest, TheEmaThresholdFollowsTheEvictionsSimilarities) {
  const std::vector<std::vector<float>> k = {
      {1, 0, 0, 0}, {0, 1, 0, 0}, {0, 0, 1, 0}, {0.1f, 0.9f, 0, 0.1f}, {0, 0, 0, -1}};
  const std::vector<std::vector<float>> v(5, std::vector<float>(4, 1.0f));
  SeqId a;
  auto m = Manager("codec=f32,page=4", &a, k, v);
  auto fate = MakeFate({{"merge_ema", "0.5"}});
  auto* merge = static_cast<MergeFate*>(fate.get());
  // Best cosines 0.99 (slot 3) and 0 (slot 4): threshold 0.49, slot 3 merges.
  ASSERT_TRUE(fate->Apply(*m, a, 0, 0, {3, 4}, {0, 1, 2}).ok());
  EXPECT_EQ(merge->merged(), 1);
  // Slot 2 (best cosine 0): its own mean would merge it (0 >= 0); the EMA,
  // 0.5 x 0.49 + 0.5 x 0, does not.
  ASSERT_TRUE(fate->Apply(*m, a, 0, 0, {2}, {0, 1}).ok());
  EXPECT_EQ(merge->merged(), 1);
  m->MarkEntriesRemoved(a);
  EXPECT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants().ToString();

  SeqId b;
  auto m2 = Manager("codec=f32,page=4", &b, k, v);
  fate->Forget(a);
  ASSERT_TRUE(fate->Apply(*m2, b, 0, 0, {2}, {0, 1}).ok());  // a fresh threshold: its own mean, 0
  EXPECT_EQ(merge->merged(), 2);
  // merge_min_sim is the fixed threshold's key: with merge_ema it is refused.
  const PolicyParams both = {{"merge_ema", "0.9"}, {"merge_min_sim", "0.5"}};
  PolicyParamReader r("test", both);
  ASSERT_TRUE(MergeFate::Create(r).ok());
  EXPECT_NE(r.Finish().message().find("merge_ema sets the threshold"), std::string::npos) << r.Finish().message();
}

TEST(MergeFateTest, GaussianWeightsFavourTheCloserEntry) {
  // Two evicted entries merge into slot 0: the closer one weighs more.
  const std::vector<std::vector<float>> k = {{1, 0, 0, 0}, {0, 0, 1, 0}, {1, 0.1f, 0, 0}, {1, 0.8f, 0, 0}};
  const std::vector<std::vector<float>> v = {{0, 0, 0, 0}, {5, 5, 5, 5}, {1, 1, 1, 1}, {-1, -1, -1, -1}};
  SeqId a;
  auto m = Manager("codec=f32,page=4", &a, k, v);
  auto fate = MakeFate({{"merge_weight", "gauss"}});
  ASSERT_TRUE(fate->Apply(*m, a, 0, 0, {2, 3}, {0, 1}).ok());
  const double d2a = 0.01, d2b = 0.64, s2 = (d2a + d2b) / 2;
  const double wa = std::exp(-d2a / (2 * s2)), wb = std::exp(-d2b / (2 * s2));
  std::vector<float> v0;
  Key(m->kv(a), 0, &v0);
  EXPECT_NEAR(v0[0], (0 + wa * 1 + wb * -1) / (1 + wa + wb), 1e-6);
  EXPECT_GT(v0[0], 0.0f);
}

TEST(MergeFateTest, RewriteEntriesCopiesSharedPagesAndReencodesSealedOnes) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<std::vector<float>> k(12, std::vector<float>(8)), v = k;
  for (auto& r : k) for (auto& x : r) x = nd(rng);
  for (auto& r : v) for (auto& x : r) x = nd(rng);
  for (const std::string spec : {"codec=f16,page=4", "codec=kivi4,page=4,residual=0"}) {
    SCOPED_TRACE(spec);
    SeqId a;
    auto m = Manager(spec, &a, k, v);
    auto fork = m->ForkPrefix(a, 12);
    ASSERT_TRUE(fork.ok());
    const std::vector<float> before = Key(m->kv(*fork), 5);
    const std::vector<float> nk = {0.5f, -0.25f, 0.125f, 1.0f, 0, 0.5f, -1, 0.25f}, nv = {1, 2, 3, 4, -1, -2, 0, 1};
    ASSERT_TRUE(m->kv(a).RewriteEntries(0, 0, {5}, nk.data(), nv.data()).ok());
    std::vector<float> gv;
    const std::vector<float> gk = Key(m->kv(a), 5, &gv);
    for (int c = 0; c < 8; ++c) {
      EXPECT_NEAR(gk[c], nk[c], 0.2) << c;
      EXPECT_NEAR(gv[c], nv[c], 0.4) << c;
    }
    EXPECT_EQ(Key(m->kv(*fork), 5), before);  // the fork's shared page was not written
    EXPECT_FALSE(m->kv(a).RewriteEntries(0, 0, {40}, nk.data(), nv.data()).ok());
    m->MarkEntriesRemoved(a);  // its pages no longer hold what its tokens wrote
    EXPECT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants().ToString();
  }
}

TEST(MergeFateTest, KVMergerPolicyRunsEndToEnd) {
  auto r = ResolveKVSpec("codec=f16,page=8;policy=kvmerger,budget=24,window=8,sinks=2", KVLayout{2, 2, 16, 8}, 512, 1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto m = std::move(KVManager::Create(std::move(*r))).value();
  const SeqId a = m->AddSequence();
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (int step = 0; step < 40; ++step) {
    const int n = step == 0 ? 30 : 1;
    std::vector<int32_t> toks(n, 1), pos(n);
    for (int i = 0; i < n; ++i) pos[i] = m->length(a) + i;
    const StepRequest req{a, toks, pos};
    ASSERT_TRUE(m->BeginStep({&req, 1}).ok());
    std::vector<float> kv(static_cast<size_t>(n) * 2 * 16);
    for (auto& x : kv) x = nd(rng);
    std::vector<float> q(kv.size());
    for (int l = 0; l < 2; ++l) ASSERT_TRUE(m->kv(a).Append(l, n, pos.data(), kv.data(), kv.data()).ok());
    ASSERT_TRUE(m->CommitStep().ok());
  }
  ASSERT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants().ToString();
  EXPECT_LE(m->kv(a).LiveEntries(1, 1), 24 + 1);
  EXPECT_FALSE(ResolveKVSpec("codec=f16;policy=kvmerger,merge_weight=mean", KVLayout{2, 2, 16, 8}, 64, 1).ok());
}

}  // namespace
}  // namespace kvx::kv
