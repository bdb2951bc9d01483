// Finding the values that cannot be right: NaN and infinity in float data
// (weights at load, logits at run time). Integer tests on the bit patterns,
// so they hold under any floating-point mode and cost one pass over memory.
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kvx {

// Whether an IEEE single (f32) bit pattern is NaN or infinite.
inline bool F32BitsNonFinite(uint32_t u) { return (u & 0x7F800000u) == 0x7F800000u; }
// Whether an IEEE half (f16) bit pattern is NaN or infinite (exponent all ones).
inline bool Fp16BitsNonFinite(uint16_t h) { return (h & 0x7C00u) == 0x7C00u; }
// The same for bfloat16.
inline bool Bf16BitsNonFinite(uint16_t b) { return (b & 0x7F80u) == 0x7F80u; }

// Index of the first NaN or infinite value among x[0, n), or -1 when all are
// finite.
inline int64_t FirstNonFinite(const float* x, size_t n) {
  // Blocks of 64 reduced without branches, so the loop vectorizes: adding 1
  // to the exponent field (sign masked off) carries into bit 31 exactly when
  // the exponent is all ones. Then the culprit is found within its block.
  constexpr size_t kBlock = 64;
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t len = n - b < kBlock ? n - b : kBlock;
    uint32_t bits[kBlock] = {};
    std::memcpy(bits, x + b, len * sizeof(float));
    uint32_t carry = 0;
    for (size_t i = 0; i < kBlock; ++i) carry |= (bits[i] & 0x7F800000u) + 0x00800000u;
    if ((carry & 0x80000000u) == 0) continue;
    for (size_t i = 0; i < len; ++i) {
      if (F32BitsNonFinite(bits[i])) return static_cast<int64_t>(b + i);
    }
  }
  return -1;
}

}  // namespace kvx
