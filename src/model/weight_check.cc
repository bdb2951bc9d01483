#include "model/weight_check.h"

#include <cstring>
#include <vector>

#include "ops/quant_blocks.h"
#include "util/finite.h"
#include "util/printable.h"

namespace kvx::model {

namespace {

using gguf::TensorType;

uint16_t Load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Offsets of the f16 scales within one block of a quantized type (empty for
// the float types, whose every element is checked instead).
std::vector<int> ScaleOffsets(TensorType type) {
  switch (type) {
    case TensorType::kQ8_0:
    case TensorType::kQ4_0: return {0};         // d
    case TensorType::kQ4_K:
    case TensorType::kQ5_K: return {0, 2};      // d, dmin
    case TensorType::kQ6_K: return {ops::kQ6_KBytes - 2};  // d, after ql, qh and the int8 scales
    default: return {};
  }
}

// Index of the first non-finite element of a float row, or -1.
int64_t FirstNonFiniteInRow(TensorType type, const uint8_t* row, int64_t n) {
  if (type == TensorType::kF32) return FirstNonFinite(reinterpret_cast<const float*>(row), static_cast<size_t>(n));
  const bool bf16 = type == TensorType::kBF16;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = Load16(row + 2 * i);
    if (bf16 ? Bf16BitsNonFinite(h) : Fp16BitsNonFinite(h)) return i;
  }
  return -1;
}

Status NonFinite(const gguf::TensorInfo& t, uint64_t row, const std::string& what) {
  return DataLoss("tensor " + QuotePrintable(t.name) + " (" + gguf::TensorTypeName(t.type) + ") holds a NaN or "
                  "infinite value in row " + std::to_string(row) + " (" + what +
                  "): the model file is corrupt; convert or download it again");
}

}  // namespace

Status CheckWeightsFinite(const gguf::TensorInfo& t, int sample_rows) {
  const ops::BlockGeometry g = ops::GetBlockGeometry(t.type);
  if (g.block_size == 0 || t.dims.empty() || t.data == nullptr) return Status::Ok();  // not a weight kvx computes with
  const int64_t row_elems = static_cast<int64_t>(t.dims[0]);
  const uint64_t n_rows = row_elems > 0 ? t.n_elements / static_cast<uint64_t>(row_elems) : 0;
  const size_t row_bytes = ops::RowBytesOf(t.type, row_elems);
  const std::vector<int> scales = ScaleOffsets(t.type);
  if (!scales.empty()) {
    // Every block's scales: the tensor is one run of blocks.
    const uint64_t n_blocks = t.n_elements / static_cast<uint64_t>(g.block_size);
    for (uint64_t b = 0; b < n_blocks; ++b) {
      const uint8_t* block = t.data + b * static_cast<uint64_t>(g.block_bytes);
      for (int off : scales) {
        if (Fp16BitsNonFinite(Load16(block + off))) {
          const uint64_t per_row = static_cast<uint64_t>(row_elems / g.block_size);
          return NonFinite(t, b / per_row, "the f16 scale at byte " + std::to_string(off) + " of block " +
                                               std::to_string(b % per_row));
        }
      }
    }
    return Status::Ok();
  }
  // Float matrices: a sample of whole rows, evenly spaced.
  const uint64_t checked = sample_rows <= 0 || static_cast<uint64_t>(sample_rows) >= n_rows
                               ? n_rows
                               : static_cast<uint64_t>(sample_rows);
  for (uint64_t k = 0; k < checked; ++k) {
    const uint64_t row = checked == n_rows || checked == 1 ? k : k * (n_rows - 1) / (checked - 1);
    const int64_t at = FirstNonFiniteInRow(t.type, t.data + row * row_bytes, row_elems);
    if (at >= 0) return NonFinite(t, row, "element " + std::to_string(at));
  }
  return Status::Ok();
}

}  // namespace kvx::model
