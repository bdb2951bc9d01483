#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kv/codec/codecs.h"

namespace kvx::kv {
namespace {

TEST(CodecTest, NamesRoundTrip) {
  for (CodecId id : kAllCodecs) EXPECT_EQ(ParseCodecName(CodecName(id)), id);
  EXPECT_FALSE(ParseCodecName("int8").has_value());
}

TEST(CodecTest, PageBytes) {
  // 16 positions = 64 bytes header; f32: 2*16*64*4 = 8192; f16: 4096.
  EXPECT_EQ(CodecPageBytes(CodecId::kF32, 16, 64), 64u + 8192u);
  EXPECT_EQ(CodecPageBytes(CodecId::kF16, 16, 64), 64u + 4096u);
  // Odd sizes round up to 64 bytes.
  EXPECT_EQ(CodecPageBytes(CodecId::kF16, 1, 3) % kPageAlign, 0u);
  EXPECT_GE(CodecPageBytes(CodecId::kF16, 1, 3), 64u + 12u);
}

TEST(CodecTest, HalfToFloatFastMatchesReferenceForAllBits) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float a = HalfToFloatFast(static_cast<uint16_t>(h));
    const float b = Fp16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(b)) {
      ASSERT_TRUE(std::isnan(a)) << h;
    } else {
      ASSERT_EQ(FloatToBits(a), FloatToBits(b)) << h;
    }
  }
}

template <typename C>
void RoundTrip(float tolerance_rel) {
  const int T = 8, D = 24;
  std::vector<uint8_t> page(PageBytesFor<C>(T, D));
  uint8_t* data = page.data() + PageDataOffset(T);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<std::vector<float>> ks(T, std::vector<float>(D)), vs(T, std::vector<float>(D));
  for (int s = 0; s < T; ++s) {
    for (int c = 0; c < D; ++c) ks[s][c] = nd(rng), vs[s][c] = nd(rng);
    C::Encode(data, T, D, s, ks[s].data(), vs[s].data());
  }
  std::vector<float> k(D), v(D), q(D), scores(T), acc(D, 0.0f), p(T);
  for (int s = 0; s < T; ++s) {
    C::Decode(data, T, D, s, k.data(), v.data());
    for (int c = 0; c < D; ++c) {
      EXPECT_NEAR(k[c], ks[s][c], tolerance_rel * std::fabs(ks[s][c]) + 1e-7f);
      EXPECT_NEAR(v[c], vs[s][c], tolerance_rel * std::fabs(vs[s][c]) + 1e-7f);
      if (tolerance_rel > 0) {
        EXPECT_EQ(FloatToBits(k[c]), FloatToBits(Fp16ToFloat(FloatToFp16(ks[s][c]))));
      }
    }
  }
  // The inner loops agree with decode + plain math.
  for (int c = 0; c < D; ++c) q[c] = nd(rng);
  for (int s = 0; s < T; ++s) p[s] = static_cast<float>(s) / T;
  C::Scores(data, T, D, T - 1, q.data(), scores.data());
  C::AccumulateValues(data, T, D, T, p.data(), acc.data());
  std::vector<double> ref_acc(D, 0.0);
  for (int s = 0; s < T; ++s) {
    C::Decode(data, T, D, s, k.data(), v.data());
    double dot = 0;
    for (int c = 0; c < D; ++c) dot += static_cast<double>(q[c]) * k[c], ref_acc[c] += p[s] * v[c];
    if (s < T - 1) {
      EXPECT_NEAR(scores[s], dot, 1e-4 * (1 + std::fabs(dot)));
    }
  }
  for (int c = 0; c < D; ++c) EXPECT_NEAR(acc[c], ref_acc[c], 1e-4 * (1 + std::fabs(ref_acc[c])));
}

// The dispatched (SIMD when available) loops agree with the scalar ones.
template <typename C>
void SimdMatchesScalar(int d) {
  const int T = 16;
  std::vector<uint8_t> page(PageBytesFor<C>(T, d));
  uint8_t* data = page.data() + PageDataOffset(T);
  std::mt19937 rng(d);
  std::normal_distribution<float> nd;
  std::vector<float> k(d), v(d), q(d), p(T);
  for (int s = 0; s < T; ++s) {
    for (int c = 0; c < d; ++c) k[c] = nd(rng), v[c] = nd(rng);
    C::Encode(data, T, d, s, k.data(), v.data());
    p[s] = std::fabs(nd(rng));
  }
  for (auto& x : q) x = nd(rng);
  for (int n : {1, 5, 16}) {
    std::vector<float> s1(T), s2(T), a1(d, 0.5f), a2(d, 0.5f);
    C::Scores(data, T, d, n, q.data(), s1.data());
    C::ScoresScalar(data, T, d, n, q.data(), s2.data());
    C::AccumulateValues(data, T, d, n, p.data(), a1.data());
    C::AccumulateValuesScalar(data, T, d, n, p.data(), a2.data());
    for (int j = 0; j < n; ++j) EXPECT_NEAR(s1[j], s2[j], 1e-5f * (1 + std::fabs(s2[j]))) << d << " " << j;
    for (int c = 0; c < d; ++c) EXPECT_NEAR(a1[c], a2[c], 1e-5f * (1 + std::fabs(a2[c]))) << d << " " << c;
  }
}

TEST(CodecTest, SimdMatchesScalar) {
  for (int d : {8, 16, 24, 64, 128, 7}) {
    SimdMatchesScalar<F32Codec>(d);
    SimdMatchesScalar<F16Codec>(d);
  }
}

TEST(CodecTest, F32RoundTripIsExact) { RoundTrip<F32Codec>(0.0f); }
TEST(CodecTest, F16RoundTripIsRoundToNearestEven) { RoundTrip<F16Codec>(1.0f / 1024); }

}  // namespace
}  // namespace kvx::kv
