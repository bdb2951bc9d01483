#include "ops/dequant.h"

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
      for (int64_t i = 0; i < n; ++i) dst[i] = LoadF16(p + 2 * i);
      return;
    case T::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, p + 2 * i, 2);
        dst[i] = Bf16ToFloat(b);
      }
      return;
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
