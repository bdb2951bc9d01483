#include "kv/policy/demote_fate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "kv/attention.h"
#include "kv/kv_manager.h"
#include "kv/policy/eviction_test_util.h"

namespace kvx::kv {
namespace {

using testing::EvictionRig;

constexpr int kTokens = 64, kDim = 64, kPage = 16;
// Planted heavy hitters (H2O keeps them) and the recent window (kept by rule).
const std::set<int32_t> kHeavy = {2, 5, 12, 17, 25, 30, 38, 41};
constexpr int kWindow = 8;

// Random keys (small: attention spreads over every entry, so the demoted
// 75% carry most of the output) and values, fixed per (position, channel).
float KeyOf(int32_t pos, int c) {
  std::mt19937 rng(static_cast<unsigned>(pos * 131 + c));
  return 0.3f * std::normal_distribution<float>()(rng);
}
float ValueOf(int32_t pos, int c) {
  std::mt19937 rng(static_cast<unsigned>(pos * 977 + c + 7));
  return std::normal_distribution<float>()(rng);
}

// The prompt with H2O's observations planted (heavy hitters get most of the
// attention), then one compression.
std::unique_ptr<EvictionRig> Compressed(const std::string& spec) {
  auto rig = std::make_unique<EvictionRig>(spec, KVLayout{1, 1, kDim, kPage}, 1, 256);
  auto pattern = [](int, int, int32_t, int32_t pos) { return kHeavy.count(pos) ? 50.0 : 1.0; };
  auto key = [](int, int, int32_t pos, int c) { return KeyOf(pos, c); };
  auto value = [](int, int, int32_t pos, int c) { return ValueOf(pos, c); };
  EXPECT_TRUE(rig->Step(kTokens, pattern, kTokens, key, value).ok());
  return rig;
}

// Softmax attention of query q over the given positions' original rows
// (the full-precision reference), in double.
std::vector<double> Reference(const std::vector<float>& q, const std::set<int32_t>& positions) {
  std::vector<double> w, out(kDim, 0.0);
  double mx = -1e300;
  for (int32_t p : positions) {
    double s = 0;
    for (int c = 0; c < kDim; ++c) s += static_cast<double>(q[c]) * KeyOf(p, c);
    s /= std::sqrt(static_cast<double>(kDim));
    w.push_back(s);
    mx = std::max(mx, s);
  }
  double sum = 0;
  for (double& x : w) sum += (x = std::exp(x - mx));
  size_t i = 0;
  for (int32_t p : positions) {
    for (int c = 0; c < kDim; ++c) out[c] += w[i] / sum * ValueOf(p, c);
    ++i;
  }
  return out;
}

double Rms(const std::vector<float>& a, const std::vector<double>& b) {
  double s = 0;
  for (int c = 0; c < kDim; ++c) s += (a[c] - b[c]) * (a[c] - b[c]);
  return std::sqrt(s / kDim);
}

// Mean over a few queries of the RMS error of kvx's attention output against
// the reference over every position, and of the reference over `kept` only
// (what dropping the others would give).
void AttentionErrors(const SequenceKV& kv, const std::set<int32_t>& kept, double* err, double* drop_err) {
  std::set<int32_t> all;
  for (int p = 0; p < kTokens; ++p) all.insert(p);
  *err = *drop_err = 0;
  const int n_queries = 4;
  for (int qi = 0; qi < n_queries; ++qi) {
    std::vector<float> q(kDim), out(kDim);
    std::mt19937 rng(100 + qi);
    for (float& x : q) x = std::normal_distribution<float>()(rng);
    const int32_t qpos = kTokens;
    Attention(kv, 0, q.data(), &qpos, 1, 1, 1.0f / std::sqrt(static_cast<float>(kDim)), out.data(), nullptr);
    const std::vector<double> ref = Reference(q, all), dropped = Reference(q, kept);
    std::vector<float> dropped_f(dropped.begin(), dropped.end());
    *err += Rms(out, ref) / n_queries;
    *drop_err += Rms(dropped_f, ref) / n_queries;
  }
}

TEST(DemoteFateTest, DemotedEntriesStayAttendedAtLowBitsAndTheImportantStayExact) {
  auto rig = Compressed("codec=f16,page=16;policy=mikv,ratio=0.75,window=8,sinks=0,mode=once");
  KVManager& m = rig->manager();
  const SequenceKV& kv = m.kv(rig->seq());
  const uint64_t bytes_before = kv.BytesInUse();
  ASSERT_TRUE(m.Compress(rig->seq()).ok());
  ASSERT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants().ToString();

  // Every token is still in the cache; the full-precision ones are the heavy
  // hitters and the window, the other 48 are in demoted pages.
  EXPECT_EQ(rig->LiveSet(0, 0).size(), static_cast<size_t>(kTokens));
  std::set<int32_t> important = kHeavy;
  for (int p = kTokens - kWindow; p < kTokens; ++p) important.insert(p);
  const PageTable& t = kv.table(0, 0);
  std::set<int32_t> exact, demoted;
  for (int s = 0; s < t.length(); ++s) {
    std::vector<float> k(kDim), v(kDim);
    int32_t pos;
    kv.ReadEntry(0, 0, s, k.data(), v.data(), &pos);
    if (pos == kDeadPosition) continue;
    const bool is_demoted = t.format(s / kPage) == kPageDemoted;
    (is_demoted ? demoted : exact).insert(pos);
    // Demoted: within int2's rounding (half a step of each 32-channel
    // group's range, plus f16 parameters); kept: f16-exact.
    for (int g = 0; g < kDim; g += 32) {
      float klo = 1e30f, khi = -1e30f, vlo = 1e30f, vhi = -1e30f;
      for (int c = g; c < g + 32; ++c) {
        klo = std::min(klo, KeyOf(pos, c)), khi = std::max(khi, KeyOf(pos, c));
        vlo = std::min(vlo, ValueOf(pos, c)), vhi = std::max(vhi, ValueOf(pos, c));
      }
      const float ktol = is_demoted ? (khi - klo) / 6 * 1.01f + 2e-3f : 2e-3f;
      const float vtol = is_demoted ? (vhi - vlo) / 6 * 1.01f + 2e-3f : 4e-3f;
      for (int c = g; c < g + 32; ++c) {
        ASSERT_NEAR(k[c], KeyOf(pos, c), ktol) << "pos " << pos << " c " << c;
        ASSERT_NEAR(v[c], ValueOf(pos, c), vtol) << "pos " << pos << " c " << c;
      }
    }
  }
  EXPECT_EQ(exact, important);
  EXPECT_EQ(demoted.size(), static_cast<size_t>(kTokens) - important.size());

  // Pool bytes: 4 f16 pages before; after, the 16 kept entries in 2 f16
  // pages (the 8 heavy hitters compacted into one, the window's page) and
  // the 48 demoted in 3 int2 pages of 832 bytes (64 B of positions, then
  // per row 16 B of K codes + 8 B of K (scale, min), and the same for V).
  const size_t f16_page = m.pool().PageBytesOf(t.pages().back());
  EXPECT_EQ(kv.DemotedPageBytes(), 832u);
  EXPECT_EQ(bytes_before, 4 * f16_page);
  EXPECT_EQ(kv.BytesInUse(), 2 * f16_page + 3 * kv.DemotedPageBytes());
  EXPECT_EQ(m.pool().Stats().bytes_in_use, kv.BytesInUse());

  // Attention still reads the demoted entries: its output is close to the
  // full cache's, far closer than the kept entries alone would give.
  double err, drop_err;
  AttentionErrors(kv, important, &err, &drop_err);
  EXPECT_LT(err, 0.08) << "drop would give " << drop_err;
  EXPECT_LT(err, 0.4 * drop_err);

  // A second pass finds nothing new to evict: the demoted are not scored again.
  ASSERT_TRUE(m.Compress(rig->seq()).ok());
  EXPECT_EQ(rig->scored().last_stats().evicted, 0);
}

TEST(DemoteFateTest, ComposesWithEveryLayerCodec) {
  // (kivi4 without its residual window: 64 tokens would leave half the
  // chain in f16 staging pages, which compaction does not touch.)
  for (const std::string codec : {"codec=int8", "codec=kivi4,residual=0", "codec=int4,rotate=hadamard",
                                  "codec=f16,rotate=hadamard", "codec=f32"}) {
    for (const std::string demote : {"int2", "kivi2"}) {
      SCOPED_TRACE(codec + " demote=" + demote);
      auto rig = Compressed(codec + ",page=16;policy=mikv,ratio=0.75,window=8,sinks=0,mode=once,demote=" + demote);
      KVManager& m = rig->manager();
      const SequenceKV& kv = m.kv(rig->seq());
      const uint64_t before = kv.BytesInUse();
      ASSERT_TRUE(m.Compress(rig->seq()).ok());
      ASSERT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants().ToString();
      EXPECT_EQ(rig->LiveSet(0, 0).size(), static_cast<size_t>(kTokens));
      EXPECT_EQ(kv.LiveEntriesIn(0, 0, kPageDemoted), kTokens - 16);
      // (kivi2 pages of 16 tokens are not much smaller than int4's: with the
      // window's half-empty last page, 64 tokens gain nothing there.)
      if (demote == "int2") {
        EXPECT_LT(kv.BytesInUse(), before);
      }
      std::set<int32_t> important = kHeavy;
      for (int p = kTokens - kWindow; p < kTokens; ++p) important.insert(p);
      double err, drop_err;
      AttentionErrors(kv, important, &err, &drop_err);
      EXPECT_LT(err, 0.5 * drop_err);
    }
  }
}

TEST(DemoteFateTest, ADemotionLeavesItsSourcePagesCompacted) {
  // Half the entries move to int2 pages and leave their layer pages about
  // half live, above compact=0.1: under the threshold alone those pages
  // would stay, and the cache would hold the demoted copies on top of them
  // (MiKV on int2/kivi layers grew the cache). An eviction that grew a table
  // compacts it whatever the threshold: the layer pages are then as few as
  // their live entries need, but for the last one (appends write into it).
  for (const std::string codec : {"codec=int4", "codec=int2,outliers=0.05", "codec=kivi4,residual=0"}) {
    SCOPED_TRACE(codec);
    auto rig = Compressed(codec + ",page=16;policy=mikv,ratio=0.5,window=8,sinks=0,mode=once,compact=0.1");
    KVManager& m = rig->manager();
    const SequenceKV& kv = m.kv(rig->seq());
    ASSERT_TRUE(m.Compress(rig->seq()).ok());
    ASSERT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants().ToString();
    ASSERT_EQ(kv.LiveEntriesIn(0, 0, kPageDemoted), kTokens / 2);
    const PageTable& t = kv.table(0, 0);
    int layer_pages = 0;
    for (int p = 0; p < t.num_pages(); ++p) layer_pages += t.format(p) == kPagePacked;
    const int layer_live = kv.LiveEntriesIn(0, 0, kPagePacked);
    EXPECT_LE(layer_pages, (layer_live + kPage - 1) / kPage + 1) << layer_live << " live entries";
  }
}

TEST(DemoteFateTest, AFullPoolCanBeCompressed) {
  // The pool sized for exactly the context, the context full: the demoted
  // pages are written before compaction frees their sources, so the budget
  // derived from the context holds that headroom (CompressionHeadroomBytes);
  // without it the compression failed with "KV budget exhausted".
  for (const std::string codec : {"codec=f16", "codec=int4", "codec=kivi4,residual=0"}) {
    SCOPED_TRACE(codec);
    auto rig = std::make_unique<EvictionRig>(codec + ",page=16;policy=mikv,ratio=0.875,window=8,sinks=0,mode=once",
                                             KVLayout{2, 2, kDim, kPage}, 2, kTokens);
    auto pattern = [](int, int, int32_t, int32_t pos) { return kHeavy.count(pos) ? 50.0 : 1.0; };
    auto key = [](int, int, int32_t pos, int c) { return KeyOf(pos, c); };
    ASSERT_TRUE(rig->Step(kTokens, pattern, kTokens, key).ok());
    KVManager& m = rig->manager();
    const uint64_t before = m.kv(rig->seq()).BytesInUse();
    const Status st = m.Compress(rig->seq());
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_LT(m.kv(rig->seq()).BytesInUse(), before);
    EXPECT_EQ(rig->LiveSet(0, 0).size(), static_cast<size_t>(kTokens));
  }
}

TEST(DemoteFateTest, ContinuousDemotionKeepsPagesDenseAndForksWork) {
  // mikv's defaults: H2O, continuous, ratio 0.75, int2. Decode steps demote
  // an entry or two at a time into the free slots of the demoted pages.
  auto rig = std::make_unique<EvictionRig>("codec=f16,page=16;policy=mikv,window=8,sinks=4", KVLayout{2, 2, kDim, kPage},
                                           4, 512);
  auto pattern = [](int, int, int32_t, int32_t pos) { return pos % 7 == 0 ? 20.0 : 1.0; };
  auto key = [](int, int, int32_t pos, int c) { return KeyOf(pos, c); };
  ASSERT_TRUE(rig->Step(48, pattern, 48, key).ok());
  for (int i = 0; i < 60; ++i) ASSERT_TRUE(rig->Step(1, pattern, 1, key).ok());
  KVManager& m = rig->manager();
  ASSERT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants().ToString();
  const SequenceKV& kv = m.kv(rig->seq());
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 2; ++h) {
      EXPECT_EQ(kv.LiveEntries(l, h), 108);  // nothing lost
      const int demoted = kv.LiveEntriesIn(l, h, kPageDemoted);
      EXPECT_GE(demoted, 108 - 28);
      int demoted_pages = 0;
      for (int p = 0; p < kv.table(l, h).num_pages(); ++p) demoted_pages += kv.table(l, h).format(p) == kPageDemoted;
      EXPECT_EQ(demoted_pages, (demoted + kPage - 1) / kPage);  // dense: at most one partly filled
    }
  }
  // Forks share the demoted pages; a prefix fork cutting a demoted page
  // re-encodes its part in the layer's format (appends can write it).
  ASSERT_EQ(kv.table(0, 0).format(1), kPageDemoted);
  auto fork = kv.ForkPrefix(20);
  ASSERT_TRUE(fork.ok()) << fork.status().ToString();
  ASSERT_TRUE((*fork)->CheckTables().ok()) << (*fork)->CheckTables().ToString();
  EXPECT_EQ((*fork)->table(0, 0).format(1), kPagePacked);
  std::vector<float> k(kDim), v(kDim), k2(kDim), v2(kDim);
  int32_t p, p2;
  kv.ReadEntry(0, 0, 18, k.data(), v.data(), &p);
  (*fork)->ReadEntry(0, 0, 18, k2.data(), v2.data(), &p2);
  EXPECT_EQ(p, p2);
  for (int c = 0; c < kDim; ++c) EXPECT_NEAR(k[c], k2[c], 1e-2) << c;
  const int32_t next = 200;
  std::vector<float> row(2 * kDim, 0.5f);
  ASSERT_TRUE((*fork)->Append(0, 1, &next, row.data(), row.data()).ok());
  ASSERT_TRUE((*fork)->CheckTables().ok()) << (*fork)->CheckTables().ToString();
}

TEST(DemoteFateTest, ImpossibleCombinationsAreRejected) {
  const KVLayout L{2, 2, 64, 16};
  auto create = [&](const std::string& spec) -> Status {
    auto r = ResolveKVSpec(spec, L, 256, 1);
    if (!r.ok()) return r.status();
    return KVManager::Create(std::move(*r)).status();
  };
  EXPECT_TRUE(create("codec=f16;policy=mikv").ok());
  EXPECT_TRUE(create("codec=f16;policy=snapkv,ratio=0.5,fate=demote,demote=int4").ok());
  const Status unknown = create("codec=f16;policy=mikv,demote=int3");
  EXPECT_FALSE(unknown.ok());
  EXPECT_NE(unknown.ToString().find("int2"), std::string::npos) << unknown.ToString();
  EXPECT_FALSE(create("codec=f16;policy=mikv,demote=f16").ok());
  const Status bigger = create("codec=int4;policy=mikv,demote=int8");
  EXPECT_FALSE(bigger.ok());
  EXPECT_NE(bigger.ToString().find("save nothing"), std::string::npos) << bigger.ToString();
  // The fix it suggests is a codec that does save memory, or none at all.
  EXPECT_NE(bigger.ToString().find("use demote=int2 ("), std::string::npos) << bigger.ToString();
  const Status smallest = create("codec=int2;policy=mikv");
  EXPECT_FALSE(smallest.ok());
  EXPECT_NE(smallest.ToString().find("no demotion codec is smaller than int2"), std::string::npos)
      << smallest.ToString();
  EXPECT_FALSE(create("codec=f16;policy=snapkv,demote=int2").ok());  // demote= without fate=demote
  EXPECT_FALSE(create("codec=f16,page=2;policy=mikv,demote=kivi2").ok());
}

}  // namespace
}  // namespace kvx::kv
