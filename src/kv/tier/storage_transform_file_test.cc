#include "kv/tier/storage_transform_file.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kv/tier/tier_test_util.h"

namespace kvx::kv::tier {
namespace {

constexpr int kDim = 8;

// A transform of `tables` tables with random tensors (the file stores any
// transform; calibration is storage_transform_test's).
StorageTransform RandomTransform(int tables, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g;
  std::vector<TensorTransform> tensors(static_cast<size_t>(tables) * 2);
  for (TensorTransform& t : tensors) {
    for (int i = 0; i < kDim; ++i) t.mean.push_back(g(rng)), t.variance.push_back(std::abs(g(rng)));
    for (int i = 0; i < kDim * kDim; ++i) t.basis.push_back(g(rng));
    for (int i = 0; i < kDim; ++i) t.bits.push_back(static_cast<uint8_t>(rng() % (kMaxComponentBits + 1)));
  }
  Result<StorageTransform> out = StorageTransform::FromTensors(kDim, std::move(tensors));
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return std::move(out).value();
}

const TransformIdentity kIdentity{0x1111222233334444ull, 0xaaaabbbbccccddddull, 2, 1, kDim};

std::span<const uint8_t> Bytes(const std::string& s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }

TEST(StorageTransformFileTest, RoundTripsEveryTensorAndTheDigest) {
  const StorageTransform t = RandomTransform(2, 1);
  testing::TempDir dir;
  const std::string path = dir.path() + "/transform.kvxt";
  ASSERT_TRUE(WriteTransformFile(path, t, kIdentity).ok());
  Result<StorageTransform> back = ReadTransformFile(path, kIdentity);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->digest(), t.digest());
  ASSERT_EQ(back->tables(), 2);
  for (int table = 0; table < 2; ++table) {
    for (int kv = 0; kv < 2; ++kv) {
      EXPECT_EQ(back->tensor(table, kv).basis, t.tensor(table, kv).basis);
      EXPECT_EQ(back->tensor(table, kv).bits, t.tensor(table, kv).bits);
    }
  }
}

// A file for another model or another KV spec (layout, codec, pre-RoPE
// keys) is refused with both fingerprints in the message.
TEST(StorageTransformFileTest, AnotherModelOrSpecIsRefusedNamingBoth) {
  const std::string bytes = EncodeTransformFile(RandomTransform(2, 2), kIdentity);
  for (int which = 0; which < 3; ++which) {
    TransformIdentity other = kIdentity;
    if (which == 0) other.model_fingerprint = 0x5555666677778888ull;
    if (which == 1) other.spec_fingerprint = 0x9999000011112222ull;
    if (which == 2) other.n_layers = 4;
    Result<StorageTransform> r = DecodeTransformFile(Bytes(bytes), other, "t.kvxt");
    ASSERT_EQ(r.status().code(), StatusCode::kInvalidArgument) << which;
    const std::string& m = r.status().message();
    EXPECT_NE(m.find(kIdentity.ToString()), std::string::npos) << m;
    EXPECT_NE(m.find(other.ToString()), std::string::npos) << m;
  }
}

// Damage never yields a transform: a flipped bit anywhere, a truncation,
// another version, another file.
TEST(StorageTransformFileTest, DamageIsAnErrorNeverATransform) {
  const std::string good = EncodeTransformFile(RandomTransform(2, 3), kIdentity);
  for (size_t at = 0; at < good.size(); at += 7) {
    std::string bad = good;
    bad[at] ^= 0x10;
    EXPECT_FALSE(DecodeTransformFile(Bytes(bad), kIdentity, "t").ok()) << at;
  }
  for (size_t n : {size_t{0}, size_t{10}, good.size() / 2, good.size() - 1}) {
    EXPECT_FALSE(DecodeTransformFile(Bytes(good.substr(0, n)), kIdentity, "t").ok()) << n;
  }
  std::string v2 = good;
  v2[8] = 2;  // the version, then a checksum that matches again
  const uint64_t sum = XXH3_64bits(v2.data(), v2.size() - 8);
  v2.replace(v2.size() - 8, 8, reinterpret_cast<const char*>(&sum), 8);
  EXPECT_EQ(DecodeTransformFile(Bytes(v2), kIdentity, "t").status().code(), StatusCode::kUnimplemented);
  EXPECT_EQ(DecodeTransformFile(Bytes("not a transform at all, just text"), kIdentity, "t").status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvx::kv::tier
