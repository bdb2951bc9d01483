// F32Codec: cache entries stored as float32, exactly as given. The reference
// codec: attention on it matches a dense float computation to rounding.
//
// Data layout (after the page's position header):
//   K[page_tokens][head_dim] float, then V[page_tokens][head_dim] float.
//
// Thread-safety: stateless; concurrent reads of one page are safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kv/codec/codec_id.h"
#include "kv/codec/simd_x86.h"

namespace kvx::kv {

// Deterministic float dot product with 8 independent partial sums (lets the
// compiler vectorise without -ffast-math; summation order is fixed).
inline float DotF32(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  }
  for (; i < n; ++i) acc[i & 7] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

struct F32Codec {
  static constexpr CodecId kId = CodecId::kF32;

  static size_t DataBytes(int page_tokens, int head_dim) {
    return 2 * sizeof(float) * static_cast<size_t>(page_tokens) * static_cast<size_t>(head_dim);
  }
  static const float* Keys(const uint8_t* data) { return reinterpret_cast<const float*>(data); }
  static const float* Values(const uint8_t* data, int page_tokens, int head_dim) {
    return Keys(data) + static_cast<size_t>(page_tokens) * head_dim;
  }

  static void Encode(uint8_t* data, int page_tokens, int head_dim, int slot, const float* k, const float* v) {
    float* keys = reinterpret_cast<float*>(data);
    float* values = keys + static_cast<size_t>(page_tokens) * head_dim;
    std::memcpy(keys + static_cast<size_t>(slot) * head_dim, k, sizeof(float) * head_dim);
    std::memcpy(values + static_cast<size_t>(slot) * head_dim, v, sizeof(float) * head_dim);
  }

  static void Decode(const uint8_t* data, int page_tokens, int head_dim, int slot, float* k, float* v) {
    std::memcpy(k, Keys(data) + static_cast<size_t>(slot) * head_dim, sizeof(float) * head_dim);
    std::memcpy(v, Values(data, page_tokens, head_dim) + static_cast<size_t>(slot) * head_dim,
                sizeof(float) * head_dim);
  }

  // Portable loops (also the reference for the SIMD ones in tests).
  static void ScoresScalar(const uint8_t* data, int page_tokens, int head_dim, int n, const float* q, float* s) {
    const float* keys = Keys(data);
    for (int j = 0; j < n; ++j) s[j] = DotF32(q, keys + static_cast<size_t>(j) * head_dim, head_dim);
  }

  static void AccumulateValuesScalar(const uint8_t* data, int page_tokens, int head_dim, int n,
                                     const float* p, float* acc) {
    const float* values = Values(data, page_tokens, head_dim);
    for (int j = 0; j < n; ++j) {
      const float pj = p[j];
      if (pj == 0.0f) continue;  // masked entry (position after the query)
      const float* vj = values + static_cast<size_t>(j) * head_dim;
      for (int c = 0; c < head_dim; ++c) acc[c] += pj * vj[c];
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

static_assert(PageCodec<F32Codec>);

}  // namespace kvx::kv
