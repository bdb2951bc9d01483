// Quantization of float rows into GGUF block formats (F32, F16, BF16, Q8_0,
// Q4_0, Q4_K, Q5_K, Q6_K). The bytes are exact GGUF blocks (layouts in
// ops/quant_blocks.h): llama.cpp decodes them to the same values kvx does.
//
// The scale search is kvx's own and simpler than ggml's (no importance
// matrix): Q8_0 and Q4_0 use the standard max-abs rounding; the k-quants pick
// each sub-block's scale (and min) by a small weighted least-squares search
// over candidate scales, then quantize the sub-block scales to 6/8 bits
// against the super-block scale and re-round the quants with the final scales.
//
// Thread-safety: pure function.
#pragma once

#include <cstdint>

#include "gguf/tensor_type.h"

namespace kvx::ops {

// Quantizes n floats from src into dst (RowBytesOf(type, n) bytes).
// REQUIRES: IsOpsSupportedType(type), n % block_size(type) == 0, finite input.
void QuantizeRow(gguf::TensorType type, const float* src, void* dst, int64_t n);

}  // namespace kvx::ops
