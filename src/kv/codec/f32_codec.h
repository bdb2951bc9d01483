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
  static constexpr bool kRowWise = true;

  static size_t DataBytes(const CodecParams& p) {
    return 2 * sizeof(float) * static_cast<size_t>(p.page_tokens) * static_cast<size_t>(p.head_dim);
  }
  static const float* Keys(const uint8_t* data) { return reinterpret_cast<const float*>(data); }
  static const float* Values(const CodecParams& p, const uint8_t* data) {
    return Keys(data) + static_cast<size_t>(p.page_tokens) * p.head_dim;
  }

  static void EncodeRow(const CodecParams& p, uint8_t* data, int slot, const float* k, const float* v) {
    float* keys = reinterpret_cast<float*>(data);
    float* values = keys + static_cast<size_t>(p.page_tokens) * p.head_dim;
    std::memcpy(keys + static_cast<size_t>(slot) * p.head_dim, k, sizeof(float) * p.head_dim);
    std::memcpy(values + static_cast<size_t>(slot) * p.head_dim, v, sizeof(float) * p.head_dim);
  }
  static void EncodePage(const CodecParams& p, uint8_t* data, int n, const float* k, const float* v) {
    for (int j = 0; j < n; ++j) {
      EncodeRow(p, data, j, k + static_cast<size_t>(j) * p.head_dim, v + static_cast<size_t>(j) * p.head_dim);
    }
  }
  static void DecodeKeys(const CodecParams& p, const uint8_t* data, int n, float* k) {
    std::memcpy(k, Keys(data), sizeof(float) * static_cast<size_t>(n) * p.head_dim);
  }
  static void DecodeValues(const CodecParams& p, const uint8_t* data, int n, float* v) {
    std::memcpy(v, Values(p, data), sizeof(float) * static_cast<size_t>(n) * p.head_dim);
  }

  // Portable loops (also the reference for the SIMD ones in tests).
  static void ScoresScalar(const float* keys, int head_dim, int n, const float* q, float* s) {
    for (int j = 0; j < n; ++j) s[j] = DotF32(q, keys + static_cast<size_t>(j) * head_dim, head_dim);
  }
  static void AccumulateValuesScalar(const float* values, int head_dim, int n, const float* p, float* acc) {
    for (int j = 0; j < n; ++j) {
      const float pj = p[j];
      if (pj == 0.0f) continue;  // masked entry (position after the query)
      const float* vj = values + static_cast<size_t>(j) * head_dim;
      for (int c = 0; c < head_dim; ++c) acc[c] += pj * vj[c];
    }
  }

  // The attention inner loops: the multi-query SIMD kernels (AVX-512 or AVX2,
  // simd_x86.h) when available, else scalar. Each row is read once for all
  // query rows.
  static void Scores(const CodecParams& p, const uint8_t* data, int n, const float* q, int nq, float* s, int ss) {
    const int d = p.head_dim;
    if (simd::UseSimd(d)) {
      simd::DotRowsQN(simd::F32Rows{Keys(data), d}, n, d, q, nq, s, ss);
      return;
    }
    for (int r = 0; r < nq; ++r) ScoresScalar(Keys(data), d, n, q + static_cast<size_t>(r) * d, s + static_cast<size_t>(r) * ss);
  }
  static void AccumulateValues(const CodecParams& p, const uint8_t* data, int n, const float* w, int nq, int ws,
                               float* acc) {
    const int d = p.head_dim;
    if (simd::UseSimd(d)) {
      simd::AxpyRowsQN(simd::F32Rows{Values(p, data), d}, n, d, w, nq, ws, acc);
      return;
    }
    for (int r = 0; r < nq; ++r) {
      AccumulateValuesScalar(Values(p, data), d, n, w + static_cast<size_t>(r) * ws, acc + static_cast<size_t>(r) * d);
    }
  }
};

static_assert(PageCodec<F32Codec>);

}  // namespace kvx::kv
