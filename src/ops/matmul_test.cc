// MatMul against a double-precision reference for every weight type, with
// and without a thread pool (results must be bit-identical across thread
// counts because work is split by output rows only).
#include "ops/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "ops/dequant.h"
#include "ops/quant_blocks.h"
#include "ops/quantize.h"

namespace kvx::ops {
namespace {

using gguf::TensorType;

const TensorType kTypes[] = {TensorType::kF32,  TensorType::kF16,  TensorType::kBF16, TensorType::kQ8_0,
                             TensorType::kQ4_0, TensorType::kQ4_K, TensorType::kQ5_K, TensorType::kQ6_K};

std::vector<float> Gaussian(int64_t n, uint32_t seed, float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(mean, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

// A quantized weight matrix; rows may be padded (row_bytes > RowBytesOf).
struct TestMatrix {
  std::vector<uint8_t> bytes;
  WeightView view;
};

TestMatrix MakeMatrix(TensorType t, int64_t n_in, int64_t n_out, uint32_t seed, size_t pad = 0) {
  TestMatrix m;
  const size_t rb = RowBytesOf(t, n_in) + pad;
  m.bytes.assign(rb * n_out, 0xAB);  // padding bytes are garbage on purpose
  const auto w = Gaussian(n_in * n_out, seed);
  for (int64_t o = 0; o < n_out; ++o) QuantizeRow(t, w.data() + o * n_in, m.bytes.data() + o * rb, n_in);
  m.view = WeightView{t, m.bytes.data(), n_in, n_out, rb};
  return m;
}

// Max over outputs of |y - exact| / sum_i |w_i x_i| (the natural scale of
// float rounding error in a dot product).
double MaxScaledError(const WeightView& w, const float* x, int64_t n_tokens, const std::vector<float>& y) {
  std::vector<float> row(w.n_in);
  double worst = 0;
  for (int64_t o = 0; o < w.n_out; ++o) {
    DequantizeRow(w.type, static_cast<const uint8_t*>(w.data) + o * w.row_bytes, row.data(), w.n_in);
    for (int64_t t = 0; t < n_tokens; ++t) {
      double exact = 0, mag = 0;
      for (int64_t i = 0; i < w.n_in; ++i) {
        const double p = static_cast<double>(row[i]) * x[t * w.n_in + i];
        exact += p;
        mag += std::fabs(p);
      }
      worst = std::max(worst, std::fabs(y[t * w.n_out + o] - exact) / std::max(mag, 1e-30));
    }
  }
  return worst;
}

TEST(MatMulTest, MatchesDoubleReferenceAllTypes) {
  ThreadPool pool2(2), pool3(3);
  struct Shape {
    int64_t n_in, n_out, n_tokens;
  };
  const Shape shapes[] = {{256, 1, 1}, {256, 7, 3}, {512, 33, 64}, {1024, 129, 3},
                          {2048, 65, 1}, {768, 17, 67}, {2048, 9, 64}};
  for (TensorType t : kTypes) {
    for (const Shape& s : shapes) {
      SCOPED_TRACE(TensorTypeName(t) + " n_in=" + std::to_string(s.n_in) + " n_out=" + std::to_string(s.n_out) +
                   " n_tokens=" + std::to_string(s.n_tokens));
      auto m = MakeMatrix(t, s.n_in, s.n_out, static_cast<uint32_t>(s.n_in + s.n_out));
      const auto x = Gaussian(s.n_in * s.n_tokens, 77, 0.1f);
      std::vector<float> y1(s.n_out * s.n_tokens), y2(y1.size()), y3(y1.size()), yref(y1.size());
      MatMul(m.view, x.data(), s.n_tokens, y1.data(), nullptr);
      MatMul(m.view, x.data(), s.n_tokens, y2.data(), &pool2);
      MatMul(m.view, x.data(), s.n_tokens, y3.data(), &pool3);
      EXPECT_EQ(y1, y2);
      EXPECT_EQ(y1, y3);
      EXPECT_LE(MaxScaledError(m.view, x.data(), s.n_tokens, y1), 2e-6);
      MatMulReference(m.view, x.data(), s.n_tokens, yref.data());
      EXPECT_LE(MaxScaledError(m.view, x.data(), s.n_tokens, yref), 1e-7);
    }
  }
}

TEST(MatMulTest, SmallBlockTypesWithNonChunkMultipleWidth) {
  // n_in = 576 = 2.25 chunks of 256 exercises the partial last chunk.
  for (TensorType t : {TensorType::kF32, TensorType::kF16, TensorType::kBF16, TensorType::kQ8_0, TensorType::kQ4_0}) {
    SCOPED_TRACE(TensorTypeName(t));
    auto m = MakeMatrix(t, 576, 37, 5);
    const auto x = Gaussian(576 * 5, 6);
    std::vector<float> y(37 * 5);
    MatMul(m.view, x.data(), 5, y.data(), nullptr);
    EXPECT_LE(MaxScaledError(m.view, x.data(), 5, y), 2e-6);
  }
  // F32/F16 rows of any width (not a multiple of the 16 accumulator lanes).
  for (TensorType t : {TensorType::kF32, TensorType::kF16}) {
    auto m = MakeMatrix(t, 37, 5, 8);
    const auto x = Gaussian(37 * 2, 9);
    std::vector<float> y(5 * 2);
    MatMul(m.view, x.data(), 2, y.data(), nullptr);
    EXPECT_LE(MaxScaledError(m.view, x.data(), 2, y), 2e-6);
  }
}

TEST(MatMulTest, F32RelativeAccuracy) {
  // With positive data (no cancellation) the result is within 1e-5 relative
  // of the exact dot product.
  const int64_t n_in = 2048, n_out = 31;
  auto m = MakeMatrix(TensorType::kF32, n_in, n_out, 3);
  auto* w = reinterpret_cast<float*>(m.bytes.data());
  for (int64_t i = 0; i < n_in * n_out; ++i) w[i] = std::fabs(w[i]);
  const auto x = Gaussian(n_in * 3, 4, 2.0f);
  std::vector<float> y(n_out * 3), yref(n_out * 3);
  MatMul(m.view, x.data(), 3, y.data(), nullptr);
  MatMulReference(m.view, x.data(), 3, yref.data());
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], yref[i], 1e-5 * std::fabs(yref[i]));
}

TEST(MatMulTest, PaddedRowsAndHandValues) {
  // row_bytes larger than the packed row: padding must be ignored.
  for (TensorType t : kTypes) {
    SCOPED_TRACE(TensorTypeName(t));
    auto padded = MakeMatrix(t, 256, 5, 12, /*pad=*/64);
    auto packed = MakeMatrix(t, 256, 5, 12);
    const auto x = Gaussian(256 * 4, 13);
    std::vector<float> y1(20), y2(20);
    MatMul(padded.view, x.data(), 4, y1.data(), nullptr);
    MatMul(packed.view, x.data(), 4, y2.data(), nullptr);
    EXPECT_EQ(y1, y2);
  }
  // Identity-like F32 check: W = [[1,2,...],[...]] small exact integers.
  std::vector<float> w(2 * 32), x(32, 1.0f);
  for (int i = 0; i < 64; ++i) w[i] = static_cast<float>(i);
  WeightView v{TensorType::kF32, w.data(), 32, 2, 32 * 4};
  std::vector<float> y(2);
  MatMul(v, x.data(), 1, y.data(), nullptr);
  EXPECT_EQ(y[0], 496.0f);         // 0+...+31
  EXPECT_EQ(y[1], 496.0f + 1024);  // 32+...+63
}

TEST(MatMulTest, BatchInvariant) {
  // A token's output does not depend on how many tokens share the call
  // (decode vs prefill give bit-identical rows), for every type.
  for (TensorType t : kTypes) {
    SCOPED_TRACE(TensorTypeName(t));
    auto m = MakeMatrix(t, 512, 11, 31);
    const auto x = Gaussian(512 * 70, 32);
    std::vector<float> batch(11 * 70), one(11);
    MatMul(m.view, x.data(), 70, batch.data(), nullptr);
    for (int64_t tok : {0, 3, 5, 63, 64, 69}) {
      MatMul(m.view, x.data() + tok * 512, 1, one.data(), nullptr);
      for (int o = 0; o < 11; ++o) ASSERT_EQ(one[o], batch[tok * 11 + o]) << "token " << tok;
    }
  }
}

TEST(MatMulTest, ManyTokensAcrossTilesThreaded) {
  // 130 tokens = 3 tiles of 64; many threads over few rows.
  ThreadPool pool(4);
  auto m = MakeMatrix(TensorType::kQ4_K, 512, 3, 21);
  const auto x = Gaussian(512 * 130, 22);
  std::vector<float> y1(3 * 130), y2(3 * 130);
  MatMul(m.view, x.data(), 130, y1.data(), nullptr);
  MatMul(m.view, x.data(), 130, y2.data(), &pool);
  EXPECT_EQ(y1, y2);
  EXPECT_LE(MaxScaledError(m.view, x.data(), 130, y1), 2e-6);
}

}  // namespace
}  // namespace kvx::ops
