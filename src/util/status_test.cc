#include "util/status.h"

#include <gtest/gtest.h>

#include "util/fp16.h"
#include "util/thread_pool.h"

namespace kvx {
namespace {

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgument("odd");
  return x / 2;
}

Status UseHalf(int x, int* out) {
  KVX_ASSIGN_OR_RETURN(int h, Half(x));
  *out = h;
  return Status::Ok();
}

TEST(StatusTest, PropagatesErrors) {
  int v = 0;
  EXPECT_TRUE(UseHalf(4, &v).ok());
  EXPECT_EQ(v, 2);
  Status s = UseHalf(3, &v);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.ToString(), "invalid argument: odd");
  EXPECT_EQ(s.WithContext("x").message(), "x: odd");
}

TEST(Fp16Test, RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = Fp16ToFloat(static_cast<uint16_t>(h));
    if (f != f) continue;  // NaN
    EXPECT_EQ(FloatToFp16(f), h) << h;
  }
}

TEST(Fp16Test, RoundsToNearestEven) {
  EXPECT_EQ(FloatToFp16(1.0f), 0x3C00);
  EXPECT_EQ(FloatToFp16(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToFp16(1e6f), 0x7C00);
  EXPECT_EQ(FloatToFp16(1.0f + 1.0f / 2048), 0x3C00);       // tie -> even
  EXPECT_EQ(FloatToFp16(1.0f + 3.0f / 2048), 0x3C02);       // tie -> even (up)
  EXPECT_EQ(FloatToFp16(5.96046448e-8f), 0x0001);           // smallest subnormal
  EXPECT_EQ(FloatToFp16(2.98023224e-8f), 0x0000);           // half of it: tie to even 0
  EXPECT_FLOAT_EQ(Bf16ToFloat(FloatToBf16(3.140625f)), 3.140625f);
}

TEST(ThreadPoolTest, CoversEveryIndexOnce) {
  ThreadPool pool(3);
  for (size_t n : {1u, 2u, 5u, 100u}) {
    std::vector<int> hits(n, 0);
    pool.ParallelFor(n, [&](size_t b, size_t e, int) {
      for (size_t i = b; i < e; ++i) hits[i]++;
    });
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(hits[i], 1);
  }
}

}  // namespace
}  // namespace kvx
