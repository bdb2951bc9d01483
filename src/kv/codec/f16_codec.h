// F16Codec: K and V stored as IEEE half, rounded to nearest even (the same
// conversion as ggml's f16 KV cache, util/fp16.h). Attention converts back to
// float and accumulates in float, as llama.cpp's f16 cache path does
// (its Q is also rounded to f16 for the K*Q matmul in some backends; we keep q
// in float, which is slightly more accurate and costs nothing here).
//
// Data layout (after the page's position header):
//   K[page_tokens][head_dim] f16 bits, then V[page_tokens][head_dim] f16 bits.
//
// Thread-safety: stateless; concurrent reads of one page are safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kv/codec/codec_id.h"
#include "kv/codec/simd_x86.h"
#include "util/fp16.h"

namespace kvx::kv {

// Bit-exact equivalent of Fp16ToFloat (util/fp16.h) without the subnormal
// normalisation loop, so it stays cheap and branch-light in the hot loop
// (F. Giesen's "half_to_float_fast" magic-number method). Tested exhaustively
// against Fp16ToFloat in codec_test.cc.
inline float HalfToFloatFast(uint16_t h) {
  uint32_t o = static_cast<uint32_t>(h & 0x7FFFu) << 13;  // exponent + mantissa
  const uint32_t exp = o & 0x0F800000u;
  o += 0x38000000u;                                 // rebias exponent 15 -> 127
  if (exp == 0x0F800000u) o += 0x38000000u;         // Inf/NaN: exponent to 255
  float f = BitsToFloat(o);
  if (exp == 0) f = BitsToFloat(o + 0x00800000u) - BitsToFloat(0x38800000u);  // zero/subnormal
  return BitsToFloat(FloatToBits(f) | (static_cast<uint32_t>(h & 0x8000u) << 16));
}

// Deterministic dot of float q with an f16 row (fixed summation order).
inline float DotF32F16(const float* a, const uint16_t* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * HalfToFloatFast(b[i + l]);
  }
  for (; i < n; ++i) acc[i & 7] += a[i] * HalfToFloatFast(b[i]);
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

struct F16Codec {
  static constexpr CodecId kId = CodecId::kF16;

  static size_t DataBytes(int page_tokens, int head_dim) {
    return 2 * sizeof(uint16_t) * static_cast<size_t>(page_tokens) * static_cast<size_t>(head_dim);
  }
  static const uint16_t* Keys(const uint8_t* data) { return reinterpret_cast<const uint16_t*>(data); }
  static const uint16_t* Values(const uint8_t* data, int page_tokens, int head_dim) {
    return Keys(data) + static_cast<size_t>(page_tokens) * head_dim;
  }

  static void Encode(uint8_t* data, int page_tokens, int head_dim, int slot, const float* k, const float* v) {
    uint16_t* keys = reinterpret_cast<uint16_t*>(data) + static_cast<size_t>(slot) * head_dim;
    uint16_t* values = reinterpret_cast<uint16_t*>(data) +
                       static_cast<size_t>(page_tokens + slot) * head_dim;
    for (int c = 0; c < head_dim; ++c) keys[c] = FloatToFp16(k[c]);
    for (int c = 0; c < head_dim; ++c) values[c] = FloatToFp16(v[c]);
  }

  static void Decode(const uint8_t* data, int page_tokens, int head_dim, int slot, float* k, float* v) {
    const uint16_t* keys = Keys(data) + static_cast<size_t>(slot) * head_dim;
    const uint16_t* values = Values(data, page_tokens, head_dim) + static_cast<size_t>(slot) * head_dim;
    for (int c = 0; c < head_dim; ++c) k[c] = HalfToFloatFast(keys[c]);
    for (int c = 0; c < head_dim; ++c) v[c] = HalfToFloatFast(values[c]);
  }

  // Portable loops (also the reference for the SIMD ones in tests).
  static void ScoresScalar(const uint8_t* data, int page_tokens, int head_dim, int n, const float* q, float* s) {
    const uint16_t* keys = Keys(data);
    for (int j = 0; j < n; ++j) s[j] = DotF32F16(q, keys + static_cast<size_t>(j) * head_dim, head_dim);
  }

  static void AccumulateValuesScalar(const uint8_t* data, int page_tokens, int head_dim, int n,
                                     const float* p, float* acc) {
    const uint16_t* values = Values(data, page_tokens, head_dim);
    for (int j = 0; j < n; ++j) {
      const float pj = p[j];
      if (pj == 0.0f) continue;  // masked entry (position after the query)
      const uint16_t* vj = values + static_cast<size_t>(j) * head_dim;
      for (int c = 0; c < head_dim; ++c) acc[c] += pj * HalfToFloatFast(vj[c]);
    }
  }

  // The attention inner loops: AVX2/F16C when available (simd_x86.h), else scalar.
  static void Scores(const uint8_t* data, int page_tokens, int head_dim, int n, const float* q, float* s) {
    if (simd::UseSimd(head_dim)) {
      simd::DotRows(q, Keys(data), n, head_dim, s);
    } else {
      ScoresScalar(data, page_tokens, head_dim, n, q, s);
    }
  }
  static void AccumulateValues(const uint8_t* data, int page_tokens, int head_dim, int n, const float* p,
                               float* acc) {
    if (simd::UseSimd(head_dim)) {
      simd::AxpyRows(Values(data, page_tokens, head_dim), n, head_dim, p, acc);
    } else {
      AccumulateValuesScalar(data, page_tokens, head_dim, n, p, acc);
    }
  }
};

static_assert(PageCodec<F16Codec>);

}  // namespace kvx::kv
