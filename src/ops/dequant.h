// Dequantization of GGUF weight rows to float (embedding lookups, tests,
// reference paths). Supported: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K
// (block layouts in ops/quant_blocks.h). Output is bit-identical to ggml's
// dequantize_row_* for the same bytes.
// Thread-safety: pure function.
#pragma once

#include <cstdint>

#include "gguf/tensor_type.h"

namespace kvx::ops {

// Dequantizes n elements of one row starting at src (the row's first block).
// REQUIRES: IsOpsSupportedType(type), n % block_size(type) == 0.
void DequantizeRow(gguf::TensorType type, const void* src, float* dst, int64_t n);

}  // namespace kvx::ops
