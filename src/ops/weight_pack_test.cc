// Repacked Q8_0 matrices (ops/weight_pack.h): the layout round-trips to the
// GGUF rows, and MatMul on a repacked matrix is bit-identical to MatMul on
// the original, for decode (1 token) and prefill batches, with and without
// threads, on every SIMD target this CPU runs.
#include "ops/weight_pack.h"

#include <gtest/gtest.h>

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
  const TestMatrix m = MakeQ8(128, 8, 1);
  EXPECT_TRUE(CanRepack(m.view));
  WeightView v = m.view;
  v.n_out = 6;  // not a multiple of 4 rows
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
  const TestMatrix a = MakeQ8(128, 8, 7, /*pad=*/6), b = MakeQ8(64, 12, 8);  // a: source rows longer than packed ones
  WeightView a1 = a.view, a2 = a.view, bv = b.view;
  std::vector<std::pair<const void*, size_t>> released;  // each source once, with its rows' bytes
  PackedWeights p = PackViews({&a1, &bv, &a2}, [&](const void* data, size_t bytes) { released.emplace_back(data, bytes); });
  EXPECT_EQ(p.count(), 2);
  const std::vector<std::pair<const void*, size_t>> sources = {{a.view.data, 8 * a.view.row_bytes},
                                                               {b.view.data, 12 * b.view.row_bytes}};
  EXPECT_EQ(released, sources);
  const size_t copies = 8 * RowBytesOf(TensorType::kQ8_0, 128) + 12 * RowBytesOf(TensorType::kQ8_0, 64);
  EXPECT_GE(p.bytes(), copies);  // each copy rounded up to 64 bytes
  EXPECT_LT(p.bytes(), copies + 2 * 64);
  EXPECT_EQ(a1.data, a2.data);
  EXPECT_NE(a1.data, bv.data);
  for (const WeightView* v : {&a1, &bv}) {
    EXPECT_EQ(v->layout, WeightLayout::kRowGroups4);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v->data) % 64, 0u);
  }
  std::vector<float> x(128), y(128);
  for (int64_t r = 0; r < 8; ++r) {
    DequantizeWeightRow(a.view, r, x.data());
    DequantizeWeightRow(a2, r, y.data());
    EXPECT_EQ(x, y);
  }
  const PackedWeights moved = std::move(p);  // the copies move with the owner
  EXPECT_EQ(moved.count(), 2);
  DequantizeWeightRow(bv, 11, y.data());
  DequantizeWeightRow(b.view, 11, x.data());
  EXPECT_EQ(std::vector<float>(x.begin(), x.begin() + 64), std::vector<float>(y.begin(), y.begin() + 64));
}

TEST(WeightPackTest, RowsRoundTripAndDequantize) {
  const TestMatrix m = MakeQ8(192, 12, 2, /*pad=*/6);  // padded rows in the source
  WeightView packed = m.view;
  const PackedWeights p = PackViews({&packed});
  EXPECT_EQ(packed.layout, WeightLayout::kRowGroups4);
  EXPECT_EQ(packed.row_bytes, RowBytesOf(TensorType::kQ8_0, 192));
  std::vector<uint8_t> row(RowBytesOf(TensorType::kQ8_0, 192));
  std::vector<float> a(192), b(192);
  for (int64_t r = 0; r < 12; ++r) {
    CopyRowAsStored(packed, r, row.data());
    EXPECT_EQ(0, std::memcmp(row.data(), m.bytes.data() + r * m.view.row_bytes, row.size())) << "row " << r;
    DequantizeWeightRow(m.view, r, a.data());
    DequantizeWeightRow(packed, r, b.data());
    EXPECT_EQ(a, b) << "row " << r;
  }
}

TEST(WeightPackTest, MatMulBitIdenticalToTheGgufLayout) {
  ThreadPool pool(2);
  for (const int64_t n_in : {64, 576}) {
    const int64_t n_out = 40;
    const TestMatrix m = MakeQ8(n_in, n_out, 3);
    WeightView packed = m.view;
    const PackedWeights p = PackViews({&packed});
    for (const int64_t n_tok : {1, 3, 9}) {
      const auto x = Gaussian(n_tok * n_in, 4);
      for (const std::string& target : AvailableSimdTargets()) {
        SCOPED_TRACE("target " + target + " n_in " + std::to_string(n_in) + " tokens " + std::to_string(n_tok));
        ASSERT_TRUE(ForceSimdTarget(target));
        for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool}) {
          std::vector<float> want(n_tok * n_out), got(n_tok * n_out);
          MatMul(m.view, x.data(), n_tok, want.data(), tp);
          MatMul(packed, x.data(), n_tok, got.data(), tp);
          EXPECT_EQ(want, got);
        }
        // Several outputs at once (Q/K/V style), one of them packed.
        const TestMatrix other = MakeQ8(n_in, 8, 5);
        std::vector<float> y0(n_tok * n_out), y1(n_tok * 8), ref0(n_tok * n_out), ref1(n_tok * 8);
        const MatMulOutput outs[] = {{packed, y0.data()}, {other.view, y1.data()}};
        MatMulMulti(outs, x.data(), n_tok, &pool);
        MatMul(m.view, x.data(), n_tok, ref0.data(), nullptr);
        MatMul(other.view, x.data(), n_tok, ref1.data(), nullptr);
        EXPECT_EQ(ref0, y0);
        EXPECT_EQ(ref1, y1);
      }
      ForceSimdTarget("");
    }
  }
}

}  // namespace
}  // namespace kvx::ops
