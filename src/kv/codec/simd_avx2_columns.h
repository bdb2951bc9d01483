// AVX2 kernels over channel-major pages: keys stored as columns (one
// channel of consecutive entries per load), so the scores of 8 entries come
// out of FMAs as one vector with no horizontal sums. f16 keys (F16Codec's
// DotColumnsAvx2) and KIVI's packed key codes (DotCodeColumnsAvx2); the
// AVX-512 versions are in simd_avx512_columns.h.
//
// Included by simd_x86.h in the middle of its AVX2 section (whose
// KVX_KV_AVX2 and KVX_KV_UNROLL macros and helpers it uses); include
// simd_x86.h.
#pragma once

#ifdef KVX_KV_HAVE_X86_SIMD

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace kvx::kv::simd {

// ---- Scores over channel-major f16 keys (the f16 codec's key block). ----
//
// kt[c * T + j] holds channel c of entry j, so one load gives one channel of
// 8 (16 on AVX-512) consecutive entries, and the scores of those entries come
// out of FMAs with a broadcast query channel as one vector: no horizontal
// reduction per (query, entry), which cost as much as the FMAs themselves in
// the row-major kernels. Each score is the sum of 4 partial sums over the
// channels c = u (mod 4), added as (p0 + p1) + (p2 + p3): a fixed order shared
// by every path (F16Codec::ScoresScalar is the reference), independent of the
// page size and of how many query rows are scored together.

// Rows [0, NR) of q against the 8 entries at j0 (lanes < `valid` stored).
template <int NR>
KVX_KV_AVX2 inline void DotColumnsBlockAvx2(const uint16_t* kt, int T, int j0, int valid, int d, const float* q,
                                            float* s, int ss) {
  __m256 a[NR][4];
  KVX_KV_UNROLL
  for (int r = 0; r < NR; ++r) {
    KVX_KV_UNROLL
    for (int u = 0; u < 4; ++u) a[r][u] = _mm256_setzero_ps();
  }
  for (int c = 0; c < d; c += 4) {
    KVX_KV_UNROLL
    for (int u = 0; u < 4; ++u) {
      const __m256 x = _mm256_cvtph_ps(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(kt + static_cast<size_t>(c + u) * T + j0)));
      KVX_KV_UNROLL
      for (int r = 0; r < NR; ++r) {
        a[r][u] = _mm256_fmadd_ps(_mm256_broadcast_ss(q + static_cast<size_t>(r) * d + c + u), x, a[r][u]);
      }
    }
  }
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), lane);
  KVX_KV_UNROLL
  for (int r = 0; r < NR; ++r) {
    const __m256 v = _mm256_add_ps(_mm256_add_ps(a[r][0], a[r][1]), _mm256_add_ps(a[r][2], a[r][3]));
    _mm256_maskstore_ps(s + static_cast<size_t>(r) * ss + j0, keep, v);
  }
}

// s[r*ss + j] = q_r . k_j for r < nq, j < n. REQUIRES: T % 8 == 0, d % 4 == 0.
// Two query rows per pass (8 accumulators of the 16 ymm registers).
KVX_KV_AVX2 inline void DotColumnsAvx2(const uint16_t* kt, int T, int n, int d, const float* q, int nq, float* s,
                                       int ss) {
  for (int r0 = 0; r0 < nq; r0 += 2) {
    const float* qr = q + static_cast<size_t>(r0) * d;
    float* sr = s + static_cast<size_t>(r0) * ss;
    for (int j0 = 0; j0 < n; j0 += 8) {
      if (nq - r0 >= 2) {
        DotColumnsBlockAvx2<2>(kt, T, j0, n - j0, d, qr, sr, ss);
      } else {
        DotColumnsBlockAvx2<1>(kt, T, j0, n - j0, d, qr, sr, ss);
      }
    }
  }
}

// ---- Scores over channel-major quantized codes (KIVI keys). ----
//
// Column c holds the page's entries of channel c, planar-packed along the
// entries: entry j in byte j % cb at bit shift B * (j / cb), cb = T * B / 8
// bytes. With per-channel parameters x = min_c + scale_c * code, a score is
//   q . x_j = sum_c (q_c scale_c) code_cj + sum_c q_c min_c,
// so the caller scales the queries once per page (qs) and adds the constant
// (bias); the kernel is a plain dot of qs with the codes, 8 (16 on AVX-512)
// consecutive entries per vector per plane, summed over the channels in
// order (the order ChannelTensor's scalar path uses).

// Rows [0, NR) against the entries in the 8 bytes at `off` of every column.
template <int B, int NR>
KVX_KV_AVX2 inline void DotCodeColumnsBlockAvx2(const uint8_t* codes, int cb, int off, int n, int d, const float* qs,
                                                const float* bias, float* s, int ss) {
  constexpr int P = 8 / B;
  __m256 a[P][NR];
  KVX_KV_UNROLL
  for (int pl = 0; pl < P; ++pl) {
    KVX_KV_UNROLL
    for (int r = 0; r < NR; ++r) a[pl][r] = _mm256_setzero_ps();
  }
  for (int c = 0; c < d; ++c) {
    __m256 x[P];
    LoadAllPlanes<B>(codes + static_cast<size_t>(c) * cb + off, x);
    KVX_KV_UNROLL
    for (int r = 0; r < NR; ++r) {
      const __m256 qv = _mm256_broadcast_ss(qs + static_cast<size_t>(r) * d + c);
      KVX_KV_UNROLL
      for (int pl = 0; pl < P; ++pl) a[pl][r] = _mm256_fmadd_ps(qv, x[pl], a[pl][r]);
    }
  }
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  KVX_KV_UNROLL
  for (int pl = 0; pl < P; ++pl) {
    const int j0 = pl * cb + off;
    const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - j0), lane);
    KVX_KV_UNROLL
    for (int r = 0; r < NR; ++r) {
      _mm256_maskstore_ps(s + static_cast<size_t>(r) * ss + j0, keep, _mm256_add_ps(a[pl][r], _mm256_set1_ps(bias[r])));
    }
  }
}

// s[r*ss + j] = qs_r . codes_j + bias[r] for r < nq, j < n. REQUIRES: cb % 8 == 0.
template <int B>
KVX_KV_AVX2 inline void DotCodeColumnsAvx2(const uint8_t* codes, int cb, int n, int d, const float* qs, int nq,
                                           const float* bias, float* s, int ss) {
  for (int r0 = 0; r0 < nq; r0 += 2) {
    const float* qr = qs + static_cast<size_t>(r0) * d;
    float* sr = s + static_cast<size_t>(r0) * ss;
    for (int off = 0; off < cb && off < n; off += 8) {
      if (nq - r0 >= 2) {
        DotCodeColumnsBlockAvx2<B, 2>(codes, cb, off, n, d, qr, bias + r0, sr, ss);
      } else {
        DotCodeColumnsBlockAvx2<B, 1>(codes, cb, off, n, d, qr, bias + r0, sr, ss);
      }
    }
  }
}
}  // namespace kvx::kv::simd

#endif  // KVX_KV_HAVE_X86_SIMD
