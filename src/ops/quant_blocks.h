// GGUF/ggml block formats for the weight types kvx computes with, and scalar
// decoders for one block. These are the reference decoders: every faster
// kernel (MatMul tiles now, SIMD kernels later) is tested against them.
//
// Layouts (all little-endian, blocks packed back to back, no padding):
//   q8_0  32 elems, 34 B : f16 d | int8 q[32]                 x = d*q
//   q4_0  32 elems, 18 B : f16 d | u8 qs[16]                  x = d*(q-8)
//         element j<16 is the low nibble of qs[j], element j+16 the high nibble.
//   q4_K 256 elems, 144 B: f16 d | f16 dmin | u8 scales[12] | u8 qs[128]
//   q5_K 256 elems, 176 B: f16 d | f16 dmin | u8 scales[12] | u8 qh[32] | u8 qs[128]
//         8 sub-blocks of 32; sub-block j has a 6-bit scale sc_j and 6-bit
//         min m_j (packed, see UnpackScaleMinK4); x = d*sc_j*q - dmin*m_j with
//         q in [0,15] (q4_K) or [0,31] (q5_K). Quants come in 4 groups of 64
//         elements: qs[32*g + l] holds element 64g+l (low nibble) and
//         64g+32+l (high nibble); for q5_K bit 2g (resp. 2g+1) of qh[l] is
//         the 5th bit of element 64g+l (resp. 64g+32+l).
//   q6_K 256 elems, 210 B: u8 ql[128] | u8 qh[64] | int8 scales[16] | f16 d
//         16 sub-blocks of 16, x = d*scale*(q-32), q in [0,63]; two halves of
//         128 elements; in half h, for l<32: element 128h+l+32k (k=0..3) takes
//         its low 4 bits from ql[64h+l] (k=0 low nibble, k=2 high nibble) or
//         ql[64h+32+l] (k=1 low, k=3 high), and its high 2 bits from bits
//         2k..2k+1 of qh[32h+l].
// Arithmetic order in the decoders matches ggml's so decoded floats are
// bit-identical to llama.cpp's.
//
// Thread-safety: pure functions.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "gguf/tensor_type.h"
#include "util/fp16.h"

namespace kvx::ops {

inline constexpr int kQK8_0 = 32, kQ8_0Bytes = 34;
inline constexpr int kQK4_0 = 32, kQ4_0Bytes = 18;
inline constexpr int kQK_K = 256;
inline constexpr int kQ4_KBytes = 144, kQ5_KBytes = 176, kQ6_KBytes = 210;
inline constexpr int kKScaleBytes = 12;  // packed 6-bit scales/mins of q4_K/q5_K

// Block geometry of the types ops/ supports (local copy of the GGUF traits so
// ops/ does not depend on the gguf library's tables). {0, 0} if unsupported.
struct BlockGeometry {
  int block_size;   // elements per block
  int block_bytes;  // bytes per block
};
constexpr BlockGeometry GetBlockGeometry(gguf::TensorType t) {
  using T = gguf::TensorType;
  switch (t) {
    case T::kF32: return {1, 4};
    case T::kF16: return {1, 2};
    case T::kBF16: return {1, 2};
    case T::kQ8_0: return {kQK8_0, kQ8_0Bytes};
    case T::kQ4_0: return {kQK4_0, kQ4_0Bytes};
    case T::kQ4_K: return {kQK_K, kQ4_KBytes};
    case T::kQ5_K: return {kQK_K, kQ5_KBytes};
    case T::kQ6_K: return {kQK_K, kQ6_KBytes};
    default: return {0, 0};
  }
}
// True if ops/ can dequantize / quantize / multiply this type.
constexpr bool IsOpsSupportedType(gguf::TensorType t) { return GetBlockGeometry(t).block_size != 0; }
// Bytes of a row of n elements. REQUIRES: supported type, n % block_size == 0.
constexpr size_t RowBytesOf(gguf::TensorType t, int64_t n) {
  const BlockGeometry g = GetBlockGeometry(t);
  return static_cast<size_t>(n / g.block_size) * static_cast<size_t>(g.block_bytes);
}

// fp16 -> fp32 without branches (so loops over halves vectorize). Equal to
// kvx::Fp16ToFloat for every input except signaling NaNs, which come out quiet.
// Normal/inf/NaN: shift exponent+mantissa into fp32 position (exponent still
// biased by 15), add 224 to the exponent field and multiply by 2^-112: the
// net rebias is +112 = 127 - 15, and exponent 31 (inf/NaN) lands on 255.
// Subnormal (exponent 0): the mantissa m is placed under the exponent of 0.5
// (bits of 2^-1 * (1 + m/2^23) after shifting), so subtracting 0.5 leaves
// exactly m * 2^-24.
inline float HalfToFloat(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;  // exponent+mantissa, sign shifted out
  const float normalized = std::bit_cast<float>((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float denormalized = std::bit_cast<float>((two_w >> 17) | (126u << 23)) - 0.5f;
  // Branch-free select (a mask, not ?:, so loops over halves stay straight-line).
  const uint32_t is_sub = 0u - static_cast<uint32_t>(two_w < (1u << 27));
  const uint32_t magnitude =
      (std::bit_cast<uint32_t>(denormalized) & is_sub) | (std::bit_cast<uint32_t>(normalized) & ~is_sub);
  return std::bit_cast<float>(sign | magnitude);
}

// bf16 is the top half of an fp32.
inline float BfloatToFloat(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

inline float LoadF16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return HalfToFloat(h);
}
inline void StoreF16(uint8_t* p, float f) {
  const uint16_t h = FloatToFp16(f);
  std::memcpy(p, &h, 2);
}

// 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes s:
//   j < 4 : sc = s[j] & 63,                           m = s[j+4] & 63
//   j >= 4: sc = (s[j+4] & 15) | (s[j-4] >> 6) << 4,   m = (s[j+4] >> 4) | (s[j] >> 6) << 4
// i.e. bytes 0..3 hold scales 0..3 plus the top 2 bits of scales 4..7, bytes
// 4..7 hold mins 0..3 plus the top bits of mins 4..7, bytes 8..11 hold the low
// nibbles of scale (low) and min (high) for sub-blocks 4..7.
inline void UnpackScaleMinK4(int j, const uint8_t* s, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}
// Inverse of UnpackScaleMinK4 for all 8 sub-blocks. REQUIRES: values < 64.
inline void PackScaleMinK4(const uint8_t sc[8], const uint8_t m[8], uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
  }
}

inline void DecodeBlockQ8_0(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const int8_t* q = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < kQK8_0; ++j) y[j] = static_cast<float>(q[j]) * d;
}

inline void DecodeBlockQ4_0(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < kQK4_0 / 2; ++j) {
    y[j] = static_cast<float>((qs[j] & 0xF) - 8) * d;
    y[j + kQK4_0 / 2] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

// The k-quant decoders run in two passes: unpack the bit fields into one
// byte per element, then scale each sub-block with one float expression.
// Both passes are simple loops the compiler vectorizes, and the float math is
// exactly ggml's (same products in the same order).

// q4_K (kHighBits = false) and q5_K (kHighBits = true) share everything but
// the 5th quant bit.
template <bool kHighBits>
inline void DecodeBlockQxK(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const float dmin = LoadF16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 4 + kKScaleBytes;                      // q5_K only
  const uint8_t* qs = b + 4 + kKScaleBytes + (kHighBits ? 32 : 0);
  uint8_t q[kQK_K];
  for (int g = 0; g < 4; ++g) {  // groups of 64 = two sub-blocks
    for (int l = 0; l < 32; ++l) {
      q[64 * g + l] = qs[32 * g + l] & 0xF;
      q[64 * g + 32 + l] = qs[32 * g + l] >> 4;
    }
    if constexpr (kHighBits) {
      for (int l = 0; l < 32; ++l) {
        q[64 * g + l] |= ((qh[l] >> (2 * g)) & 1) << 4;
        q[64 * g + 32 + l] |= ((qh[l] >> (2 * g + 1)) & 1) << 4;
      }
    }
  }
  for (int j = 0; j < 8; ++j) {  // sub-blocks of 32: x = (d*sc)*q - dmin*m
    int sc, m;
    UnpackScaleMinK4(j, scales, &sc, &m);
    const float dj = d * static_cast<float>(sc), mj = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) y[32 * j + l] = dj * static_cast<float>(q[32 * j + l]) - mj;
  }
}
inline void DecodeBlockQ4_K(const uint8_t* b, float* y) { DecodeBlockQxK<false>(b, y); }
inline void DecodeBlockQ5_K(const uint8_t* b, float* y) { DecodeBlockQxK<true>(b, y); }

inline void DecodeBlockQ6_K(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = LoadF16(b + 208);
  int8_t q[kQK_K];  // q - 32, in [-32, 31]
  for (int h = 0; h < 2; ++h) {
    const uint8_t* l4 = ql + 64 * h;
    const uint8_t* h2 = qh + 32 * h;
    int8_t* qq = q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      qq[l] = static_cast<int8_t>(((l4[l] & 0xF) | (((h2[l] >> 0) & 3) << 4)) - 32);
      qq[l + 32] = static_cast<int8_t>(((l4[l + 32] & 0xF) | (((h2[l] >> 2) & 3) << 4)) - 32);
      qq[l + 64] = static_cast<int8_t>(((l4[l] >> 4) | (((h2[l] >> 4) & 3) << 4)) - 32);
      qq[l + 96] = static_cast<int8_t>(((l4[l + 32] >> 4) | (((h2[l] >> 6) & 3) << 4)) - 32);
    }
  }
  for (int j = 0; j < 16; ++j) {  // sub-blocks of 16: x = (d*scale)*q
    const float dj = d * static_cast<float>(sc[j]);
    for (int l = 0; l < 16; ++l) y[16 * j + l] = dj * static_cast<float>(q[16 * j + l]);
  }
}

}  // namespace kvx::ops
