// Full-precision codecs (f32, f16), codec names and sizes, and the scalar
// quantization primitives (quant.h). Quantized codecs: quant_codec_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kv/codec/codecs.h"
#include "kv/codec/hadamard.h"
#include "kv/kv_test_util.h"

namespace kvx::kv {
namespace {

CodecParams Params(int T, int d) {
  CodecParams p;
  p.page_tokens = T;
  p.head_dim = d;
  return p;
}

TEST(CodecTest, NamesRoundTrip) {
  for (CodecId id : kAllCodecs) EXPECT_EQ(ParseCodecName(CodecName(id)), id);
  EXPECT_FALSE(ParseCodecName("int3").has_value());
  EXPECT_FALSE(ParseCodecName("q8_0").has_value());
}

TEST(CodecTest, PageBytes) {
  // 16 positions = 64 bytes header; f32: 2*16*64*4 = 8192; f16: 4096.
  EXPECT_EQ(CodecPageBytes(CodecId::kF32, Params(16, 64)), 64u + 8192u);
  EXPECT_EQ(CodecPageBytes(CodecId::kF16, Params(16, 64)), 64u + 4096u);
  // Odd sizes round up to 64 bytes.
  EXPECT_EQ(CodecPageBytes(CodecId::kF16, Params(1, 3)) % kPageAlign, 0u);
  EXPECT_GE(CodecPageBytes(CodecId::kF16, Params(1, 3)), 64u + 12u);
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

// The vector float -> half conversion the f16 codec appends with gives the
// bits of the scalar FloatToFp16 for every input class: normals across the
// whole exponent range (ties included), subnormals, zero, the overflow
// boundary, infinities and NaNs with any payload, in any slot of a group.
TEST(CodecTest, FloatToHalfMatchesFloatToFp16) {
  if (!simd::UseSimd(8)) GTEST_SKIP() << "no AVX2/F16C on this CPU";
  std::vector<float> x;
  std::mt19937 rng(3);
  for (uint32_t e = 90; e < 160; ++e) {  // 2^-37 .. 2^32
    for (int i = 0; i < 64; ++i) {
      uint32_t bits = (e << 23) | (rng() & 0x7FFFFFu);
      if (i % 4 == 0) bits = (bits & ~0x1FFFu) | 0x1000u;  // exactly halfway between two halves
      if (i % 2 == 1) bits |= 0x80000000u;
      x.push_back(BitsToFloat(bits));
    }
  }
  for (float f : {0.0f, -0.0f, 65504.0f, 65519.0f, 65520.0f, 1e9f, 5.96e-8f, 2.98e-8f, 2.99e-8f, 6.1e-5f}) {
    x.push_back(f);
    x.push_back(-f);
  }
  // Infinities and NaNs, all inside whole vector groups.
  for (uint32_t bits : {0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x7F800001u, 0xFFFFFFFFu, 0x7FA5A5A5u, 0xFFA5A5A5u}) {
    x.insert(x.begin() + 3, BitsToFloat(bits));
  }
  x.resize(x.size() + 5, 1.0f);  // a tail shorter than a vector
  std::vector<uint16_t> got(x.size());
  simd::FloatToHalf(x.data(), static_cast<int>(x.size()), got.data());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], FloatToFp16(x[i])) << i << ": " << x[i];
}

template <typename C>
void RoundTrip(float tolerance_rel) {
  const int T = 8, D = 24;
  const CodecParams prm = Params(T, D);
  std::vector<uint8_t> page(PageBytesFor<C>(prm));
  uint8_t* data = page.data() + PageDataOffset(T);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> ks(T * D), vs(T * D);
  for (auto& x : ks) x = nd(rng);
  for (auto& x : vs) x = nd(rng);
  for (int s = 0; s < T; ++s) C::EncodeRow(prm, data, s, &ks[s * D], &vs[s * D]);
  std::vector<float> k(T * D), v(T * D);
  C::DecodeKeys(prm, data, T, k.data());
  C::DecodeValues(prm, data, T, v.data());
  for (int i = 0; i < T * D; ++i) {
    EXPECT_NEAR(k[i], ks[i], tolerance_rel * std::fabs(ks[i]) + 1e-7f);
    EXPECT_NEAR(v[i], vs[i], tolerance_rel * std::fabs(vs[i]) + 1e-7f);
    if (tolerance_rel > 0) {
      EXPECT_EQ(FloatToBits(k[i]), FloatToBits(Fp16ToFloat(FloatToFp16(ks[i]))));
    }
  }
  // EncodePage writes the same bytes as row-by-row encoding.
  std::vector<uint8_t> page2(page.size());
  C::EncodePage(prm, page2.data() + PageDataOffset(T), T, ks.data(), vs.data());
  EXPECT_TRUE(std::equal(page.begin() + PageDataOffset(T), page.end(), page2.begin() + PageDataOffset(T)));

  // The inner loops agree with decode + plain math, for several query rows.
  const int nq = 3;
  std::vector<float> q(nq * D), p(nq * T), scores(nq * T), acc(nq * D, 0.0f);
  for (auto& x : q) x = nd(rng);
  for (int i = 0; i < nq * T; ++i) p[i] = static_cast<float>(i % T) / T;
  C::Scores(prm, data, T - 1, q.data(), nq, scores.data(), T);
  C::AccumulateValues(prm, data, T, p.data(), nq, T, acc.data());
  for (int r = 0; r < nq; ++r) {
    std::vector<double> ref_acc(D, 0.0);
    for (int s = 0; s < T; ++s) {
      double dot = 0;
      for (int c = 0; c < D; ++c) dot += static_cast<double>(q[r * D + c]) * k[s * D + c], ref_acc[c] += p[r * T + s] * v[s * D + c];
      if (s < T - 1) {
        EXPECT_NEAR(scores[r * T + s], dot, 1e-4 * (1 + std::fabs(dot)));
      }
    }
    for (int c = 0; c < D; ++c) EXPECT_NEAR(acc[r * D + c], ref_acc[c], 1e-4 * (1 + std::fabs(ref_acc[c])));
  }
}

TEST(CodecTest, F32RoundTripIsExact) { RoundTrip<F32Codec>(0.0f); }
TEST(CodecTest, F16RoundTripIsRoundToNearestEven) { RoundTrip<F16Codec>(1.0f / 1024); }

// The dispatched loops agree with the scalar ones on every SIMD path (AVX-512
// when the CPU has it, and AVX2 forced), for 1..8 query rows and row counts
// that exercise each multi-row block size and the single-row tail, on pages
// of T entries (the f16 keys are stored channel-major, so T is their stride).
template <typename C>
void SimdMatchesScalar(int d, int T = 16) {
  const CodecParams prm = Params(T, d);
  std::vector<uint8_t> page(PageBytesFor<C>(prm));
  uint8_t* data = page.data() + PageDataOffset(T);
  std::mt19937 rng(d);
  std::normal_distribution<float> nd;
  std::vector<float> k(d), v(d), q(8 * d), p(8 * T);
  for (int s = 0; s < T; ++s) {
    for (int c = 0; c < d; ++c) k[c] = nd(rng), v[c] = nd(rng);
    C::EncodeRow(prm, data, s, k.data(), v.data());
  }
  for (auto& x : p) x = std::fabs(nd(rng));
  for (auto& x : q) x = nd(rng);
  std::vector<float> dec_ref(static_cast<size_t>(T) * d), dec(dec_ref.size());
  {
    testing::ScopedKernelPath scalar(testing::KernelPath::kScalar);
    C::DecodeKeys(prm, data, T, dec_ref.data());
  }
  for (testing::KernelPath path : {testing::KernelPath::kBest, testing::KernelPath::kAvx2}) {
    SCOPED_TRACE(testing::Name(path));
    {
      testing::ScopedKernelPath force(path);
      C::DecodeKeys(prm, data, T, dec.data());
    }
    for (size_t i = 0; i < dec.size(); ++i) ASSERT_EQ(dec[i], dec_ref[i]) << d << " " << i;
    for (int nq = 1; nq <= 8; ++nq) {
      for (int n : {1, 2, 3, 5, 7, 12, 15, 16, 17, 31, 32, 33, 63, 64}) {
        if (n > T) continue;
        SCOPED_TRACE("T " + std::to_string(T));
        std::vector<float> s1(nq * T), s2(nq * T), a1(nq * d, 0.5f), a2(nq * d, 0.5f);
        {
          testing::ScopedKernelPath force(path);
          C::Scores(prm, data, n, q.data(), nq, s1.data(), T);
          C::AccumulateValues(prm, data, n, p.data(), nq, T, a1.data());
        }
        {
          testing::ScopedKernelPath scalar(testing::KernelPath::kScalar);
          C::Scores(prm, data, n, q.data(), nq, s2.data(), T);
          C::AccumulateValues(prm, data, n, p.data(), nq, T, a2.data());
        }
        for (int r = 0; r < nq; ++r) {
          for (int j = 0; j < n; ++j) {
            ASSERT_NEAR(s1[r * T + j], s2[r * T + j], 1e-5f * (1 + std::fabs(s2[r * T + j])))
                << d << " nq " << nq << " n " << n << " r " << r << " j " << j;
          }
        }
        for (int i = 0; i < nq * d; ++i) {
          ASSERT_NEAR(a1[i], a2[i], 1e-5f * (1 + std::fabs(a2[i]))) << d << " nq " << nq << " n " << n << " " << i;
        }
      }
    }
  }
}

TEST(CodecTest, SimdMatchesScalar) {
  // 8, 24, 7: AVX2 only (or scalar); 16, 32, 48, 64, 80, 128: AVX-512 blocks
  // of 1, 2, 3, 4, 5 and 8 zmm per row.
  for (int d : {8, 16, 24, 32, 48, 64, 80, 128, 7}) {
    SimdMatchesScalar<F32Codec>(d);
    SimdMatchesScalar<F16Codec>(d);
  }
  // Page sizes below, at and above one AVX-512 block of entries (the f16
  // keys' channel stride; 1-2 query rows take two blocks at a time at 64).
  for (int T : {1, 2, 4, 8, 32, 64}) {
    for (int d : {8, 64, 7}) SimdMatchesScalar<F16Codec>(d, T);
  }
}

#ifdef KVX_KV_HAVE_X86_SIMD
// The AVX-512 kernels run exactly when the CPU has them, the source's shape
// allows 16-wide blocks and no test hook forces another path (so the
// SIMD-vs-scalar tests above cover both SIMD paths on AVX-512 machines).
TEST(CodecTest, Avx512DispatchFollowsCpuShapeAndHooks) {
  const uint16_t h[64] = {};
  const simd::F16Rows rows64{h, 64}, rows24{h, 24};
  EXPECT_EQ(simd::UseAvx512For(rows64), simd::HasAvx512());
  EXPECT_FALSE(simd::UseAvx512For(rows24));
  const float params[8] = {};
  const uint8_t codes[64] = {};
  EXPECT_EQ(simd::UseAvx512For(simd::TokenRows<4>{codes, params, 32, 2, 5}), simd::HasAvx512());
  EXPECT_FALSE(simd::UseAvx512For(simd::TokenRows<4>{codes, params, 32, 8, 3}));  // groups of 8 channels
  {
    testing::ScopedKernelPath force(testing::KernelPath::kAvx2);
    EXPECT_FALSE(simd::UseAvx512For(rows64));
    EXPECT_EQ(simd::UseSimd(64), simd::HasAvx2Fma());
  }
  EXPECT_EQ(simd::UseAvx512For(rows64), simd::HasAvx512());
  RecordProperty("avx512", simd::HasAvx512() ? "yes" : "no");
}
#endif

TEST(QuantTest, PlanarPackingRoundTrips) {
  std::mt19937 rng(3);
  for (int bits : {2, 4, 8}) {
    for (int d : {8, 16, 24, 64, 96, 128}) {
      std::vector<uint8_t> codes(d), row(quant::RowBytes(d, bits));
      for (auto& c : codes) c = static_cast<uint8_t>(rng() & quant::Levels(bits));
      quant::PackRow(codes.data(), d, bits, row.data());
      for (int c = 0; c < d; ++c) ASSERT_EQ(quant::CodeAt(row.data(), d, bits, c), codes[c]) << bits << " " << d;
    }
  }
}

TEST(QuantTest, AffineQuantizerErrorBound) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-50.0f, 50.0f);
  for (int bits : {2, 4, 8}) {
    for (int trial = 0; trial < 2000; ++trial) {
      float lo = u(rng), hi = u(rng);
      if (trial % 97 == 0) hi = lo;  // constant group
      if (lo > hi) std::swap(lo, hi);
      uint16_t st[2];
      float s, m;
      quant::ChooseAffine(lo, hi, bits, st, &s, &m);
      EXPECT_EQ(s, HalfToFloatFast(st[0]));
      EXPECT_EQ(m, HalfToFloatFast(st[1]));
      EXPECT_GE(m + s * quant::Levels(bits), hi);  // the range stays covered
      // |x - x^| <= s/2 + |lo - m| for every x in [lo, hi].
      const float bound = 0.5f * s + std::fabs(lo - m) + 1e-6f * (std::fabs(lo) + std::fabs(hi));
      for (int i = 0; i <= 20; ++i) {
        const float x = lo + (hi - lo) * static_cast<float>(i) / 20;
        const float back = quant::Dequant(st, quant::QuantizeOne(x, s, m, bits));
        ASSERT_LE(std::fabs(back - x), bound) << bits << " [" << lo << ", " << hi << "] x=" << x;
      }
      // The scale is within one f16 ulp (plus widening) of the ideal one.
      EXPECT_LE(s, std::max(0.0f, hi - m) / quant::Levels(bits) * 1.002f + 1e-7f);
    }
  }
}

TEST(QuantTest, SymmetricMatchesLlamaCppRules) {
  uint16_t st[1];
  float s, m;
  // q4_0: the signed largest value maps exactly to code 0 (x^ = s (0 - 8)).
  quant::ChooseSymmetric(-3.0f, 4, st, &s, &m);
  EXPECT_FLOAT_EQ(s, HalfToFloatFast(FloatToFp16(3.0f / 8)));
  EXPECT_EQ(quant::QuantizeOne(-3.0f, s, m, 4), 0);
  EXPECT_FLOAT_EQ(m + s * 0, -3.0f);
  quant::ChooseSymmetric(3.0f, 4, st, &s, &m);  // positive max: negative scale
  EXPECT_LT(s, 0.0f);
  EXPECT_EQ(quant::QuantizeOne(3.0f, s, m, 4), 0);
  EXPECT_FLOAT_EQ(m, 3.0f);
  // q8_0: absmax / 127, symmetric codes.
  quant::ChooseSymmetric(-2.54f, 8, st, &s, &m);
  EXPECT_NEAR(s, 0.02f, 1e-5);
  EXPECT_EQ(quant::QuantizeOne(2.54f, s, m, 8), 128 + 127);
  EXPECT_EQ(quant::QuantizeOne(-2.54f, s, m, 8), 128 - 127);
}

TEST(HadamardTest, OrthogonalAndInvertible) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (int d : {8, 16, 64, 96, 128, 80}) {
    HadamardRotation rot(d);
    EXPECT_EQ(d % rot.block(), 0);
    EXPECT_EQ(rot.block() & (rot.block() - 1), 0);
    std::vector<float> a(d), b(d), x(d);
    for (auto* v : {&a, &b}) for (auto& e : *v) e = nd(rng);
    double dot = 0, norm = 0;
    for (int c = 0; c < d; ++c) dot += a[c] * b[c], norm += a[c] * a[c];
    std::vector<float> ra = a, rb = b;
    rot.Forward(ra.data());
    rot.Forward(rb.data());
    double rdot = 0, rnorm = 0;
    for (int c = 0; c < d; ++c) rdot += ra[c] * rb[c], rnorm += ra[c] * ra[c];
    EXPECT_NEAR(rdot, dot, 1e-4 * (1 + std::fabs(dot)));  // (Qa).(Qb) = a.b
    EXPECT_NEAR(rnorm, norm, 1e-4 * norm);
    rot.Inverse(ra.data());
    for (int c = 0; c < d; ++c) EXPECT_NEAR(ra[c], a[c], 1e-5);
  }
  // A single large channel is spread over the whole block.
  HadamardRotation rot(64);
  std::vector<float> spike(64, 0.0f);
  spike[3] = 8.0f;
  rot.Forward(spike.data());
  for (float x : spike) EXPECT_NEAR(std::fabs(x), 1.0f, 1e-6);
}

}  // namespace
}  // namespace kvx::kv
