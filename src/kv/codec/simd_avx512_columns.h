// AVX-512 kernels over channel-major pages: keys stored as columns (one
// channel of consecutive entries per load), so the scores of 16 entries come
// out of FMAs as one vector with no horizontal sums. f16 keys (F16Codec:
// DotColumns, and the fused decode step F16DecodePage) and KIVI's packed
// key codes (ChannelTensor: DotCodeColumns, ScaleQueriesByChannel,
// DecodeCodeColumns). The row-major kernels, the softmax pieces and the
// conversions these build on are in simd_avx512.h.
//
// Included by simd_x86.h right after simd_avx512.h (whose KVX_KV_AVX512 and
// KVX_KV_UNROLL macros it uses); include simd_x86.h.
#pragma once

#ifdef KVX_KV_HAVE_X86_SIMD

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace kvx::kv::simd::avx512 {

// ---- Scores over channel-major f16 keys (see DotColumnsAvx2). ----

// out[b][r] = the scores of rows [0, NR) of q against the 16 entries at
// j0 + 16 b, b < NB (channel loads masked by `load` unless kFullLoad: a
// page of fewer than 16 entries). Same summation order as the AVX2 and
// scalar paths. With kPfLines > 0, also prefetches kPfLines consecutive
// cache lines from pf per step of 4 channels (F16DecodePage's page ahead; a
// compile-time count, since a runtime loop of prefetches cost 3-7% of the
// fused kernel's time).
template <int NR, int NB, bool kFullLoad, int kPfLines = 0>
KVX_KV_AVX512 inline void ColumnDots(const uint16_t* kt, int T, int j0, __mmask16 load, int d, const float* q,
                                     __m512 (&out)[NB][NR], const char* pf = nullptr) {
  __m512 a[NB][NR][4];
  KVX_KV_UNROLL
  for (int b = 0; b < NB; ++b) {
    KVX_KV_UNROLL
    for (int r = 0; r < NR; ++r) {
      KVX_KV_UNROLL
      for (int u = 0; u < 4; ++u) a[b][r][u] = _mm512_setzero_ps();
    }
  }
  for (int c = 0; c < d; c += 4) {
    KVX_KV_UNROLL
    for (int i = 0; i < kPfLines; ++i) _mm_prefetch(pf + (static_cast<size_t>(c / 4) * kPfLines + i) * 64, _MM_HINT_T0);
    KVX_KV_UNROLL
    for (int u = 0; u < 4; ++u) {
      const uint16_t* col = kt + static_cast<size_t>(c + u) * T + j0;
      KVX_KV_UNROLL
      for (int b = 0; b < NB; ++b) {
        // Plain loads for whole blocks: masked ones were 30% slower from DRAM.
        const __m256i h = kFullLoad ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(col + 16 * b))
                                    : _mm256_maskz_loadu_epi16(load, col + 16 * b);
        const __m512 x = _mm512_maskz_cvtph_ps(0xFFFF, h);
        KVX_KV_UNROLL
        for (int r = 0; r < NR; ++r) {
          a[b][r][u] = _mm512_fmadd_ps(_mm512_set1_ps(q[static_cast<size_t>(r) * d + c + u]), x, a[b][r][u]);
        }
      }
    }
  }
  KVX_KV_UNROLL
  for (int b = 0; b < NB; ++b) {
    KVX_KV_UNROLL
    for (int r = 0; r < NR; ++r) {
      out[b][r] = _mm512_add_ps(_mm512_add_ps(a[b][r][0], a[b][r][1]), _mm512_add_ps(a[b][r][2], a[b][r][3]));
    }
  }
}

// ColumnDots stored to s (row r at s + r * ss), the last block's lanes by `store`.
template <int NR, int NB, bool kFullLoad = true>
KVX_KV_AVX512 inline void DotColumnsBlock(const uint16_t* kt, int T, int j0, __mmask16 load, __mmask16 store, int d,
                                          const float* q, float* s, int ss) {
  __m512 v[NB][NR];
  ColumnDots<NR, NB, kFullLoad>(kt, T, j0, load, d, q, v);
  KVX_KV_UNROLL
  for (int b = 0; b < NB; ++b) {
    KVX_KV_UNROLL
    for (int r = 0; r < NR; ++r) {
      _mm512_mask_storeu_ps(s + static_cast<size_t>(r) * ss + j0 + 16 * b, b + 1 < NB ? 0xFFFF : store, v[b][r]);
    }
  }
}

// s[r*ss + j] = q_r . k_j for r < nq, j < n. REQUIRES: T % 16 == 0 or
// T < 16 (one masked block), d % 4 == 0. Up to 4 query rows per pass (16
// accumulators); with 1-2 rows, two blocks of entries at once so that at
// least 8 FMA chains overlap.
KVX_KV_AVX512 inline void DotColumns(const uint16_t* kt, int T, int n, int d, const float* q, int nq, float* s,
                                     int ss) {
  const __mmask16 load = T >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << T) - 1);
  for (int r0 = 0; r0 < nq; r0 += 4) {
    const int nr = std::min(4, nq - r0);
    const float* qr = q + static_cast<size_t>(r0) * d;
    float* sr = s + static_cast<size_t>(r0) * ss;
    int j0 = 0;
    if (nr <= 2) {
      for (; j0 + 32 <= n; j0 += 32) {
        if (nr == 1) DotColumnsBlock<1, 2>(kt, T, j0, load, 0xFFFF, d, qr, sr, ss);
        else DotColumnsBlock<2, 2>(kt, T, j0, load, 0xFFFF, d, qr, sr, ss);
      }
    }
    if (T < 16) {
      const __mmask16 store = static_cast<__mmask16>((1u << n) - 1);
      switch (nr) {
        case 1: DotColumnsBlock<1, 1, false>(kt, T, 0, load, store, d, qr, sr, ss); break;
        case 2: DotColumnsBlock<2, 1, false>(kt, T, 0, load, store, d, qr, sr, ss); break;
        case 3: DotColumnsBlock<3, 1, false>(kt, T, 0, load, store, d, qr, sr, ss); break;
        default: DotColumnsBlock<4, 1, false>(kt, T, 0, load, store, d, qr, sr, ss); break;
      }
      continue;
    }
    for (; j0 < n; j0 += 16) {
      const __mmask16 store = n - j0 >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - j0)) - 1);
      switch (nr) {
        case 1: DotColumnsBlock<1, 1>(kt, T, j0, load, store, d, qr, sr, ss); break;
        case 2: DotColumnsBlock<2, 1>(kt, T, j0, load, store, d, qr, sr, ss); break;
        case 3: DotColumnsBlock<3, 1>(kt, T, j0, load, store, d, qr, sr, ss); break;
        default: DotColumnsBlock<4, 1>(kt, T, j0, load, store, d, qr, sr, ss); break;
      }
    }
  }
}

// ---- Scores over channel-major quantized codes (see DotCodeColumnsAvx2). ----

template <int B, int NR>
KVX_KV_AVX512 inline void DotCodeColumnsBlock(const uint8_t* codes, int cb, int off, int n, int d, const float* qs,
                                              const float* bias, float* s, int ss) {
  constexpr int P = 8 / B;
  __m512 a[P][NR];
  KVX_KV_UNROLL
  for (int pl = 0; pl < P; ++pl) {
    KVX_KV_UNROLL
    for (int r = 0; r < NR; ++r) a[pl][r] = _mm512_setzero_ps();
  }
  for (int c = 0; c < d; ++c) {
    __m512 x[P];
    LoadAllPlanes16<B>(codes + static_cast<size_t>(c) * cb + off, x);
    KVX_KV_UNROLL
    for (int r = 0; r < NR; ++r) {
      const __m512 qv = _mm512_set1_ps(qs[static_cast<size_t>(r) * d + c]);
      KVX_KV_UNROLL
      for (int pl = 0; pl < P; ++pl) a[pl][r] = _mm512_fmadd_ps(qv, x[pl], a[pl][r]);
    }
  }
  KVX_KV_UNROLL
  for (int pl = 0; pl < P; ++pl) {
    const int j0 = pl * cb + off;
    if (j0 >= n) break;
    const __mmask16 keep = n - j0 >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - j0)) - 1);
    KVX_KV_UNROLL
    for (int r = 0; r < NR; ++r) {
      _mm512_mask_storeu_ps(s + static_cast<size_t>(r) * ss + j0, keep,
                            _mm512_add_ps(a[pl][r], _mm512_set1_ps(bias[r])));
    }
  }
}

// REQUIRES: cb % 16 == 0. Up to 4 query rows per pass (at most 16 accumulators).
template <int B>
KVX_KV_AVX512 inline void DotCodeColumns(const uint8_t* codes, int cb, int n, int d, const float* qs, int nq,
                                         const float* bias, float* s, int ss) {
  for (int r0 = 0; r0 < nq; r0 += 4) {
    const float* qr = qs + static_cast<size_t>(r0) * d;
    float* sr = s + static_cast<size_t>(r0) * ss;
    for (int off = 0; off < cb && off < n; off += 16) {
      switch (std::min(4, nq - r0)) {
        case 1: DotCodeColumnsBlock<B, 1>(codes, cb, off, n, d, qr, bias + r0, sr, ss); break;
        case 2: DotCodeColumnsBlock<B, 2>(codes, cb, off, n, d, qr, bias + r0, sr, ss); break;
        case 3: DotCodeColumnsBlock<B, 3>(codes, cb, off, n, d, qr, bias + r0, sr, ss); break;
        default: DotCodeColumnsBlock<B, 4>(codes, cb, off, n, d, qr, bias + r0, sr, ss); break;
      }
    }
  }
}

// ---- KIVI keys: queries scaled per channel. ----

// The per-channel (scale, min) of channels c0..c0+15 from interleaved f16
// pairs st[2c], st[2c + 1] (ChannelTensor's parameters), deinterleaved.
KVX_KV_AVX512 inline void LoadScaleMin16(const uint16_t* st, int c0, __m512* scale, __m512* min) {
  alignas(64) static constexpr int32_t kEven[16] = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
  alignas(64) static constexpr int32_t kOdd[16] = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
  const __m512 lo = CvtPh(st + 2 * c0), hi = CvtPh(st + 2 * c0 + 16);
  *scale = _mm512_permutex2var_ps(lo, _mm512_load_si512(kEven), hi);
  *min = _mm512_permutex2var_ps(lo, _mm512_load_si512(kOdd), hi);
}

// qs[r][c] = q[r][c] * scale_c and bias[r] = sum_c q[r][c] * min_c for
// r < nq, from the page's interleaved f16 (scale_c, min_c) pairs st[2c],
// st[2c + 1]: DotCodeColumns' inputs, once per page visit. REQUIRES:
// d % 16 == 0, nq <= 8.
KVX_KV_AVX512 inline void ScaleQueriesByChannel(const uint16_t* st, int d, const float* q, int nq, float* qs,
                                                float* bias) {
  __m512 b[8];
  for (int r = 0; r < nq; ++r) b[r] = _mm512_setzero_ps();
  for (int c0 = 0; c0 < d; c0 += 16) {
    __m512 scale, min;
    LoadScaleMin16(st, c0, &scale, &min);
    for (int r = 0; r < nq; ++r) {
      const __m512 qv = _mm512_loadu_ps(q + static_cast<size_t>(r) * d + c0);
      _mm512_storeu_ps(qs + static_cast<size_t>(r) * d + c0, _mm512_mul_ps(qv, scale));
      b[r] = _mm512_fmadd_ps(qv, min, b[r]);
    }
  }
  for (int r = 0; r < nq; ++r) bias[r] = ReduceSum(b[r]);
}

// r[0..15] transposed in place (r[i][k] <-> r[k][i]): unpack, in-lane
// shuffles, then 128-bit lane shuffles (r[i] = row i of a 16x16 tile).
// (Full-mask spellings for the reason given at CvtPh.)
KVX_KV_AVX512 inline void Transpose16(__m512* r) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_maskz_unpacklo_ps(0xFFFF, r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_maskz_unpackhi_ps(0xFFFF, r[2 * i], r[2 * i + 1]);
  }
  // u[4i + e], 128-bit lane l: rows 4i..4i+3 of column 4l + e.
  for (int i = 0; i < 4; ++i) {
    u[4 * i] = _mm512_maskz_shuffle_ps(0xFFFF, t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm512_maskz_shuffle_ps(0xFFFF, t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm512_maskz_shuffle_ps(0xFFFF, t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm512_maskz_shuffle_ps(0xFFFF, t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int e = 0; e < 4; ++e) {
    const __m512 lo = _mm512_maskz_shuffle_f32x4(0xFFFF, u[e], u[4 + e], 0x44), hi = _mm512_maskz_shuffle_f32x4(0xFFFF, u[e], u[4 + e], 0xEE);
    const __m512 lo2 = _mm512_maskz_shuffle_f32x4(0xFFFF, u[8 + e], u[12 + e], 0x44);
    const __m512 hi2 = _mm512_maskz_shuffle_f32x4(0xFFFF, u[8 + e], u[12 + e], 0xEE);
    r[e] = _mm512_maskz_shuffle_f32x4(0xFFFF, lo, lo2, 0x88);
    r[4 + e] = _mm512_maskz_shuffle_f32x4(0xFFFF, lo, lo2, 0xDD);
    r[8 + e] = _mm512_maskz_shuffle_f32x4(0xFFFF, hi, hi2, 0x88);
    r[12 + e] = _mm512_maskz_shuffle_f32x4(0xFFFF, hi, hi2, 0xDD);
  }
}

// Rows out[n][d] of channel-major B-bit codes (ChannelTensor's layout) with
// per-channel f16 (scale, min) pairs st: 16 channels x 16 entries dequantized
// per block, transposed in registers, stored as 16 row segments.
// REQUIRES: cb % 16 == 0, d % 16 == 0.
template <int B>
KVX_KV_AVX512 inline void DecodeCodeColumns(const uint8_t* codes, int cb, const uint16_t* st, int n, int d,
                                            float* out) {
  constexpr int P = 8 / B;
  const __m512i mask = _mm512_set1_epi32((1 << B) - 1);
  for (int c0 = 0; c0 < d; c0 += 16) {
    alignas(64) float scale[16], min[16];
    __m512 sv, mv;
    LoadScaleMin16(st, c0, &sv, &mv);
    _mm512_store_ps(scale, sv);
    _mm512_store_ps(min, mv);
    for (int off = 0; off < cb; off += 16) {
      for (int pl = 0; pl < P; ++pl) {
        const int j0 = pl * cb + off;
        if (j0 >= n) break;
        __m512 x[16];
        for (int k = 0; k < 16; ++k) {
          const __m512i v = CvtU8(codes + static_cast<size_t>(c0 + k) * cb + off);
          const __m512i c = B < 8 ? _mm512_and_si512(_mm512_maskz_srli_epi32(0xFFFF, v, pl * B), mask) : v;
          x[k] = _mm512_fmadd_ps(CvtI32(c), _mm512_set1_ps(scale[k]), _mm512_set1_ps(min[k]));
        }
        Transpose16(x);
        const int rows = std::min(16, n - j0);
        for (int t = 0; t < rows; ++t) _mm512_storeu_ps(out + static_cast<size_t>(j0 + t) * d + c0, x[t]);
      }
    }
  }
}

// ---- Fused decode step over one f16 page. ----

// The page's first m entries (keys channel-major kt, values row-major v,
// positions pos), those visible to each of the NR query rows q (position <=
// the row's qp) folded into the row's running (mx, sum, acc) 16 entries at
// a time (an entry a row must not see scores -inf: weight 0): the block's scores stay in registers
// (ColumnDots), one online-softmax step (the reference max, codec_id.h's
// kSoftmaxSlack, is reduced only when it rises; a rise rescales the row's
// sum and accumulator), and the weights go
// straight into the value FMAs. The same arithmetic as DotColumns +
// SoftmaxStep + AxpyRowsQ except that the softmax steps over blocks of 16
// (not whole pages), so results agree with them up to rounding. On
// 16-entry pages the separate kernels spent as long on the softmax
// bookkeeping between them as on the scores. The keys have dk channel rows
// (the queries q are [NR][dk]) and the values d channels: dk = d on f16
// pages; on ThinK's pruned pages (kv/pruned_keys.h) dk is the kept
// channels' row count and q the queries gathered to them. REQUIRES:
// T % 16 == 0, dk % 4 == 0, d % 16 == 0, NR <= 4 (more rows of a prompt:
// F16PromptStep).
template <int NR, int kPfPerStep = 4>
KVX_KV_AVX512 inline void F16DecodePage(const uint16_t* kt, const uint16_t* v, const int32_t* pos, int T, int m,
                                        int dk, int d, const float* q, const int32_t* qp, float* mx, float* sum,
                                        float* acc, const uint8_t* next, size_t next_bytes) {
  static_assert(NR <= 4);
  alignas(64) float w[NR][16];
  // `next` (the page two ahead, F16DecodePages) is prefetched kPfPerStep
  // lines per score step, spread over the page's 16-entry blocks, so its
  // misses overlap this page's arithmetic: a full f16 page holds 4 T d bytes
  // of keys and values, 4 lines per step of 4 channels of 16 entries; a
  // pruned page has fewer steps for as many values, so more lines per step
  // (F16PrefetchLinesPerStep). What the steps do not cover (the line its
  // position header adds, or more after a partial page) is requested first.
  const size_t spread = static_cast<size_t>((m + 15) / 16) * (dk / 4) * kPfPerStep * 64;
  const char* pf = reinterpret_cast<const char*>(next);
  for (size_t o = spread; pf != nullptr && o < next_bytes; o += 64) _mm_prefetch(pf + o, _MM_HINT_T0);
  for (int j0 = 0; j0 < m; j0 += 16) {
    const int valid = std::min(16, m - j0);
    __m512 sc[1][NR];
    if (pf != nullptr) {
      ColumnDots<NR, 1, true, kPfPerStep>(kt, T, j0, 0xFFFF, dk, q, sc, pf);
      pf += static_cast<size_t>(dk / 4) * kPfPerStep * 64;
    } else {
      ColumnDots<NR, 1, true>(kt, T, j0, 0xFFFF, dk, q, sc);
    }
    const __mmask16 live = valid == 16 ? 0xFFFF : static_cast<__mmask16>((1u << valid) - 1);
    const __m512i pv = _mm512_loadu_si512(pos + j0);  // whole 16-entry blocks: T % 16 == 0
    KVX_KV_UNROLL
    for (int r = 0; r < NR; ++r) {
      const __mmask16 seen = _mm512_mask_cmple_epi32_mask(live, pv, _mm512_set1_epi32(qp[r]));
      const __m512 x = _mm512_mask_blend_ps(seen, _mm512_set1_ps(-__builtin_inff()), sc[0][r]);
      float f = 1.0f;
      if (_mm512_cmp_ps_mask(x, _mm512_set1_ps(mx[r] + kSoftmaxSlack), _CMP_GT_OQ) != 0) {
        const float mnew = ReduceMax(x);
        if (mx[r] != -__builtin_inff()) f = __builtin_expf(mx[r] - mnew);
        mx[r] = mnew;
      }
      const __m512 mv = _mm512_set1_ps(mx[r] == -__builtin_inff() ? -__FLT_MAX__ : mx[r]);
      const __m512 e = ExpSoftmax16(_mm512_sub_ps(x, mv));
      _mm512_store_ps(w[r], e);
      if (f != 1.0f) {
        float* a = acc + static_cast<size_t>(r) * d;
        const __m512 fv = _mm512_set1_ps(f);
        for (int c = 0; c < d; c += 16) _mm512_storeu_ps(a + c, _mm512_mul_ps(_mm512_loadu_ps(a + c), fv));
      }
      // Summed as SoftmaxStep does, so that a decode step gives the same
      // bits whether an observer watches or not.
      sum[r] = MulThenAdd(sum[r], f, ReduceSum(e));
    }
    // acc[r] += sum_j w[r][j] v_j, 64 channels (4 zmm per row) at a time.
    const uint16_t* vb = v + static_cast<size_t>(j0) * d;
    int c = 0;
    for (; c + 64 <= d; c += 64) {
      __m512 a[NR][4];
      KVX_KV_UNROLL
      for (int r = 0; r < NR; ++r) {
        KVX_KV_UNROLL
        for (int u = 0; u < 4; ++u) a[r][u] = _mm512_loadu_ps(acc + static_cast<size_t>(r) * d + c + 16 * u);
      }
      for (int j = 0; j < valid; ++j) {
        __m512 x[4];
        KVX_KV_UNROLL
        for (int u = 0; u < 4; ++u) x[u] = CvtPh(vb + static_cast<size_t>(j) * d + c + 16 * u);
        KVX_KV_UNROLL
        for (int r = 0; r < NR; ++r) {
          const __m512 wr = _mm512_set1_ps(w[r][j]);
          KVX_KV_UNROLL
          for (int u = 0; u < 4; ++u) a[r][u] = _mm512_fmadd_ps(wr, x[u], a[r][u]);
        }
      }
      KVX_KV_UNROLL
      for (int r = 0; r < NR; ++r) {
        KVX_KV_UNROLL
        for (int u = 0; u < 4; ++u) _mm512_storeu_ps(acc + static_cast<size_t>(r) * d + c + 16 * u, a[r][u]);
      }
    }
    for (; c < d; c += 16) {
      __m512 a[NR];
      KVX_KV_UNROLL
      for (int r = 0; r < NR; ++r) a[r] = _mm512_loadu_ps(acc + static_cast<size_t>(r) * d + c);
      for (int j = 0; j < valid; ++j) {
        const __m512 x = CvtPh(vb + static_cast<size_t>(j) * d + c);
        KVX_KV_UNROLL
        for (int r = 0; r < NR; ++r) a[r] = _mm512_fmadd_ps(_mm512_set1_ps(w[r][j]), x, a[r]);
      }
      KVX_KV_UNROLL
      for (int r = 0; r < NR; ++r) _mm512_storeu_ps(acc + static_cast<size_t>(r) * d + c, a[r]);
    }
  }
}

// KVX_KV_AVX512 and KVX_KV_UNROLL stay defined for simd_avx512_prompt.h,
// which simd_x86.h includes next and which undefines them.

}  // namespace kvx::kv::simd::avx512

#endif  // KVX_KV_HAVE_X86_SIMD
