// Quantized page codecs (int8/int4/int2 per token, KIVI, outliers): round-trip
// error bounds, the attention loops against decode + plain math, SIMD against
// scalar, and exact page sizes.
#include "kv/codec/quant_codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kv/codec/codecs.h"
#include "kv/kv_test_util.h"

namespace kvx::kv {
namespace {

struct Config {
  bool kivi;
  int k_bits, v_bits, d, T, group;
  int outliers;
  bool sym = false;
};

std::string Name(const Config& c) {
  return std::string(c.kivi ? "kivi" : "tok") + "_k" + std::to_string(c.k_bits) + "v" + std::to_string(c.v_bits) +
         "_d" + std::to_string(c.d) + "_T" + std::to_string(c.T) + "_g" + std::to_string(c.group) + "_o" +
         std::to_string(c.outliers) + (c.sym ? "_sym" : "");
}

CodecParams ParamsOf(const Config& c) {
  CodecParams p;
  p.page_tokens = c.T;
  p.head_dim = c.d;
  p.k_bits = c.k_bits;
  p.v_bits = c.v_bits;
  p.group = c.group;
  p.outliers = c.outliers;
  p.sym = c.sym;
  return p;
}

// Keys like a real model's: a few channels with large magnitude and offset
// (KIVI's observation), plus rare spikes; values Gaussian.
void MakeData(int T, int d, uint32_t seed, std::vector<float>* k, std::vector<float>* v) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  k->resize(static_cast<size_t>(T) * d);
  v->resize(k->size());
  for (int j = 0; j < T; ++j) {
    for (int c = 0; c < d; ++c) {
      float x = nd(rng);
      if (c % 16 == 3) x = 12.0f + 6.0f * x;  // outlier channel
      if (rng() % 97 == 0) x *= 15.0f;        // spike
      (*k)[static_cast<size_t>(j) * d + c] = x;
      (*v)[static_cast<size_t>(j) * d + c] = nd(rng);
    }
  }
}

template <class C>
std::vector<uint8_t> Encode(const CodecParams& p, const std::vector<float>& k, const std::vector<float>& v) {
  std::vector<uint8_t> data(C::DataBytes(p), 0xCD);
  C::EncodePage(p, data.data(), p.page_tokens, k.data(), v.data());
  return data;
}

// Max |x - x^| allowed for the entries of one quantization group:
// asymmetric s/2 with s = (hi - lo) / (2^b - 1); symmetric 8-bit s/2 with
// s = absmax / 127; symmetric 4/2-bit (q4_0 rule) s with s = absmax / 2^(b-1).
float GroupBound(const float* x, int n, int stride, int bits, bool sym = false) {
  float lo = INFINITY, hi = -INFINITY;
  for (int i = 0; i < n; ++i) lo = std::min(lo, x[i * stride]), hi = std::max(hi, x[i * stride]);
  const float absmax = std::max(std::fabs(lo), std::fabs(hi));
  float err = 0.5f * (hi - lo) / quant::Levels(bits);
  if (sym) err = bits == 8 ? 0.5f * absmax / 127 : absmax / quant::SymZero(bits);
  return err * 1.002f + 1e-3f * absmax + 1e-6f;
}

class QuantCodecTest : public ::testing::TestWithParam<Config> {
 protected:
  template <class C>
  void CheckAll() {
    const Config c = GetParam();
    const CodecParams p = ParamsOf(c);
    const int T = c.T, d = c.d;
    std::vector<float> k, v;
    MakeData(T, d, static_cast<uint32_t>(d * 7 + T + c.k_bits), &k, &v);
    const std::vector<uint8_t> data = Encode<C>(p, k, v);
    std::vector<float> kd(k.size()), vd(v.size());
    C::DecodeKeys(p, data.data(), T, kd.data());
    C::DecodeValues(p, data.data(), T, vd.data());

    // 0. The SIMD decoders (AVX-512 when available, AVX2) agree with the scalar one.
    for (testing::KernelPath path : {testing::KernelPath::kAvx2, testing::KernelPath::kScalar}) {
      std::vector<float> ks(k.size()), vs(v.size());
      {
        testing::ScopedKernelPath force(path);
        C::DecodeKeys(p, data.data(), T, ks.data());
        C::DecodeValues(p, data.data(), T, vs.data());
      }
      for (size_t i = 0; i < k.size(); ++i) {
        ASSERT_NEAR(ks[i], kd[i], 1e-6f * (1 + std::fabs(ks[i]))) << testing::Name(path) << " " << i;
        ASSERT_NEAR(vs[i], vd[i], 1e-6f * (1 + std::fabs(vs[i]))) << testing::Name(path) << " " << i;
      }
    }
    // 1. Round trip within the quantizer's bound, group by group (the bound
    // uses the full range, which outlier removal can only shrink).
    for (int j = 0; j < T; ++j) {
      for (int c0 = 0; c0 < d; c0 += c.group) {
        const size_t at = static_cast<size_t>(j) * d + c0;
        const float vb = GroupBound(&v[at], c.group, 1, c.v_bits, c.sym);
        for (int x = 0; x < c.group; ++x) ASSERT_LE(std::fabs(vd[at + x] - v[at + x]), vb) << "V " << j << "," << c0 + x;
        if (!c.kivi) {
          const float kb = GroupBound(&k[at], c.group, 1, c.k_bits, c.sym);
          for (int x = 0; x < c.group; ++x) ASSERT_LE(std::fabs(kd[at + x] - k[at + x]), kb) << "K " << j << "," << c0 + x;
        }
      }
    }
    if (c.kivi) {  // keys per channel over the page
      for (int ch = 0; ch < d; ++ch) {
        const float kb = GroupBound(&k[ch], T, d, c.k_bits);
        for (int j = 0; j < T; ++j) {
          ASSERT_LE(std::fabs(kd[static_cast<size_t>(j) * d + ch] - k[static_cast<size_t>(j) * d + ch]), kb) << ch;
        }
      }
    }
    // 2. Outliers come back exactly (f32 side storage).
    if (c.outliers > 0) {
      const auto layout = C::LayoutOf(p);
      for (size_t off : {layout.k_out, layout.v_out}) {
        const quant::OutlierList o = quant::ReadOutliers(data.data() + off, c.outliers, T, d);
        const std::vector<float>& src = off == layout.k_out ? k : v;
        const std::vector<float>& dec = off == layout.k_out ? kd : vd;
        for (int i = 0; i < o.n; ++i) {
          if (i > 0) {
            ASSERT_LT(o.Index(i - 1), o.Index(i));
          }
          ASSERT_EQ(o.value[i], src[o.Index(i)]);
          ASSERT_EQ(dec[o.Index(i)], src[o.Index(i)]);
        }
      }
    }
    // 3. The attention loops equal decode + plain math, for 1..8 query rows,
    //    on every kernel path (AVX-512 when available, AVX2, scalar), for row
    //    counts that hit each multi-row block size and the tails.
    std::mt19937 rng(5);
    std::normal_distribution<float> nd;
    std::vector<float> q(8 * d), w(8 * T);
    for (auto& x : q) x = nd(rng);
    for (auto& x : w) x = std::fabs(nd(rng));
    for (testing::KernelPath path : testing::kAllKernelPaths) {
      testing::ScopedKernelPath force(path);
      const char* path_name = testing::Name(path);
      for (int nq = 1; nq <= 8; ++nq) {
        for (int n : {T, T - 1, std::max(1, T / 3)}) {
          std::vector<float> s(nq * T), acc(nq * d, 0.25f);
          C::Scores(p, data.data(), n, q.data(), nq, s.data(), T);
          C::AccumulateValues(p, data.data(), n, w.data(), nq, T, acc.data());
          for (int r = 0; r < nq; ++r) {
            for (int j = 0; j < n; ++j) {
              double dot = 0, mag = 0;
              for (int x = 0; x < d; ++x) {
                dot += static_cast<double>(q[r * d + x]) * kd[static_cast<size_t>(j) * d + x];
                mag += std::fabs(q[r * d + x] * kd[static_cast<size_t>(j) * d + x]);
              }
              ASSERT_NEAR(s[r * T + j], dot, 2e-6 * (1 + mag)) << "path " << path_name << " r " << r << " j " << j;
            }
            for (int x = 0; x < d; ++x) {
              double ref = 0.25, mag = 0.25;
              for (int j = 0; j < n; ++j) {
                ref += static_cast<double>(w[r * T + j]) * vd[static_cast<size_t>(j) * d + x];
                mag += std::fabs(w[r * T + j] * vd[static_cast<size_t>(j) * d + x]);
              }
              ASSERT_NEAR(acc[r * d + x], ref, 2e-6 * (1 + mag)) << "path " << path_name << " r " << r << " c " << x;
            }
          }
        }
      }
    }
  }
};

TEST_P(QuantCodecTest, RoundTripOutliersAndLoops) {
  if (GetParam().kivi) {
    CheckAll<KiviCodec>();
  } else {
    CheckAll<TokenQuantCodec>();
  }
}

std::vector<Config> Configs() {
  std::vector<Config> out;
  for (bool kivi : {false, true}) {
    for (auto [kb, vb] : {std::pair{8, 8}, {4, 4}, {2, 2}, {8, 4}, {4, 2}}) {
      for (int d : {8, 16, 32, 64, 128}) {
        for (int group : {8, 16, 32, 64}) {
          if (group > d) continue;
          for (int outliers : {0, 1}) {
            const int T = kivi ? 32 : 16;
            out.push_back({kivi, kb, vb, d, T, group, outliers ? std::max(1, T * d / 50) : 0});
            if (group == 32 && !outliers) out.push_back({kivi, kb, vb, d, T, group, 0, true});
          }
        }
      }
      // KIVI keys are channel-major, packed along the page: pages whose
      // columns are shorter than one SIMD block (scalar path), exactly one
      // AVX2 block, and several AVX-512 blocks per plane.
      if (kivi) {
        for (int T : {8, 128}) out.push_back({kivi, kb, vb, 64, T, 32, 0});
      }
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(All, QuantCodecTest, ::testing::ValuesIn(Configs()),
                         [](const auto& info) { return Name(info.param); });

TEST(QuantCodecTest2, RowWiseEncodingEqualsPageEncoding) {
  const Config c{false, 4, 8, 64, 16, 32, 0};
  const CodecParams p = ParamsOf(c);
  std::vector<float> k, v;
  MakeData(c.T, c.d, 9, &k, &v);
  const std::vector<uint8_t> whole = Encode<TokenQuantCodec>(p, k, v);
  std::vector<uint8_t> rows(whole.size(), 0xCD);
  for (int j = 0; j < c.T; ++j) TokenQuantCodec::EncodeRow(p, rows.data(), j, &k[j * c.d], &v[j * c.d]);
  EXPECT_EQ(whole, rows);
}

TEST(QuantCodecTest2, OutliersShrinkTheError) {
  for (bool kivi : {false, true}) {
    Config c{kivi, 2, 2, 64, 32, 32, 0};
    std::vector<float> k, v;
    MakeData(c.T, c.d, 21, &k, &v);
    double err[2];
    for (int with : {0, 1}) {
      c.outliers = with ? c.T * c.d / 50 : 0;
      const CodecParams p = ParamsOf(c);
      std::vector<float> kd(k.size());
      if (kivi) {
        KiviCodec::DecodeKeys(p, Encode<KiviCodec>(p, k, v).data(), c.T, kd.data());
      } else {
        TokenQuantCodec::DecodeKeys(p, Encode<TokenQuantCodec>(p, k, v).data(), c.T, kd.data());
      }
      err[with] = 0;
      for (size_t i = 0; i < k.size(); ++i) err[with] += std::fabs(kd[i] - k[i]);
    }
    EXPECT_LT(err[1], 0.8 * err[0]) << "kivi " << kivi;
  }
}

TEST(QuantCodecTest2, ExactPageBytes) {
  CodecParams p;
  p.page_tokens = 16;
  p.head_dim = 64;
  p.group = 32;
  // int8: codes 16*64 + params 16*2*4 per tensor = 1152; x2 = 2304 + 64 header.
  p.k_bits = p.v_bits = 8;
  EXPECT_EQ(CodecPageBytes(CodecId::kInt8, p), 64u + 2304u);
  // int4: (512 + 128) x2 = 1280 + 64 = 1344 -> 84 bytes per token (4 of them position).
  p.k_bits = p.v_bits = 4;
  EXPECT_EQ(CodecPageBytes(CodecId::kInt4, p), 1344u);
  // kivi2 on 128-token pages, value groups of 64: K 128*16 + 64*4, V 128*16 + 128*1*4.
  p.page_tokens = 128;
  p.k_bits = p.v_bits = 2;
  p.group = 64;
  EXPECT_EQ(CodecPageBytes(CodecId::kKivi2, p), 512u + 2048 + 256 + 2048 + 512);
  // sym: scales only, 2 bytes less per group (V: 128 rows x 1 group).
  p.sym = true;
  EXPECT_EQ(CodecPageBytes(CodecId::kKivi2, p), 512u + 2048 + 256 + 2048 + 256);
  p.sym = false;
  // 1% outliers: 82 entries per tensor, f32 value + u16 index, rounded to 8 bytes.
  p.outliers = 82;
  EXPECT_EQ(CodecPageBytes(CodecId::kKivi2, p), AlignUp(512u + 2048 + 256 + 2048 + 512 + 2 * 496, 64));
}

}  // namespace
}  // namespace kvx::kv
