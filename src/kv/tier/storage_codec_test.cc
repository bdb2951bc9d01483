#include "kv/tier/storage_codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace kvx::kv::tier {
namespace {

// KV-like data: per-channel offsets and scales (keys have outlier channels),
// and a slow random walk over tokens (token locality) plus noise.
std::vector<float> KvLike(int tokens, int dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> offset(dim), scale(dim), walk(dim, 0.0f);
  for (int c = 0; c < dim; ++c) {
    offset[c] = 3.0f * g(rng);
    scale[c] = c % 13 == 0 ? 8.0f : 0.5f + std::fabs(g(rng));
  }
  std::vector<float> x(static_cast<size_t>(tokens) * dim);
  for (int j = 0; j < tokens; ++j) {
    for (int c = 0; c < dim; ++c) {
      walk[c] = 0.9f * walk[c] + 0.3f * g(rng);
      x[static_cast<size_t>(j) * dim + c] = offset[c] + scale[c] * (walk[c] + 0.2f * g(rng));
    }
  }
  return x;
}

// The bound a grid of `bits` gives channel c: half its step, where the step
// is the channel's range over 2^bits - 1, widened by the f16 rounding of the
// origin (down, at most 2^-10 relative) and of the step (up, 2^-10).
std::vector<double> Bounds(const std::vector<float>& x, int tokens, int dim, int bits) {
  std::vector<double> bound(dim);
  for (int c = 0; c < dim; ++c) {
    double lo = x[c], hi = x[c];
    for (int j = 0; j < tokens; ++j) {
      lo = std::min<double>(lo, x[static_cast<size_t>(j) * dim + c]);
      hi = std::max<double>(hi, x[static_cast<size_t>(j) * dim + c]);
    }
    const double range = hi - lo + std::fabs(lo) * 0x1p-10 + 0x1p-24;
    bound[c] = 0.5 * range / ((1 << bits) - 1) * (1 + 0x1p-9) + 1e-6 * (std::fabs(hi) + std::fabs(lo));
  }
  return bound;
}

std::vector<float> RoundTrip(const std::vector<float>& x, int tokens, int dim, int bits, int anchor) {
  ByteWriter w;
  EXPECT_TRUE(EncodeTensor(x.data(), tokens, dim, bits, anchor, &w));
  std::vector<float> y(x.size());
  const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(w.out().data()), w.out().size());
  ByteReader r(bytes, "test");
  const Status s = DecodeTensor(r, tokens, dim, y.data());
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(r.at_end());
  return y;
}

// Each bit width's error is at most half its step, per channel.
TEST(StorageCodecTest, ErrorIsAtMostHalfAStep) {
  const int tokens = 256, dim = 64;
  const std::vector<float> x = KvLike(tokens, dim, 1);
  for (int bits = 1; bits <= 8; ++bits) {
    const std::vector<double> bound = Bounds(x, tokens, dim, bits);
    const std::vector<float> y = RoundTrip(x, tokens, dim, bits, kDefaultAnchorTokens);
    double worst = 0;  // of error / bound
    for (int j = 0; j < tokens; ++j) {
      for (int c = 0; c < dim; ++c) {
        const size_t i = static_cast<size_t>(j) * dim + c;
        worst = std::max(worst, std::fabs(static_cast<double>(y[i]) - x[i]) / bound[c]);
      }
    }
    EXPECT_LE(worst, 1.0) << bits << " bits";
    EXPECT_GT(worst, 0.5) << bits << " bits: the bound is not tight, so the test would miss a looser grid";
  }
}

// The anchor decides the symbols (the size), never the values decoded.
TEST(StorageCodecTest, TheAnchorChangesNoValue) {
  const int tokens = 100, dim = 16;  // a partial last anchor group
  const std::vector<float> x = KvLike(tokens, dim, 2);
  const std::vector<float> ref = RoundTrip(x, tokens, dim, 4, 0);
  for (int anchor : {1, 10, 16, 99, 100, 255}) EXPECT_EQ(RoundTrip(x, tokens, dim, 4, anchor), ref) << anchor;
  for (int bits : {1, 2, 3, 5}) {  // every packing, odd token counts
    for (int n : {1, 7, 99}) {
      const std::vector<float> y(x.begin(), x.begin() + n * dim);
      EXPECT_EQ(RoundTrip(y, n, dim, bits, 10), RoundTrip(y, n, dim, bits, 0)) << bits << " bits, " << n << " tokens";
    }
  }
}

TEST(StorageCodecTest, ConstantChannelsAreExact) {
  std::vector<float> x(32 * 8, 0.375f);
  for (int j = 0; j < 32; ++j) x[j * 8 + 3] = -2.5f;
  EXPECT_EQ(RoundTrip(x, 32, 8, 3, 16), x);
}

TEST(StorageCodecTest, UnrepresentableValuesAreNotCoded) {
  for (float bad : {std::nanf(""), INFINITY, 1e6f}) {
    std::vector<float> x(16 * 4, 1.0f);
    x[37] = bad;
    ByteWriter w;
    EXPECT_FALSE(EncodeTensor(x.data(), 16, 4, 4, 16, &w)) << bad;
    EXPECT_TRUE(w.out().empty());
  }
}

// A symbol off the grid (possible only in damaged bytes) is DataLoss, as are
// impossible bit widths and truncations.
TEST(StorageCodecTest, DamagedTensorsAreDataLoss) {
  const int tokens = 32, dim = 4;
  const std::vector<float> x = KvLike(tokens, dim, 3);
  ByteWriter w;
  ASSERT_TRUE(EncodeTensor(x.data(), tokens, dim, 3, 0, &w));
  auto decode = [&](std::string bytes) {
    std::vector<float> y(x.size());
    ByteReader r(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), "test");
    return DecodeTensor(r, tokens, dim, y.data()).code();
  };
  std::string bad = w.out();
  bad[2 + 4 * dim] = static_cast<char>(0xc0);  // bits above the first byte's two 3-bit symbols
  EXPECT_EQ(decode(bad), StatusCode::kDataLoss);
  bad = w.out();
  bad[0] = 9;  // bits
  EXPECT_EQ(decode(bad), StatusCode::kDataLoss);
  EXPECT_EQ(decode(w.out().substr(0, w.out().size() - 1)), StatusCode::kDataLoss);
}

TEST(StorageCodecTest, LevelsParseAndOrder) {
  for (StorageLevel l : kAllStorageLevels) EXPECT_EQ(ParseStorageLevel(StorageLevelName(l)), l);
  EXPECT_FALSE(ParseStorageLevel("best").has_value());
  EXPECT_TRUE(AcceptsLevel(StorageLevel::kMedium, StorageLevel::kHigh));
  EXPECT_TRUE(AcceptsLevel(StorageLevel::kMedium, StorageLevel::kMedium));
  EXPECT_FALSE(AcceptsLevel(StorageLevel::kMedium, StorageLevel::kLow));
  EXPECT_FALSE(AcceptsLevel(StorageLevel::kLossless, StorageLevel::kHigh));
  // Later layers get at least as many bits; lossier levels fewer.
  for (StorageLevel l : {StorageLevel::kHigh, StorageLevel::kMedium, StorageLevel::kLow}) {
    EXPECT_LE(LayerBits(l, 0, 8).k, LayerBits(l, 7, 8).k);
  }
  EXPECT_GT(LayerBits(StorageLevel::kHigh, 5, 8).k, LayerBits(StorageLevel::kLow, 5, 8).k);
}

TEST(StorageCodecTest, CacheCodecFlagsParse) {
  // compact is a level like the others (the transform is the tools' to
  // find: tools/flags.cc).
  auto compact = ParseStorageLevels("high,redis=compact");
  ASSERT_TRUE(compact.ok()) << compact.status().ToString();
  EXPECT_EQ(compact->For("redis"), StorageLevel::kCompact);
  EXPECT_EQ(compact->For("disk"), StorageLevel::kHigh);
  auto all = ParseStorageLevels("medium");
  ASSERT_TRUE(all.ok());
  for (const char* kind : {"ram", "disk", "redis"}) EXPECT_EQ(all->For(kind), StorageLevel::kMedium);
  auto per_tier = ParseStorageLevels("disk=high,redis=low");
  ASSERT_TRUE(per_tier.ok());
  EXPECT_EQ(per_tier->For("ram"), StorageLevel::kLossless);
  EXPECT_EQ(per_tier->For("disk"), StorageLevel::kHigh);
  EXPECT_EQ(per_tier->For("redis"), StorageLevel::kLow);
  auto mixed = ParseStorageLevels("low,ram=lossless");
  ASSERT_TRUE(mixed.ok());
  EXPECT_EQ(mixed->For("ram"), StorageLevel::kLossless);
  EXPECT_EQ(mixed->For("redis"), StorageLevel::kLow);
  for (const char* bad : {"", "best", "disk=", "tape=high", "disk=high,disk=low", "high,low", "disk=high,"}) {
    auto r = ParseStorageLevels(bad);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace kvx::kv::tier
