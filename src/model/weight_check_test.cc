#include "model/weight_check.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "ops/quant_blocks.h"
#include "util/finite.h"

namespace kvx::model {
namespace {

using gguf::TensorType;

constexpr uint16_t kF16Nan = 0x7E00, kF16Inf = 0x7C00, kBf16Inf = 0x7F80;

// A tensor of `rows` rows of `row_elems` zeros (finite everywhere) of
// `type`, its bytes owned by `bytes`.
gguf::TensorInfo ZeroTensor(TensorType type, int row_elems, int rows, std::vector<uint8_t>* bytes) {
  const size_t row_bytes = ops::RowBytesOf(type, row_elems);
  bytes->assign(row_bytes * static_cast<size_t>(rows), 0);
  gguf::TensorInfo t;
  t.name = "blk.0.attn_q.weight";
  t.type = type;
  t.dims = {static_cast<uint64_t>(row_elems), static_cast<uint64_t>(rows)};
  t.n_elements = static_cast<uint64_t>(row_elems) * static_cast<uint64_t>(rows);
  t.n_bytes = bytes->size();
  t.data = bytes->data();
  return t;
}

void Put16(std::vector<uint8_t>* bytes, size_t at, uint16_t v) { std::memcpy(bytes->data() + at, &v, 2); }

struct ScaleCase {
  TensorType type;
  int scale_offset;  // of an f16 scale within a block
};

// Every per-block scale is checked, in any block of any row.
TEST(WeightCheckTest, FindsANonFiniteScaleInEveryQuantizedType) {
  const ScaleCase cases[] = {{TensorType::kQ8_0, 0}, {TensorType::kQ4_0, 0}, {TensorType::kQ4_K, 0},
                             {TensorType::kQ4_K, 2}, {TensorType::kQ5_K, 0}, {TensorType::kQ5_K, 2},
                             {TensorType::kQ6_K, ops::kQ6_KBytes - 2}};
  for (const ScaleCase& c : cases) {
    SCOPED_TRACE(gguf::TensorTypeName(c.type) + " scale at byte " + std::to_string(c.scale_offset));
    std::vector<uint8_t> bytes;
    const int row_elems = 512, rows = 300;
    gguf::TensorInfo t = ZeroTensor(c.type, row_elems, rows, &bytes);
    ASSERT_TRUE(CheckWeightsFinite(t).ok());
    const ops::BlockGeometry g = ops::GetBlockGeometry(c.type);
    const int per_row = row_elems / g.block_size;
    const size_t block = static_cast<size_t>(217) * per_row + 1;  // row 217: not one a sample would pick
    Put16(&bytes, block * g.block_bytes + c.scale_offset, kF16Nan);
    const Status s = CheckWeightsFinite(t);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
    EXPECT_NE(s.message().find("'blk.0.attn_q.weight'"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("row 217"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("block 1"), std::string::npos) << s.message();
    Put16(&bytes, block * g.block_bytes + c.scale_offset, kF16Inf);
    EXPECT_EQ(CheckWeightsFinite(t).code(), StatusCode::kDataLoss);
  }
}

// Float matrices: the sampled rows (the first and last among them) are
// checked whole; a row between samples is found only by a full check.
TEST(WeightCheckTest, SamplesRowsOfFloatMatrices) {
  for (TensorType type : {TensorType::kF32, TensorType::kF16, TensorType::kBF16}) {
    SCOPED_TRACE(gguf::TensorTypeName(type));
    const int row_elems = 64, rows = 1000;
    const size_t row_bytes = ops::RowBytesOf(type, row_elems), elem = row_bytes / row_elems;
    auto poison = [&](std::vector<uint8_t>* bytes, size_t row, size_t i) {
      if (type == TensorType::kF32) {
        const float inf = std::numeric_limits<float>::infinity();
        std::memcpy(bytes->data() + row * row_bytes + i * elem, &inf, 4);
      } else {
        Put16(bytes, row * row_bytes + i * elem, type == TensorType::kF16 ? kF16Inf : kBf16Inf);
      }
    };
    for (size_t row : {size_t{0}, size_t{rows - 1}}) {
      std::vector<uint8_t> bytes;
      gguf::TensorInfo t = ZeroTensor(type, row_elems, rows, &bytes);
      ASSERT_TRUE(CheckWeightsFinite(t).ok());
      poison(&bytes, row, 63);
      const Status s = CheckWeightsFinite(t);
      EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
      EXPECT_NE(s.message().find("row " + std::to_string(row) + " (element 63)"), std::string::npos) << s.message();
    }
    std::vector<uint8_t> bytes;
    gguf::TensorInfo t = ZeroTensor(type, row_elems, rows, &bytes);
    poison(&bytes, 5, 0);  // between the samples 0 and 15
    EXPECT_TRUE(CheckWeightsFinite(t).ok());
    EXPECT_EQ(CheckWeightsFinite(t, /*sample_rows=*/0).code(), StatusCode::kDataLoss);
  }
}

TEST(FiniteTest, FirstNonFinite) {
  std::vector<float> x(1000, 1.0f);
  EXPECT_EQ(FirstNonFinite(x.data(), x.size()), -1);
  x[999] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(FirstNonFinite(x.data(), x.size()), 999);
  x[130] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(FirstNonFinite(x.data(), x.size()), 130);
  x[0] = std::numeric_limits<float>::max();  // large, still finite
  EXPECT_EQ(FirstNonFinite(x.data(), 130), -1);
}

}  // namespace
}  // namespace kvx::model
