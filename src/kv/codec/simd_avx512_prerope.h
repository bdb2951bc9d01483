// AVX-512 scores over pre-RoPE keys (KVQuant's prerope=1, kv/prerope_scores.h):
// a page's keys are decoded 16 entries at a time into a channel-major block
// (channel c of the 16 entries in one zmm), rotated back out of the Hadamard
// basis when the cache rotates its keys, roped at their in-page offsets and
// dotted with the queries, so the 16 scores come out of FMAs as one vector.
//
// Why channel-major: every step is then vertical. The inverse Hadamard
// transform's butterflies combine two channel rows (a + b, a - b of 16
// entries: no shuffles); RoPE combines the two channels of a pair with
// per-entry cos/sin columns; the dot is one FMA per (query row, channel).
// Decoding each key to a row, transforming it, roping it and dotting it
// (the reference path) spent most of a kivi2 decode step in scalar
// butterflies and per-key horizontal sums (docs/kv-quantization.md,
// "Where the time of pre-RoPE decode went").
//
// Only kv/prerope_scores.h includes it (after simd_x86.h, whose helpers it
// uses), so that a change here rebuilds one kernel, not every user of
// simd_x86.h.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kv/codec/simd_x86.h"

#ifdef KVX_KV_HAVE_X86_SIMD

#define KVX_KV_AVX512 __attribute__((target(KVX_KV_AVX512_FEATURES)))
#define KVX_KV_UNROLL _Pragma("GCC unroll 16")

namespace kvx::kv::simd::avx512 {

// Channel c of the 16 entries at j0 of channel-major f16 keys kt[c * T + j].
struct F16KeyColumns {
  const uint16_t* kt;
  int T;
  KVX_KV_AVX512 __m512 Load(int c, int j0) const { return CvtPh(kt + static_cast<size_t>(c) * T + j0); }
};

// The same of channel-major B-bit codes (ChannelTensor: column c at
// codes + c * cb, entry j in byte j % cb at bit shift B * (j / cb)) with
// per-channel float scale and min: x = min_c + scale_c * code.
// REQUIRES: cb % 16 == 0 (a 16-entry block lies in one plane).
template <int B>
struct CodeKeyColumns {
  const uint8_t* codes;
  int cb;
  const float* scale;
  const float* min;
  KVX_KV_AVX512 __m512 Load(int c, int j0) const {
    const int plane = j0 / cb, off = j0 % cb;
    __m512i v = CvtU8(codes + static_cast<size_t>(c) * cb + off);
    if (B < 8) {
      // (zero-masked spelling: see CvtPh)
      v = _mm512_and_si512(_mm512_maskz_srl_epi32(0xFFFF, v, _mm_cvtsi32_si128(plane * B)), _mm512_set1_epi32((1 << B) - 1));
    }
    return _mm512_fmadd_ps(CvtI32(v), _mm512_set1_ps(scale[c]), _mm512_set1_ps(min[c]));
  }
};

// What turns a decoded key block into roped keys.
struct PreRopeShape {
  int d;                  // channels (head_dim); REQUIRES d % 16 == 0, d <= kMaxPreRopeDim
  int n_dims;             // roped channels (even, <= d)
  bool neox;              // pairs (i, i + n_dims/2) instead of (2i, 2i + 1)
  int hadamard_block;     // > 0: keys stored Hadamard-rotated in blocks of this many channels (a power of two)
  const float* unrotate;  // [d] the per-channel factor after the butterflies (sign / sqrt(B); 1 without rotation)
  const float* cos;       // [n_dims / 2][cs_stride]: cos of pair i at each entry's offset
  const float* sin;       // likewise sin
  int cs_stride;
};
inline constexpr int kMaxPreRopeDim = 256;

// In-place butterflies (a, b) -> (a + b, a - b) of spans s, 2s, .. (K - 1)s
// on the K rows x[0], x[s], .. x[(K - 1)s], in registers.
template <int K>
KVX_KV_AVX512 __attribute__((always_inline)) inline void ButterflyGroup(__m512* x, int s) {
  __m512 r[K];
  KVX_KV_UNROLL
  for (int k = 0; k < K; ++k) r[k] = x[k * s];
  KVX_KV_UNROLL
  for (int len = 1; len < K; len <<= 1) {
    KVX_KV_UNROLL
    for (int k = 0; k < K; ++k) {
      if (k & len) continue;
      const __m512 a = r[k], b = r[k + len];
      r[k] = _mm512_add_ps(a, b);
      r[k + len] = _mm512_sub_ps(a, b);
    }
  }
  KVX_KV_UNROLL
  for (int k = 0; k < K; ++k) x[k * s] = r[k];
}

// The unnormalized Walsh-Hadamard transform of each block of B channel
// rows (B a power of two, >= 2): its log2(B) butterfly stages in passes of
// up to three (groups of 8 rows in registers), so a 64-channel block takes
// two passes over the rows instead of six.
KVX_KV_AVX512 inline void ButterflyRows(__m512* x, int d, int B) {
  for (int s = 1; s < B;) {
    const int k = std::min(8, B / s);
    for (int b0 = 0; b0 < d; b0 += B) {
      for (int hi = b0; hi < b0 + B; hi += s * k) {
        for (int lo = 0; lo < s; ++lo) {
          switch (k) {
            case 8: ButterflyGroup<8>(x + hi + lo, s); break;
            case 4: ButterflyGroup<4>(x + hi + lo, s); break;
            default: ButterflyGroup<2>(x + hi + lo, s); break;
          }
        }
      }
    }
    s *= k;
  }
}

// s[r * ss + j] = q_r . RoPE(offset_j, Q^-1 k_j) for r < NR, j < m: the
// page's keys from `src` (Q^-1 only with sh.hadamard_block). Each row's
// score sums the pairs in order into two accumulators (pair channels a and
// b), then the unroped channels, a fixed order: deterministic, and within
// rounding of the reference path.
template <int NR, class Src>
KVX_KV_AVX512 inline void PreRopeScores(const Src& src, int m, const PreRopeShape& sh, const float* q, float* s,
                                        int ss) {
  const int d = sh.d, half = sh.n_dims / 2;
  alignas(64) __m512 x[kMaxPreRopeDim];
  for (int j0 = 0; j0 < m; j0 += 16) {
    for (int c = 0; c < d; ++c) x[c] = src.Load(c, j0);
    if (sh.hadamard_block > 0) ButterflyRows(x, d, sh.hadamard_block);
    __m512 acc_a[NR], acc_b[NR];
    KVX_KV_UNROLL
    for (int r = 0; r < NR; ++r) acc_a[r] = acc_b[r] = _mm512_setzero_ps();
    for (int i = 0; i < half; ++i) {
      const int a = sh.neox ? i : 2 * i, b = sh.neox ? i + half : 2 * i + 1;
      const __m512 cs = _mm512_loadu_ps(sh.cos + static_cast<size_t>(i) * sh.cs_stride + j0);
      const __m512 sn = _mm512_loadu_ps(sh.sin + static_cast<size_t>(i) * sh.cs_stride + j0);
      // Q^-1's per-channel factor, then (x_a, x_b) -> (x_a cos - x_b sin, x_a sin + x_b cos)
      const __m512 xa = _mm512_mul_ps(x[a], _mm512_set1_ps(sh.unrotate[a]));
      const __m512 xb = _mm512_mul_ps(x[b], _mm512_set1_ps(sh.unrotate[b]));
      const __m512 ka = _mm512_fmsub_ps(xa, cs, _mm512_mul_ps(xb, sn));
      const __m512 kb = _mm512_fmadd_ps(xa, sn, _mm512_mul_ps(xb, cs));
      KVX_KV_UNROLL
      for (int r = 0; r < NR; ++r) {
        acc_a[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[static_cast<size_t>(r) * d + a]), ka, acc_a[r]);
        acc_b[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[static_cast<size_t>(r) * d + b]), kb, acc_b[r]);
      }
    }
    for (int c = sh.n_dims; c < d; ++c) {
      KVX_KV_UNROLL
      for (int r = 0; r < NR; ++r) {
        const __m512 xc = _mm512_mul_ps(x[c], _mm512_set1_ps(sh.unrotate[c]));
        acc_b[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[static_cast<size_t>(r) * d + c]), xc, acc_b[r]);
      }
    }
    const __mmask16 keep = m - j0 >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (m - j0)) - 1);
    KVX_KV_UNROLL
    for (int r = 0; r < NR; ++r) {
      _mm512_mask_storeu_ps(s + static_cast<size_t>(r) * ss + j0, keep, _mm512_add_ps(acc_a[r], acc_b[r]));
    }
  }
}

#undef KVX_KV_AVX512
#undef KVX_KV_UNROLL

}  // namespace kvx::kv::simd::avx512

#endif  // KVX_KV_HAVE_X86_SIMD
