// Scalar IEEE half (fp16) and bfloat16 conversions, bit-exact with the
// hardware/ggml conversions (round-to-nearest-even, NaN/Inf/subnormals kept).
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <cstring>

namespace kvx {

inline float BitsToFloat(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t FloatToBits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

inline float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0) {
    if (mant == 0) return BitsToFloat(sign);
    // Subnormal: normalise.
    int e = -1;
    do { ++e; mant <<= 1; } while ((mant & 0x400u) == 0);
    mant &= 0x3FFu;
    return BitsToFloat(sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13));
  }
  if (exp == 31) return BitsToFloat(sign | 0x7F800000u | (mant << 13));
  return BitsToFloat(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

inline uint16_t FloatToFp16(float f) {
  uint32_t x = FloatToBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7FFFFFFFu;
  if (x >= 0x7F800000u) {  // Inf or NaN
    return sign | 0x7C00u | (x > 0x7F800000u ? 0x200u : 0u);
  }
  if (x >= 0x477FF000u) return sign | 0x7C00u;  // rounds to >= 65520: overflow
  if (x < 0x38800000u) {  // below smallest normal half (2^-14): subnormal or zero
    if (x < 0x33000000u) return sign;  // < 2^-25 rounds to zero
    const uint32_t e = x >> 23;
    const uint32_t m = (x & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14 + (113-e) ... yields m >> (e-dependent)
    // value = m * 2^(e-150); half subnormal unit = 2^-24 -> q = m >> (126-e)
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return sign | static_cast<uint16_t>(q);
  }
  // Normal: rebias exponent, round mantissa to 10 bits (nearest even).
  uint32_t r = x - 0x38000000u;  // (127-15) << 23
  const uint32_t lsb = (r >> 13) & 1u;
  r += 0xFFFu + lsb;
  return sign | static_cast<uint16_t>(r >> 13);
}

inline float Bf16ToFloat(uint16_t b) { return BitsToFloat(static_cast<uint32_t>(b) << 16); }

inline uint16_t FloatToBf16(float f) {
  uint32_t x = FloatToBits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace kvx
