#include "ops/nn.h"

#include <gtest/gtest.h>

#include "ops/nn_internal.h"
#include "ops/ops_test_util.h"
#include "ops/simd_target.h"

#include <cmath>
#include <random>
#include <vector>

namespace kvx::ops {
namespace {

std::vector<float> RandomVec(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

TEST(RmsNormTest, MatchesDoubleFormula) {
  const int64_t n = 576;
  auto x = RandomVec(n, 1, 3.0f);
  auto w = RandomVec(n, 2);
  std::vector<float> out(n);
  RmsNorm(x.data(), w.data(), n, 1e-5f, out.data());
  double ss = 0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const double scale = 1.0 / std::sqrt(ss / n + 1e-5);
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(out[i], x[i] * scale * w[i], 1e-5 * (1 + std::fabs(out[i])));
}

TEST(RmsNormTest, InPlaceAndNoWeight) {
  std::vector<float> x = {3.0f, 4.0f};
  RmsNorm(x.data(), nullptr, 2, 0.0f, x.data());
  // rms = sqrt(12.5)
  EXPECT_FLOAT_EQ(x[0], 3.0f / std::sqrt(12.5f));
  EXPECT_FLOAT_EQ(x[1], 4.0f / std::sqrt(12.5f));
}

TEST(SoftmaxTest, SumsToOneAndMatches) {
  auto x = RandomVec(1000, 3, 5.0f);
  auto ref = x;
  Softmax(x.data(), 1000);
  double mx = -1e30, sum = 0;
  for (float v : ref) mx = std::max<double>(mx, v);
  for (float v : ref) sum += std::exp(v - mx);
  double total = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(x[i], std::exp(ref[i] - mx) / sum, 1e-6);
    total += x[i];
  }
  EXPECT_NEAR(total, 1.0, 1e-5);
}

TEST(SoftmaxTest, NegativeInfinityGivesZero) {
  std::vector<float> x = {1.0f, -INFINITY, 1.0f};
  Softmax(x.data(), 3);
  EXPECT_FLOAT_EQ(x[0], 0.5f);
  EXPECT_EQ(x[1], 0.0f);
  EXPECT_FLOAT_EQ(x[2], 0.5f);
}

TEST(ElementwiseTest, SwiGLUAddMulScale) {
  std::vector<float> g = {0.0f, 1.0f, -2.0f, 10.0f}, u = {5.0f, 2.0f, 3.0f, 0.5f}, out(4);
  SwiGLU(g.data(), u.data(), 4, out.data());
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out[i], g[i] / (1 + std::exp(-g[i])) * u[i], 1e-6);
  Add(g.data(), u.data(), 4, out.data());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], g[i] + u[i]);
  Mul(g.data(), u.data(), 4, out.data());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], g[i] * u[i]);
  Scale(out.data(), 4, 2.0f);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], 2 * g[i] * u[i]);
}

// The SIMD kernels against the scalar references, on every target, over
// lengths with and without a vector tail and edge values (-inf, large |x|).
TEST(NnSimdTest, MatchScalarReferencesOnEveryTarget) {
  for (const std::string& target : testing::TestableTargets()) {
    SCOPED_TRACE(target);
    ASSERT_TRUE(ForceSimdTarget(target));
    for (int64_t n : {1, 7, 16, 33, 576, 1536 + 5}) {
      SCOPED_TRACE(n);
      auto x = RandomVec(n, 11, 4.0f), w = RandomVec(n, 12), u = RandomVec(n, 13);
      if (n > 20) {
        x[3] = 95.0f;    // exp(-x) underflows
        x[17] = -95.0f;  // exp(-x) overflows
      }
      std::vector<float> a(n), b(n);
      RmsNorm(x.data(), w.data(), n, 1e-5f, a.data());
      internal::RmsNormScalar(x.data(), w.data(), n, 1e-5f, b.data());
      for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(a[i], b[i], 1e-6f * (1 + std::fabs(b[i])));
      RmsNorm(x.data(), nullptr, n, 1e-5f, a.data());
      internal::RmsNormScalar(x.data(), nullptr, n, 1e-5f, b.data());
      for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(a[i], b[i], 1e-6f * (1 + std::fabs(b[i])));

      SwiGLU(x.data(), u.data(), n, a.data());
      internal::SwiGLUScalar(x.data(), u.data(), n, b.data());
      for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(a[i], b[i], 2e-6f * (1 + std::fabs(b[i]))) << i;

      auto sa = x, sb = x;
      if (n > 20) sa[5] = sb[5] = -INFINITY;
      Softmax(sa.data(), n);
      internal::SoftmaxScalar(sb.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(sa[i], sb[i], 1e-6f * (1e-6f + sb[i])) << i;
      if (n > 20) {
        EXPECT_EQ(sa[5], 0.0f);
      }

      Add(x.data(), u.data(), n, a.data());
      internal::AddScalar(x.data(), u.data(), n, b.data());
      EXPECT_EQ(a, b);
    }
    // RoPE rounds exactly like the scalar rotation (no fused products),
    // both layouts, whole vectors and a scalar tail of pairs.
    for (bool neox : {false, true}) {
      for (int n_dims : {8, 32, 64, 128, 96 + 4}) {
        SCOPED_TRACE(std::to_string(n_dims) + (neox ? " neox" : ""));
        auto x = RandomVec(n_dims, 14, 3.0f), cs = RandomVec(n_dims, 15);
        auto y = x;
        internal::RopeApplyBest(x.data(), cs.data(), n_dims, neox);
        internal::RopeApplyScalar(y.data(), cs.data(), n_dims, neox, 0);
        EXPECT_EQ(x, y);
      }
    }
  }
  ForceSimdTarget("");
}

// Straight transcription of the llama.cpp recipe (rope_cache_init + rotate)
// with the layout spelled out explicitly, as an independent check.
void RopeLlamaCpp(float* x, int n_heads, int head_dim, int pos, const RopeParams& p) {
  const float theta_scale = powf(p.freq_base, -2.0f / p.n_dims);
  std::vector<float> cache(head_dim);
  float theta = static_cast<float>(pos);
  for (int i0 = 0; i0 < head_dim; i0 += 2) {
    const float ff = (p.freq_factors && i0 < p.n_dims) ? p.freq_factors[i0 / 2] : 1.0f;
    const float t = p.freq_scale * (theta / ff);
    cache[i0] = cosf(t);
    cache[i0 + 1] = sinf(t);
    theta *= theta_scale;
  }
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    for (int i0 = 0; i0 < p.n_dims; i0 += 2) {
      const int a = p.neox ? i0 / 2 : i0;
      const int b = p.neox ? i0 / 2 + p.n_dims / 2 : i0 + 1;
      const float x0 = v[a], x1 = v[b];
      v[a] = x0 * cache[i0] - x1 * cache[i0 + 1];
      v[b] = x0 * cache[i0 + 1] + x1 * cache[i0];
    }
  }
}

TEST(RopeTest, MatchesLlamaCppRecipeBitExact) {
  const int n_heads = 3, head_dim = 64;
  std::vector<float> ff(16);
  for (int i = 0; i < 16; ++i) ff[i] = 1.0f + 0.5f * i;
  for (bool neox : {false, true}) {
    for (int n_dims : {64, 32}) {
      for (const float* factors : {static_cast<const float*>(nullptr), static_cast<const float*>(ff.data())}) {
        if (factors && n_dims != 32) continue;
        for (int pos : {0, 1, 7, 1000, 32767}) {
          RopeParams p{n_dims, 500000.0f, 0.5f, factors, neox};
          auto a = RandomVec(n_heads * head_dim, 10 + pos);
          auto b = a;
          Rope(a.data(), n_heads, head_dim, pos, p);
          RopeLlamaCpp(b.data(), n_heads, head_dim, pos, p);
          for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "i=" << i << " neox=" << neox;
        }
      }
    }
  }
}

TEST(RopeTest, PositionZeroIsIdentityAndNormsPreserved) {
  RopeParams p{16};
  auto x = RandomVec(2 * 16, 5);
  auto y = x;
  Rope(y.data(), 2, 16, 0, p);
  EXPECT_EQ(x, y);
  Rope(y.data(), 2, 16, 123, p);
  for (int i = 0; i < 16; i += 2) {
    EXPECT_NEAR(std::hypot(x[i], x[i + 1]), std::hypot(y[i], y[i + 1]), 1e-5);
  }
}

TEST(RopeTest, PairLayoutsAndAngles) {
  // head_dim 8, n_dims 4: dims 4..7 untouched. Pair 0 angle = pos, pair 1
  // angle = pos * base^(-2/4).
  const int pos = 3;
  RopeParams p{4, 100.0f};
  std::vector<float> x = {1, 0, 1, 0, 9, 9, 9, 9};
  Rope(x.data(), 1, 8, pos, p);
  const float a1 = pos * std::pow(100.0f, -0.5f);
  EXPECT_NEAR(x[0], std::cos(3.0f), 1e-6);
  EXPECT_NEAR(x[1], std::sin(3.0f), 1e-6);
  EXPECT_NEAR(x[2], std::cos(a1), 1e-6);
  EXPECT_NEAR(x[3], std::sin(a1), 1e-6);
  for (int i = 4; i < 8; ++i) EXPECT_EQ(x[i], 9.0f);

  p.neox = true;  // pairs (0,2) and (1,3)
  std::vector<float> y = {1, 1, 0, 0, 9, 9, 9, 9};
  Rope(y.data(), 1, 8, pos, p);
  EXPECT_NEAR(y[0], std::cos(3.0f), 1e-6);
  EXPECT_NEAR(y[2], std::sin(3.0f), 1e-6);
  EXPECT_NEAR(y[1], std::cos(a1), 1e-6);
  EXPECT_NEAR(y[3], std::sin(a1), 1e-6);
}

}  // namespace
}  // namespace kvx::ops
