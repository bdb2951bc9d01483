#include "kv/tier/storage_transform.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kv/codec/codecs.h"
#include "kv/kv_test_util.h"
#include "kv/tier/tier_test_util.h"
#include "util/fp16.h"

namespace kvx::kv::tier {
namespace {

// Tokens of `dim` channels driven by 4 latent factors of decreasing scale
// plus a little noise, offset per channel: correlated channels, as KV's are.
std::vector<float> Correlated(int tokens, int dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> mix(4 * static_cast<size_t>(dim)), offset(dim);
  for (float& m : mix) m = g(rng);
  for (float& o : offset) o = 2.0f * g(rng);
  std::vector<float> x(static_cast<size_t>(tokens) * dim);
  for (int j = 0; j < tokens; ++j) {
    float f[4];
    for (int k = 0; k < 4; ++k) f[k] = g(rng) * 8.0f / static_cast<float>(1 << k);
    for (int c = 0; c < dim; ++c) {
      float v = offset[c] + 0.05f * g(rng);
      for (int k = 0; k < 4; ++k) v += f[k] * mix[k * dim + c];
      x[static_cast<size_t>(j) * dim + c] = v;
    }
  }
  return x;
}

// The calibration of one table (layout 1 layer x 1 head) on x.
TransformCalibration CalibrationOn(const std::vector<float>& x, int tokens, int dim) {
  const KVLayout layout{1, 1, dim, 16};
  std::unique_ptr<KVManager> m = testing::MakeManager("codec=f32", layout, tokens + 16);
  EXPECT_NE(m, nullptr);
  TransformCalibration calibration(layout, m->spec().layers);
  // One f32 page per 16 tokens, K = V = x.
  KVManager::SequenceImage image;
  image.tables.resize(1);
  const LayerCodec& lc = m->spec().layers[0];
  std::vector<std::vector<uint8_t>> pages(tokens / 16, std::vector<uint8_t>(lc.PageBytes(false)));
  for (size_t p = 0; p < pages.size(); ++p) {
    DispatchCodec(lc.id, [&](auto codec) {
      const float* rows = &x[p * 16 * dim];
      decltype(codec)::EncodePage(lc.params, pages[p].data() + PageDataOffset(16), 16, rows, rows);
    });
    image.tables[0].pages.emplace_back(pages[p]);
    image.tables[0].full.push_back(0);
  }
  image.tables[0].length = tokens;
  EXPECT_TRUE(calibration.Add(image).ok());
  return calibration;
}

// A transform of one table calibrated on x.
StorageTransform Calibrated(const std::vector<float>& x, int tokens, int dim, const CompactRates& rates) {
  auto t = CalibrationOn(x, tokens, dim).Finish(rates);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return *t;
}

TEST(StorageTransformTest, BitsFollowTheVarianceAndSpendTheRate) {
  const std::vector<float> variance = {100, 30, 10, 3, 1, 0.3f, 0.1f, 0.01f};
  for (double rate : {0.0, 0.5, 1.0, 1.5, 3.0, 8.0}) {
    const std::vector<uint8_t> bits = AllocateBits(variance, rate);
    EXPECT_EQ(std::accumulate(bits.begin(), bits.end(), 0), std::lround(rate * variance.size())) << rate;
    for (size_t c = 1; c < bits.size(); ++c) EXPECT_GE(bits[c - 1], bits[c]) << rate;
  }
  EXPECT_EQ(AllocateBits(variance, 1.0).back(), 0) << "the smallest component is dropped at 1 bit a value";
}

// The rates a user gives (--rates, --storage-rates) set the bits of the
// tensors they name, and the digest changes with them: a block coded at
// other rates is a miss, never decoded with the wrong widths.
TEST(StorageTransformTest, RatesSetTheBitsAndTheDigest) {
  const int tokens = 512, d = 32;
  const std::vector<float> x = Correlated(tokens, d, 1);
  const StorageTransform base = Calibrated(x, tokens, d, DefaultCompactRates());
  // One table in one layer: the first third of the layers, so K at k_early and V at v_early.
  const Result<CompactRates> more_values = ParseCompactRates("0,2,1.75,3.125");
  ASSERT_TRUE(more_values.ok()) << more_values.status().ToString();
  const StorageTransform other = Calibrated(x, tokens, d, *more_values);
  const auto spent = [](const TensorTransform& t) { return std::accumulate(t.bits.begin(), t.bits.end(), 0); };
  EXPECT_EQ(spent(other.tensor(0, 0)), spent(base.tensor(0, 0))) << "keys keep their rate";
  EXPECT_EQ(spent(base.tensor(0, 1)), std::lround(DefaultCompactRates().v_early * d));
  EXPECT_EQ(spent(other.tensor(0, 1)), 2 * d);
  EXPECT_NE(other.digest(), base.digest());
  // Rates that leave a table no bit would write an empty coded table, which a reader takes as damage.
  const Result<CompactRates> nothing = ParseCompactRates("0,0,1.75,2.5");
  ASSERT_TRUE(nothing.ok());
  const Result<StorageTransform> refused = CalibrationOn(x, tokens, d).Finish(*nothing);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("no bit at all: raise K_EARLY or V_EARLY"), std::string::npos)
      << refused.status().message();
  EXPECT_EQ(Calibrated(x, tokens, d, *ParseCompactRates(FormatCompactRates(DefaultCompactRates()))).digest(),
            base.digest())
      << "the default rates' text gives the default transform";
}

TEST(StorageTransformTest, BadRatesAreRefusedNamingTheProblem) {
  const struct {
    const char* text;
    const char* why;
  } cases[] = {{"1,2,3", "four numbers"},         {"1,2,3,4,5", "four numbers"}, {"1,2,x,4", "'x' is not a number"},
               {"1,,3,4", "'' is not a number"}, {"1,2,3,9", "in [0, 8]"},       {"-1,2,3,4", "in [0, 8]"},
               {"nan,1,1,1", "in [0, 8]"},         {"1 ,2,3,4", "is not a number"}, {"", "four numbers"}};
  for (const auto& c : cases) {
    const Result<CompactRates> r = ParseCompactRates(c.text);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_NE(r.status().message().find(c.why), std::string::npos) << c.text << ": " << r.status().message();
  }
  const Result<CompactRates> ok = ParseCompactRates("0,0.5,8,2.25");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->k_early, 0);
  EXPECT_EQ(ok->v_early, 0.5);
  EXPECT_EQ(ok->k_late, 8);
  EXPECT_EQ(ok->v_late, 2.25);
}

// The basis is orthonormal, the variances decrease, and 4 latent factors
// hold almost all the variance of 32 channels.
TEST(StorageTransformTest, CalibrationDecorrelates) {
  const int tokens = 512, d = 32;
  const StorageTransform t = Calibrated(Correlated(tokens, d, 1), tokens, d, DefaultCompactRates());
  ASSERT_EQ(t.tables(), 1);
  const TensorTransform& k = t.tensor(0, 0);
  for (int a = 0; a < d; ++a) {
    for (int b = 0; b < d; ++b) {
      double dot = 0;
      for (int i = 0; i < d; ++i) dot += static_cast<double>(k.basis[a * d + i]) * k.basis[b * d + i];
      ASSERT_NEAR(dot, a == b ? 1.0 : 0.0, 1e-4) << a << " " << b;
    }
  }
  for (int c = 1; c < d; ++c) EXPECT_GE(k.variance[c - 1], k.variance[c]);
  const double total = std::accumulate(k.variance.begin(), k.variance.end(), 0.0);
  EXPECT_GT((k.variance[0] + k.variance[1] + k.variance[2] + k.variance[3]) / total, 0.999);
}

// Each coded component's round-trip error is at most half its grid's step
// inside the grid and the distance to the grid's end beyond it (read from
// the bytes: f16 centre and step per coded component); dropped components
// come back as 0.
TEST(StorageTransformTest, ErrorIsBoundedByEachComponentsGrid) {
  const int tokens = 256, d = 32;
  const std::vector<float> x = Correlated(tokens, d, 2);
  const StorageTransform st = Calibrated(Correlated(tokens, d, 3), tokens, d, {1.5, 1.5, 1.5, 1.5});
  const TensorTransform& t = st.tensor(0, 0);
  ByteWriter w;
  ASSERT_TRUE(EncodeTransformed(t, x.data(), tokens, &w));
  const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(w.out().data()), w.out().size());
  std::vector<float> y(x.size());
  ByteReader r(bytes, "test");
  ASSERT_TRUE(DecodeTransformed(t, r, tokens, y.data()).ok());
  EXPECT_TRUE(r.at_end());
  const std::vector<float> z = Project(t, x.data(), tokens), zy = Project(t, y.data(), tokens);
  size_t g = 0;
  double worst = 0;  // error / half step, inside the grid
  for (int c = 0; c < d; ++c) {
    if (t.bits[c] == 0) {
      for (int j = 0; j < tokens; ++j) ASSERT_NEAR(zy[j * d + c], 0.0f, 1e-3f) << "dropped component " << c;
      continue;
    }
    uint16_t h[2];
    std::memcpy(h, bytes.data() + 4 * g++, 4);
    const double centre = Fp16ToFloat(h[0]), step = Fp16ToFloat(h[1]), half = 0.5 * ((1 << t.bits[c]) - 1);
    for (int j = 0; j < tokens; ++j) {
      const double off = std::fabs(z[j * d + c] - centre), err = std::fabs(zy[j * d + c] - z[j * d + c]);
      const double bound = off <= (half + 0.5) * step ? step / 2 : off - half * step;
      ASSERT_LE(err, bound + 1e-3) << "component " << c << " (" << int(t.bits[c]) << " bits) token " << j;
      if (off <= half * step) worst = std::max(worst, err / (step / 2));
    }
  }
  EXPECT_GT(worst, 0.8) << "the bound is not tight, so the test would miss a coarser grid";
}

// Bytes a transform did not write are DataLoss, never garbage: a truncated
// tensor, symbols past their end, a damaged grid.
TEST(StorageTransformTest, DamagedBytesAreDataLoss) {
  const int tokens = 64, d = 32;
  const std::vector<float> x = Correlated(tokens, d, 4);
  const StorageTransform st = Calibrated(x, tokens, d, {2, 2, 2, 2});
  const TensorTransform& t = st.tensor(0, 0);
  ByteWriter w;
  ASSERT_TRUE(EncodeTransformed(t, x.data(), tokens, &w));
  std::vector<float> y(x.size());
  auto decode = [&](std::string bytes) {
    ByteReader r({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, "test");
    const Status s = DecodeTransformed(t, r, tokens, y.data());
    return s.ok() && !r.at_end() ? DataLoss("trailing bytes") : s;
  };
  ASSERT_TRUE(decode(w.out()).ok());
  EXPECT_EQ(decode(w.out().substr(0, w.out().size() - 1)).code(), StatusCode::kDataLoss);
  std::string bad = w.out();
  bad[2] = static_cast<char>(0xff), bad[3] = static_cast<char>(0x7f);  // the first step: NaN
  EXPECT_EQ(decode(bad).code(), StatusCode::kDataLoss);
  bad = w.out();
  bad.back() = static_cast<char>(bad.back() | 0x80);  // a bit past the last symbol (when the stream ends mid-byte)
  const size_t total_bits = tokens * std::accumulate(t.bits.begin(), t.bits.end(), size_t{0});
  if (total_bits % 8 != 0) {
    EXPECT_EQ(decode(bad).code(), StatusCode::kDataLoss);
  }
}

}  // namespace
}  // namespace kvx::kv::tier
