// F16Codec: K and V stored as IEEE half, rounded to nearest even (the same
// conversion as ggml's f16 KV cache, util/fp16.h). Attention converts back to
// float and accumulates in float, as llama.cpp's f16 cache path does
// (its Q is also rounded to f16 for the K*Q matmul in some backends; we keep q
// in float, which is slightly more accurate and costs nothing here).
//
// Data layout (after the page's position header), T = page_tokens, d = head_dim:
//   K^T[d][T]  f16 bits, channel-major: kt[c * T + j] is channel c of entry j;
//   V[T][d]    f16 bits, row-major.
// Keys are transposed because scoring reads them as "channel c of the next 16
// entries" (one vector per channel, no horizontal sums; simd::DotColumnsF16)
// while values are accumulated row by row (acc += w_j v_j), which wants rows.
//
// Thread-safety: stateless; concurrent reads of one page are safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

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

struct F16Codec {
  static constexpr bool kRowWise = true;

  static size_t DataBytes(const CodecParams& p) {
    return 2 * sizeof(uint16_t) * static_cast<size_t>(p.page_tokens) * static_cast<size_t>(p.head_dim);
  }
  static const uint16_t* Keys(const uint8_t* data) { return reinterpret_cast<const uint16_t*>(data); }
  static const uint16_t* Values(const CodecParams& p, const uint8_t* data) {
    return Keys(data) + static_cast<size_t>(p.page_tokens) * p.head_dim;
  }

  static void EncodeRow(const CodecParams& p, uint8_t* data, int slot, const float* k, const float* v) {
    const int d = p.head_dim, T = p.page_tokens;
    uint16_t* keys = reinterpret_cast<uint16_t*>(data) + slot;
    uint16_t* values = reinterpret_cast<uint16_t*>(data) + static_cast<size_t>(T + slot) * d;
    // Vector conversion, the same bits: a prefill appends every token of
    // every layer here, and the scalar conversion was ~8% of its time.
    constexpr int kMaxSimdDim = 512;
    if (d <= kMaxSimdDim && simd::UseSimd(d)) {
      uint16_t kh[kMaxSimdDim];
      simd::FloatToHalf(k, d, kh);
      for (int c = 0; c < d; ++c) keys[static_cast<size_t>(c) * T] = kh[c];
      simd::FloatToHalf(v, d, values);
      return;
    }
    for (int c = 0; c < d; ++c) keys[static_cast<size_t>(c) * T] = FloatToFp16(k[c]);
    for (int c = 0; c < d; ++c) values[c] = FloatToFp16(v[c]);
  }
  static void EncodePage(const CodecParams& p, uint8_t* data, int n, const float* k, const float* v) {
    for (int j = 0; j < n; ++j) {
      EncodeRow(p, data, j, k + static_cast<size_t>(j) * p.head_dim, v + static_cast<size_t>(j) * p.head_dim);
    }
  }
  // Row-major floats from the transposed keys (page conversion, pre-RoPE
  // scoring and tests; attention scores the keys in place).
  static void DecodeKeys(const CodecParams& p, const uint8_t* data, int n, float* k) {
    const int d = p.head_dim, T = p.page_tokens;
    const uint16_t* keys = Keys(data);
    for (int c = 0; c < d; ++c) {
      const uint16_t* col = keys + static_cast<size_t>(c) * T;
      for (int j = 0; j < n; ++j) k[static_cast<size_t>(j) * d + c] = HalfToFloatFast(col[j]);
    }
  }
  static void DecodeValues(const CodecParams& p, const uint8_t* data, int n, float* v) {
    const uint16_t* values = Values(p, data);
    for (size_t i = 0; i < static_cast<size_t>(n) * p.head_dim; ++i) v[i] = HalfToFloatFast(values[i]);
  }

  // Portable loops (also the reference for the SIMD ones in tests). Scores
  // sum 4 partial dots over the channels c = u (mod 4), (p0 + p1) + (p2 + p3),
  // the order of the SIMD kernels (they differ only by FMA rounding).
  static void ScoresScalar(const uint16_t* kt, int head_dim, int T, int n, const float* q, float* s) {
    for (int j = 0; j < n; ++j) {
      float part[4] = {0, 0, 0, 0};
      for (int c = 0; c < head_dim; ++c) part[c & 3] += q[c] * HalfToFloatFast(kt[static_cast<size_t>(c) * T + j]);
      s[j] = (part[0] + part[1]) + (part[2] + part[3]);
    }
  }
  static void AccumulateValuesScalar(const uint16_t* values, int head_dim, int n, const float* p, float* acc) {
    for (int j = 0; j < n; ++j) {
      const float pj = p[j];
      if (pj == 0.0f) continue;  // masked entry (position after the query)
      const uint16_t* vj = values + static_cast<size_t>(j) * head_dim;
      for (int c = 0; c < head_dim; ++c) acc[c] += pj * HalfToFloatFast(vj[c]);
    }
  }

  // The attention inner loops: AVX-512 or AVX2/F16C when available
  // (simd_x86.h, simd_avx512.h, simd_avx512_columns.h), else scalar. The
  // SIMD kernels convert each key channel / value row once for all query rows.
  static void Scores(const CodecParams& p, const uint8_t* data, int n, const float* q, int nq, float* s, int ss) {
    const int d = p.head_dim, T = p.page_tokens;
    if (simd::UseSimd(d) && simd::DotColumnsF16(Keys(data), T, n, d, q, nq, s, ss)) return;
    for (int r = 0; r < nq; ++r) {
      ScoresScalar(Keys(data), d, T, n, q + static_cast<size_t>(r) * d, s + static_cast<size_t>(r) * ss);
    }
  }
  // Whether AttendRun runs here (CPU and shape); else the caller takes the
  // general path (Scores, a softmax step, AccumulateValues).
  static bool HasAttendRun(const CodecParams& p) {
    return simd::UseSimd(p.head_dim) && simd::HasF16DecodePages(p.page_tokens, p.head_dim);
  }
  // Attention over a run of f16 pages in one fused kernel (scores, online
  // softmax step and values per 16 entries, in registers): pages[i] is a
  // page's start (positions, then this codec's data), each holding T entries
  // but the last (m_last), page_bytes long. Each entry is folded into the
  // online-softmax state (mx, sum, acc [nq][d]) of every row r < nq that
  // sees it (position <= qpos[r]). Pages are prefetched two ahead; `after`
  // (after_bytes long, may be null), the page the caller visits next, during
  // the last but one. Rows of several queries (a prompt's block) take the
  // prompt kernel instead (32 entries per step, no prefetching:
  // simd_avx512_prompt.h), which with `tap` (may be null) also leaves its
  // weights there for an observer (codec_id.h, WeightTap).
  // REQUIRES: HasAttendRun(p); with a tap, HasTappedAttendRun(p, qpos, nq).
  static void AttendRun(const CodecParams& p, const uint8_t* const* pages, int n_pages, int m_last, size_t page_bytes,
                        const float* q, const int32_t* qpos, int nq, float* mx, float* sum, float* acc,
                        const uint8_t* after, size_t after_bytes, const WeightTap* tap = nullptr) {
    simd::F16DecodePages(pages, n_pages, m_last, p.page_tokens, p.head_dim, p.head_dim, page_bytes, q, qpos, nq, mx,
                         sum, acc, after, after_bytes, tap);
  }
  // Whether AttendRun can tap these rows' weights (the prompt kernel runs).
  static bool HasTappedAttendRun(const CodecParams& p, const int32_t* qpos, int nq) {
    return HasAttendRun(p) && simd::F16PromptPagesApply(p.head_dim, p.head_dim, qpos, nq);
  }
  static void AccumulateValues(const CodecParams& p, const uint8_t* data, int n, const float* w, int nq, int ws,
                               float* acc) {
    AccumulateValueRows(Values(p, data), p.head_dim, n, w, nq, ws, acc);
  }
  // The page as a key block then a value block, for ThinK's pruned pages
  // (kv/pruned_keys.h): this codec's key block at head_dim = the stored key
  // rows, then its value block at the layer's head_dim. Key blocks start
  // at the page's data, so Scores and DecodeKeys read them as they are.
  static int KeyChannelMultiple(const CodecParams&) { return 8; }  // the SIMD column kernels
  static size_t KeyBlockBytes(const CodecParams& p) {
    return sizeof(uint16_t) * static_cast<size_t>(p.page_tokens) * static_cast<size_t>(p.head_dim);
  }
  static size_t ValueBlockOffset(const CodecParams& p) { return KeyBlockBytes(p); }
  static size_t ValueBlockBytes(const CodecParams& p) { return KeyBlockBytes(p); }
  static void EncodeKeyRow(const CodecParams& p, uint8_t* keys, int slot, const float* k) {
    uint16_t* col = reinterpret_cast<uint16_t*>(keys) + slot;
    for (int c = 0; c < p.head_dim; ++c) col[static_cast<size_t>(c) * p.page_tokens] = FloatToFp16(k[c]);
  }
  static void EncodeValueRow(const CodecParams& p, uint8_t* values, int slot, const float* v) {
    uint16_t* row = reinterpret_cast<uint16_t*>(values) + static_cast<size_t>(slot) * p.head_dim;
    for (int c = 0; c < p.head_dim; ++c) row[c] = FloatToFp16(v[c]);
  }
  static void CopyKeyRow(const CodecParams& p, const uint8_t* from, int from_slot, uint8_t* to, int to_slot) {
    const uint16_t* src = reinterpret_cast<const uint16_t*>(from) + from_slot;
    uint16_t* dst = reinterpret_cast<uint16_t*>(to) + to_slot;
    for (int c = 0; c < p.head_dim; ++c) dst[static_cast<size_t>(c) * p.page_tokens] = src[static_cast<size_t>(c) * p.page_tokens];
  }
  static void CopyValueRow(const CodecParams& p, const uint8_t* from, int from_slot, uint8_t* to, int to_slot) {
    const size_t d = static_cast<size_t>(p.head_dim);
    std::memcpy(to + sizeof(uint16_t) * to_slot * d, from + sizeof(uint16_t) * from_slot * d, sizeof(uint16_t) * d);
  }
  static void DecodeValueBlock(const CodecParams& p, const uint8_t* values, int n, float* v) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(values);
    for (size_t i = 0; i < static_cast<size_t>(n) * p.head_dim; ++i) v[i] = HalfToFloatFast(h[i]);
  }
  static void AccumulateValueBlock(const CodecParams& p, const uint8_t* values, int n, const float* w, int nq, int ws,
                                   float* acc) {
    AccumulateValueRows(reinterpret_cast<const uint16_t*>(values), p.head_dim, n, w, nq, ws, acc);
  }
  // AccumulateValues over f16 value rows [n][d] wherever they are (ThinK's
  // pruned pages keep their values in this layout after shorter keys).
  static void AccumulateValueRows(const uint16_t* values, int d, int n, const float* w, int nq, int ws, float* acc) {
    if (simd::UseSimd(d)) {
      simd::AxpyRowsQN(simd::F16Rows{values, d}, n, d, w, nq, ws, acc);
      return;
    }
    for (int r = 0; r < nq; ++r) {
      AccumulateValuesScalar(values, d, n, w + static_cast<size_t>(r) * ws, acc + static_cast<size_t>(r) * d);
    }
  }
};

static_assert(PageCodec<F16Codec>);

}  // namespace kvx::kv
