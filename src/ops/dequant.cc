#include "ops/dequant.h"

#include <algorithm>
#include <cstring>

#include "ops/quant_blocks.h"
#include "util/check.h"

namespace kvx::ops {

void DequantizeRow(gguf::TensorType type, const void* src, float* dst, int64_t n) {
  using T = gguf::TensorType;
  const BlockGeometry g = GetBlockGeometry(type);
  KVX_CHECK_MSG(g.block_size != 0, "DequantizeRow: unsupported tensor type");
  KVX_CHECK(n % g.block_size == 0);
  const uint8_t* p = static_cast<const uint8_t*>(src);
  const int64_t nb = n / g.block_size;
  switch (type) {
    case T::kF32:
      std::memcpy(dst, p, static_cast<size_t>(n) * 4);
      return;
    case T::kF16:
    case T::kBF16: {
      // Copy to aligned halves in chunks, then convert with fixed-trip loops
      // (vectorized); HalfToFloat equals Fp16ToFloat bit for bit (except for
      // signaling-NaN payloads).
      constexpr int64_t kStep = 256;
      uint16_t h[kStep];
      for (int64_t i0 = 0; i0 < n; i0 += kStep) {
        const int64_t len = std::min(kStep, n - i0);
        std::memcpy(h, p + 2 * i0, static_cast<size_t>(2 * len));
        float* out = dst + i0;
        int64_t i = 0;
        if (type == T::kF16) {
          for (; i + 16 <= len; i += 16) {
            for (int k = 0; k < 16; ++k) out[i + k] = HalfToFloat(h[i + k]);
          }
          for (; i < len; ++i) out[i] = HalfToFloat(h[i]);
        } else {
          for (; i + 16 <= len; i += 16) {
            for (int k = 0; k < 16; ++k) out[i + k] = BfloatToFloat(h[i + k]);
          }
          for (; i < len; ++i) out[i] = BfloatToFloat(h[i]);
        }
      }
      return;
    }
    case T::kQ8_0:
      for (int64_t i = 0; i < nb; ++i) DecodeBlockQ8_0(p + i * kQ8_0Bytes, dst + i * kQK8_0);
      return;
    case T::kQ4_0:
      for (int64_t i = 0; i < nb; ++i) DecodeBlockQ4_0(p + i * kQ4_0Bytes, dst + i * kQK4_0);
      return;
    case T::kQ4_K:
      for (int64_t i = 0; i < nb; ++i) DecodeBlockQ4_K(p + i * kQ4_KBytes, dst + i * kQK_K);
      return;
    case T::kQ5_K:
      for (int64_t i = 0; i < nb; ++i) DecodeBlockQ5_K(p + i * kQ5_KBytes, dst + i * kQK_K);
      return;
    case T::kQ6_K:
      for (int64_t i = 0; i < nb; ++i) DecodeBlockQ6_K(p + i * kQ6_KBytes, dst + i * kQK_K);
      return;
    default:
      KVX_CHECK_MSG(false, "DequantizeRow: unsupported tensor type");
  }
}

}  // namespace kvx::ops
