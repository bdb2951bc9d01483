// Repacked Q8_0 matrices (ops/weight_pack.h): the layout round-trips to the
// GGUF rows, and MatMul on a repacked matrix gives bit-identical results for
// decode (1 token) and prefill batches of any size, with and without
// threads, on every SIMD target this CPU runs, within float rounding of
// MatMul on the original rows.
#include "ops/weight_pack.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "ops/dequant.h"
#include "ops/quant_blocks.h"
#include "ops/ops_test_util.h"
#include "ops/simd_target.h"

namespace kvx::ops {
namespace {

using gguf::TensorType;

using testing::Gaussian;
using testing::TestMatrix;

PackedWeights PackViews(std::initializer_list<WeightView*> views, const PackedWeights::SourceDone& done = {}) {
  const std::vector<WeightView*> v(views);
  return PackedWeights::PackAll(v, done);
}

TestMatrix MakeQ8(int64_t n_in, int64_t n_out, uint32_t seed, size_t pad = 0) {
  return testing::MakeMatrix(TensorType::kQ8_0, n_in, n_out, seed, pad);
}

TEST(WeightPackTest, OnlyQ8_0RowsOfTheRightShape) {
  const TestMatrix m = MakeQ8(128, 16, 1);
  EXPECT_TRUE(CanRepack(m.view));
  WeightView v = m.view;
  v.n_out = 12;  // not a multiple of 16 rows
  EXPECT_FALSE(CanRepack(v));
  v = m.view;
  v.n_in = 96;  // odd number of 32-blocks: no whole 64-element chunks
  EXPECT_FALSE(CanRepack(v));
  v = m.view;
  v.type = TensorType::kQ4_0;
  EXPECT_FALSE(CanRepack(v));
  WeightView packed = m.view;
  const PackedWeights p = PackViews({&packed});
  EXPECT_EQ(p.count(), 1);
  EXPECT_FALSE(CanRepack(packed));  // already repacked
  // Views the packer cannot handle are left alone and not counted.
  WeightView q4 = m.view;
  q4.type = TensorType::kQ4_0;
  EXPECT_EQ(PackViews({&q4}).count(), 0);
  EXPECT_EQ(q4.data, m.view.data);
}

// Views of the same matrix (a tied embedding and output head) share one
// copy; each distinct matrix gets its own, 64-byte aligned, in one buffer.
TEST(WeightPackTest, PackAllSharesTiedMatricesAndAlignsCopies) {
  const TestMatrix a = MakeQ8(128, 16, 7, /*pad=*/6), b = MakeQ8(64, 32, 8);  // a: source rows longer than packed ones
  WeightView a1 = a.view, a2 = a.view, bv = b.view;
  std::vector<std::pair<const void*, size_t>> released;  // each source once, with its rows' bytes
  PackedWeights p = PackViews({&a1, &bv, &a2}, [&](const void* data, size_t bytes) { released.emplace_back(data, bytes); });
  EXPECT_EQ(p.count(), 2);
  const std::vector<std::pair<const void*, size_t>> sources = {{a.view.data, 16 * a.view.row_bytes},
                                                               {b.view.data, 32 * b.view.row_bytes}};
  EXPECT_EQ(released, sources);
  const size_t copies = 16 * RowBytesOf(TensorType::kQ8_0, 128) + 32 * RowBytesOf(TensorType::kQ8_0, 64);
  EXPECT_GE(p.bytes(), copies);  // each copy rounded up to 64 bytes
  EXPECT_LT(p.bytes(), copies + 2 * 64);
  EXPECT_EQ(a1.data, a2.data);
  EXPECT_NE(a1.data, bv.data);
  for (const WeightView* v : {&a1, &bv}) {
    EXPECT_EQ(v->layout, WeightLayout::kInterleaved16);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v->data) % 64, 0u);
  }
  std::vector<float> x(128), y(128);
  for (int64_t r = 0; r < 16; ++r) {
    DequantizeWeightRow(a.view, r, x.data());
    DequantizeWeightRow(a2, r, y.data());
    EXPECT_EQ(x, y);
  }
  const PackedWeights moved = std::move(p);  // the copies move with the owner
  EXPECT_EQ(moved.count(), 2);
  DequantizeWeightRow(bv, 27, y.data());
  DequantizeWeightRow(b.view, 27, x.data());
  EXPECT_EQ(std::vector<float>(x.begin(), x.begin() + 64), std::vector<float>(y.begin(), y.begin() + 64));
}

TEST(WeightPackTest, RowsRoundTripAndDequantize) {
  const TestMatrix m = MakeQ8(192, 32, 2, /*pad=*/6);  // padded rows in the source
  WeightView packed = m.view;
  const PackedWeights p = PackViews({&packed});
  EXPECT_EQ(packed.layout, WeightLayout::kInterleaved16);
  EXPECT_EQ(packed.row_bytes, RowBytesOf(TensorType::kQ8_0, 192));
  std::vector<uint8_t> row(RowBytesOf(TensorType::kQ8_0, 192));
  std::vector<float> a(192), b(192);
  for (int64_t r = 0; r < 32; ++r) {
    CopyRowAsStored(packed, r, row.data());
    EXPECT_EQ(0, std::memcmp(row.data(), m.bytes.data() + r * m.view.row_bytes, row.size())) << "row " << r;
    DequantizeWeightRow(m.view, r, a.data());
    DequantizeWeightRow(packed, r, b.data());
    EXPECT_EQ(a, b) << "row " << r;
  }
}

// Bound on the difference between the two integer contracts (per-block
// int32 sums vs 16 float lanes of 4-element sums): both quantize the
// activations the same way, so only float rounding differs, a few ulps of
// the output's magnitude sum |w*x|.
double MagnitudeSum(const WeightView& w, const float* x, int64_t t, int64_t r) {
  std::vector<float> row(static_cast<size_t>(w.n_in));
  DequantizeWeightRow(w, r, row.data());
  double s = 0;
  for (int64_t i = 0; i < w.n_in; ++i) s += std::fabs(static_cast<double>(row[i]) * x[t * w.n_in + i]);
  return s;
}

TEST(WeightPackTest, MatMulIdenticalForEveryTargetThreadCountAndBatch) {
  ThreadPool pool(2);
  for (const int64_t n_in : {64, 576}) {
    const int64_t n_out = 80;  // 5 groups of 16: the threads' 48-row ranges split a matrix unevenly
    const TestMatrix m = MakeQ8(n_in, n_out, 3);
    WeightView packed = m.view;
    const PackedWeights p = PackViews({&packed});
    ASSERT_EQ(packed.layout, WeightLayout::kInterleaved16);
    // 67 tokens: sixteen 4-token tiles and 3 left; 80 rows: a tile of 3
    // groups and two single groups (threads take 48-row ranges).
    const int64_t n_tok = 67;
    const auto x = Gaussian(n_tok * n_in, 4);
    // The reference: each token alone, on the scalar baseline.
    std::vector<float> want(n_tok * n_out);
    const std::vector<std::string> targets = testing::TestableTargets();  // before forcing one, which narrows the list
    ASSERT_GE(targets.size(), 2u);
    ASSERT_TRUE(ForceSimdTarget(targets.back()));
    for (int64_t t = 0; t < n_tok; ++t) MatMul(packed, x.data() + t * n_in, 1, want.data() + t * n_out, nullptr);
    std::vector<float> gguf(n_tok * n_out);
    MatMul(m.view, x.data(), n_tok, gguf.data(), nullptr);
    for (int64_t t = 0; t < n_tok; ++t) {
      for (int64_t r = 0; r < n_out; ++r) {
        ASSERT_NEAR(want[t * n_out + r], gguf[t * n_out + r], 1e-6 * MagnitudeSum(m.view, x.data(), t, r))
            << "token " << t << " row " << r;
      }
    }
    for (const std::string& target : targets) {
      SCOPED_TRACE("target " + target + " n_in " + std::to_string(n_in));
      ASSERT_TRUE(ForceSimdTarget(target));
      for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool}) {
        // Steps of 1-8 rows stream the weights once on AVX-512 (1-3 on
        // AVX2); longer ones (a batched step of 9..64 rows, a prompt) tile
        // 4 tokens (2-3 on AVX2) and leave 1-3, prefetching the next groups.
        for (const int64_t batch : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{5}, int64_t{6},
                                    int64_t{7}, int64_t{8}, int64_t{9}, int64_t{11}, int64_t{14}, int64_t{16},
                                    int64_t{29}, int64_t{33}, int64_t{64}, n_tok}) {
          std::vector<float> got(n_tok * n_out);
          for (int64_t t = 0; t < n_tok; t += batch) {
            MatMul(packed, x.data() + t * n_in, std::min(batch, n_tok - t), got.data() + t * n_out, tp);
          }
          EXPECT_EQ(want, got) << "batch " << batch;
        }
      }
      // Several outputs at once (Q/K/V style), one of them packed.
      const TestMatrix other = MakeQ8(n_in, 8, 5);
      std::vector<float> y0(n_tok * n_out), y1(n_tok * 8), ref1(n_tok * 8);
      const MatMulOutput outs[] = {{packed, y0.data()}, {other.view, y1.data()}};
      MatMulMulti(outs, x.data(), n_tok, &pool);
      MatMul(other.view, x.data(), n_tok, ref1.data(), nullptr);
      EXPECT_EQ(want, y0);
      EXPECT_EQ(ref1, y1);
    }
    ForceSimdTarget("");
  }
}

}  // namespace
}  // namespace kvx::ops
