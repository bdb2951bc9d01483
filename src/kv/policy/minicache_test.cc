#include "kv/policy/minicache.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <numeric>
#include <random>

#include "kv/attention.h"
#include "kv/kv_manager.h"
#include "kv/kv_test_util.h"

namespace kvx::kv {
namespace {

constexpr int kHeads = 4;  // query heads (2 per kv head)
const KVLayout kLayout{4, 2, 32, 8};  // 4 layers: start = 2 merges the pair (2, 3)
constexpr int kTokens = 64;
constexpr int32_t kOddToken = 37;  // its layer-3 key and value point elsewhere

// K/V of (layer, kv head, token): layer 3 repeats layer 2's directions at
// other norms (plus a little noise), except token kOddToken.
struct Planted {
  std::vector<float> k, v;  // [layer][token][kv head][dim]
  explicit Planted(uint32_t seed) {
    const int D = kLayout.head_dim, H = kLayout.n_kv_heads;
    std::mt19937 rng(seed);
    std::normal_distribution<float> g(0.0f, 1.0f);
    const size_t per_layer = static_cast<size_t>(kTokens) * H * D;
    k.resize(kLayout.n_layers * per_layer);
    v.resize(k.size());
    for (size_t i = 0; i < k.size(); ++i) k[i] = g(rng), v[i] = g(rng);
    for (int t = 0; t < kTokens; ++t) {
      for (int h = 0; h < H; ++h) {
        const size_t at2 = 2 * per_layer + (static_cast<size_t>(t) * H + h) * D, at3 = at2 + per_layer;
        const float sk = 0.5f + 0.05f * (t % 7), sv = 2.0f - 0.1f * (t % 5);  // layer 3's norms differ
        for (int c = 0; c < D; ++c) {
          if (t == kOddToken) continue;  // keeps its independent random direction
          k[at3 + c] = sk * k[at2 + c] + 0.0005f * g(rng);
          v[at3 + c] = sv * v[at2 + c] + 0.0005f * g(rng);
        }
      }
    }
  }
  const float* K(int layer) const { return k.data() + static_cast<size_t>(layer) * kTokens * kLayout.n_kv_heads * kLayout.head_dim; }
  const float* V(int layer) const { return v.data() + static_cast<size_t>(layer) * kTokens * kLayout.n_kv_heads * kLayout.head_dim; }
};

// n_ctx sizes the pool: kTokens fills it (no page to spare at the compression moment).
std::unique_ptr<KVManager> Filled(const std::string& spec, const Planted& x, SeqId* seq, int n_ctx = 256) {
  return testing::FilledManager(spec, kLayout, n_ctx, kTokens, x, seq);
}

// Attention of one decode query (random, fixed) per layer: [layer][heads][dim].
std::vector<float> Outputs(const SequenceKV& kv, uint32_t seed) {
  return testing::DecodeOutputs(kv, kHeads, kTokens, seed);
}

using testing::MaxAbsDiff;

TEST(MiniCacheTest, SlerpOfParallelAndOrthogonalDirections) {
  const float a[4] = {2, 0, 0, 0}, b[4] = {0, 3, 0, 0}, a2[4] = {5, 0, 0, 0};
  float e[4];
  EXPECT_NEAR(SlerpDirection(a, a2, 4, 0.6, e), 0.0, 1e-6);  // same direction: itself
  EXPECT_NEAR(e[0], 1.0f, 1e-6);
  EXPECT_NEAR(SlerpDirection(a, b, 4, 0.5, e), std::numbers::pi / 2, 1e-9);  // half way: 45 degrees
  EXPECT_NEAR(e[0], std::sqrt(0.5), 1e-6);
  EXPECT_NEAR(e[1], std::sqrt(0.5), 1e-6);
  SlerpDirection(a, b, 4, 0.6, e);  // 0.6 of the way: 54 degrees from a, still a unit vector
  EXPECT_NEAR(e[0], std::cos(0.6 * std::numbers::pi / 2), 1e-6);
  EXPECT_NEAR(e[1], std::sin(0.6 * std::numbers::pi / 2), 1e-6);
}

TEST(MiniCacheTest, ParallelLayersMergeOutputsRestoreOddTokenRetainedPagesFreed) {
  const Planted x(7);
  SeqId seq;
  // gamma = 0.01: ceil(0.01 * 64) = 1 token per kv head stays exact.
  auto m = Filled("codec=f16,page=8;policy=minicache,gamma=0.01", x, &seq);
  ASSERT_NE(m, nullptr);
  const SequenceKV& kv = m->kv(seq);
  const std::vector<float> before = Outputs(kv, 11);
  const uint64_t bytes_before = m->BytesInUse();
  const size_t page_bytes = m->pool().PageBytesOf(kv.table(0, 0).pages()[0]);
  ASSERT_TRUE(m->Compress(seq).ok());
  ASSERT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants().ToString();

  const auto& stats = dynamic_cast<const MiniCachePolicy&>(*m->policies()[0]).last_stats();
  EXPECT_EQ(stats.pairs, 1);
  EXPECT_EQ(stats.merged, 2 * (kTokens - 1));
  EXPECT_EQ(stats.retained, 2);
  // The norms of the merged tokens live beside the pool and count: a K and a V scale (f32) per layer.
  EXPECT_GE(m->SideBytes(seq), static_cast<uint64_t>(stats.merged) * 2 * 2 * sizeof(float));

  // Memory: per kv head, the pair held 2 * 8 pages; now ceil(63 / 8) = 8
  // shared + one own page per layer for the retained token = 10 pages.
  EXPECT_EQ(m->BytesInUse(), bytes_before - 2 * 6 * page_bytes);
  EXPECT_EQ(kv.BytesInUse(), m->BytesInUse());
  for (int h = 0; h < kLayout.n_kv_heads; ++h) {
    const PageTable& t2 = kv.table(2, h), &t3 = kv.table(3, h);
    ASSERT_EQ(t2.num_pages(), 9);
    for (int p = 0; p < 8; ++p) {
      EXPECT_EQ(t2.pages()[p], t3.pages()[p]);  // one stored copy
      EXPECT_EQ(m->pool().RefCount(t2.pages()[p]), 2);
    }
    // The odd token is the retained one: each layer's own last page, exact (f16).
    for (int l : {2, 3}) {
      std::vector<float> k(kLayout.head_dim), v(kLayout.head_dim);
      int32_t pos;
      kv.ReadEntry(l, h, 8 * 8, k.data(), v.data(), &pos);
      EXPECT_EQ(pos, kOddToken);
      const size_t at = (static_cast<size_t>(kOddToken) * kLayout.n_kv_heads + h) * kLayout.head_dim;
      EXPECT_LT(MaxAbsDiff(k.data(), x.K(l) + at, kLayout.head_dim), 2e-3);
    }
  }

  // Attention restores each layer's magnitudes: the outputs barely move;
  // layers 0 and 1 are untouched (bit-identical).
  const std::vector<float> after = Outputs(kv, 11);
  const size_t per_layer = static_cast<size_t>(kHeads) * kLayout.head_dim;
  EXPECT_EQ(MaxAbsDiff(before.data(), after.data(), 2 * per_layer), 0.0);
  for (int l : {2, 3}) {
    EXPECT_LT(MaxAbsDiff(before.data() + l * per_layer, after.data() + l * per_layer, per_layer), 1e-2) << "layer " << l;
  }

  // Decode goes on: a new token lands in each layer's own page (scale 1).
  const int32_t tok = 1, pos = kTokens;
  const StepRequest req{seq, {&tok, 1}, {&pos, 1}};
  ASSERT_TRUE(m->BeginStep({&req, 1}).ok());
  std::vector<float> k1(static_cast<size_t>(kLayout.n_kv_heads) * kLayout.head_dim, 0.25f), v1(k1.size(), -1.0f);
  for (int l = 0; l < kLayout.n_layers; ++l) ASSERT_TRUE(m->kv(seq).Append(l, 1, &pos, k1.data(), v1.data()).ok());
  ASSERT_TRUE(m->CommitStep().ok());
  ASSERT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants().ToString();
  std::vector<float> k(kLayout.head_dim), v(kLayout.head_dim);
  int32_t got;
  kv.ReadEntry(3, 1, kv.Length(3, 1) - 1, k.data(), v.data(), &got);
  EXPECT_EQ(got, pos);
  EXPECT_EQ(k[0], 0.25f);
  EXPECT_EQ(v[0], -1.0f);
}

TEST(MiniCacheTest, EvictingFromASharedPageUnsharesItOnlyForThatLayer) {
  const Planted x(3);
  SeqId seq;
  auto m = Filled("codec=f16,page=8;policy=minicache", x, &seq, kTokens);  // a full pool
  ASSERT_NE(m, nullptr);
  EXPECT_LT(m->pool().budget_bytes() - m->BytesInUse(), m->pool().PageBytesOf(m->kv(seq).table(0, 0).pages()[0]));
  ASSERT_TRUE(m->Compress(seq).ok());  // reuses the pair's pages
  ASSERT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants().ToString();
  SequenceKV& kv = m->kv(seq);
  std::vector<float> k3(kLayout.head_dim), v3(kLayout.head_dim), k3b(k3.size()), v3b(k3.size());
  int32_t p3, p3b;
  kv.ReadEntry(3, 0, 0, k3.data(), v3.data(), &p3);
  ASSERT_TRUE(kv.RemoveEntries(2, 0, {0}).ok());
  ASSERT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants().ToString();
  EXPECT_NE(kv.table(2, 0).pages()[0], kv.table(3, 0).pages()[0]);  // layer 2 got a private copy
  kv.ReadEntry(3, 0, 0, k3b.data(), v3b.data(), &p3b);
  EXPECT_EQ(p3b, p3);
  EXPECT_EQ(MaxAbsDiff(k3.data(), k3b.data(), k3.size()), 0.0);
  EXPECT_EQ(MaxAbsDiff(v3.data(), v3b.data(), v3.size()), 0.0);
}

TEST(MiniCacheTest, ComposesWithRowWiseQuantizedCodecs) {
  const Planted x(5);
  SeqId seq;
  auto m = Filled("codec=int8,page=8,rotate=hadamard;policy=minicache,gamma=0.01", x, &seq, kTokens);
  ASSERT_NE(m, nullptr);
  const std::vector<float> before = Outputs(m->kv(seq), 2);
  const uint64_t bytes_before = m->BytesInUse();
  ASSERT_TRUE(m->Compress(seq).ok());
  ASSERT_TRUE(m->CheckInvariants().ok());
  EXPECT_LT(m->BytesInUse(), bytes_before);
  const std::vector<float> after = Outputs(m->kv(seq), 2);
  EXPECT_LT(MaxAbsDiff(before.data(), after.data(), before.size()), 5e-2);
}

TEST(MiniCacheTest, RejectsWhatItCannotMergeNamingWhatWorks) {
  auto error = [](const std::string& spec) {
    auto r = ResolveKVSpec(spec, kLayout, 256, 1);
    return r.ok() ? std::string() : r.status().message();
  };
  EXPECT_NE(error("codec=kivi2,page=32;policy=minicache").find("row-wise codecs f32, f16, int8"), std::string::npos);
  // sinks= and outliers= seal pages too; the message names the option, not KIVI.
  EXPECT_NE(error("codec=int2,page=8,outliers=0.01;policy=minicache").find("codec outliers="), std::string::npos);
  EXPECT_NE(error("codec=int4,page=8,sinks=1;policy=minicache").find("codec sinks="), std::string::npos);
  EXPECT_NE(error("codec=int4,page=8,bits.3=k8v8;policy=minicache").find("different codecs or bits"), std::string::npos);
  EXPECT_NE(error("codec=f16,page=8;policy=minicache,mode=continuous").find("not implemented"), std::string::npos);
  EXPECT_NE(error("codec=f16,page=8;policy=minicache,start=3").find("no pair"), std::string::npos);
  EXPECT_NE(error("codec=f16,page=8;policy=minicache;policy=quest").find("quest"), std::string::npos);
  EXPECT_EQ(error("codec=int4,page=8,bits.0=k8v8;policy=minicache"), "");  // layer 0 is not merged
  EXPECT_EQ(error("codec=f16,page=8,prerope=1;policy=minicache,t=0.5,retain=range,gamma=0.1,start=0"), "");
}

}  // namespace
}  // namespace kvx::kv
