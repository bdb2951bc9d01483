// AVX-512 kernels over channel-major pages: keys stored as columns (one
// channel of consecutive entries per load), so the scores of 16 entries come
// out of FMAs as one vector with no horizontal sums. f16 keys (F16Codec:
// DotColumns, and the fused decode step F16DecodeStep) and KIVI's packed
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
// scalar paths (and F16DecodeStep).
template <int NR, int NB, bool kFullLoad>
KVX_KV_AVX512 inline void ColumnDots(const uint16_t* kt, int T, int j0, __mmask16 load, int d, const float* q,
                                     __m512 (&out)[NB][NR]) {
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

// ---- Fused decode step over f16 blocks. ----

// One block of up to 16 consecutive entries of an f16 page: keys
// channel-major (channel c at kt + c * T), values row-major (d per entry),
// positions; `valid` of them live. Decode: `pf`, the part of the page two
// ahead that this block's score steps prefetch (always a readable address:
// the block's own page when there is nothing ahead, so the kernel needs no
// branch). Prompt: `tap`, the item-local index of the first entry
// (WeightTap), when tapped.
struct F16Block {
  const uint16_t* kt;
  const uint16_t* v;
  const int32_t* pos;
  int valid;
  int tap;
  const char* pf = nullptr;
};

// The NB (1 or 2) blocks' entries visible to each of the NR query rows q of
// one query (position <= the row's qp) folded into the row's running (mx,
// sum, acc), in registers: the blocks' scores (ColumnDots' arithmetic, 4
// partial sums per score, each query broadcast serving both blocks), one
// online-softmax step per row and block (the reference max, codec_id.h's
// kSoftmaxSlack, reduced only when it rises; a rise rescales the row's sum
// and accumulator), and the weights straight into the value FMAs, which
// load and store the accumulators once for both blocks. The same
// arithmetic as DotColumns + SoftmaxStep + AxpyRowsQ on 16-entry pages, in
// the same order, so a decode step gives the same bits whether an observer
// (the general path) watches or not. Two blocks per step rather than one:
// kv_bench KernelVsPeak/decode (3 rows, 1024 and 4096 keys, one thread,
// CPU time) went from 47-50% to 55-60% of the FMA peak on the Zen 5 this
// was written on (half the query broadcasts, half the accumulator
// traffic); one softmax step for both blocks read 63% but changes the bits
// against the general path, and four blocks 65-68% (more registers and
// tails); a pipelined order (the next block's scores before this one's
// values) was slower. The keys have dk channel rows (the queries q are [NR][dk]) and the
// values d channels: dk = d on f16 pages; on ThinK's pruned pages
// (kv/pruned_keys.h) dk is the kept channels' row count and q the queries
// gathered to them. Each block prefetches kPfPerStep lines from its pf per
// score step of 4 channels. REQUIRES: T % 16 == 0, dk % 4 == 0, d % 16 ==
// 0, NR <= 4 (more rows of a prompt: F16PromptStep).
template <int NR, int NB, int kPfPerStep>
KVX_KV_AVX512 inline void F16DecodeStep(const F16Block (&blk)[NB], int T, int dk, int d, const float* q,
                                        const int32_t* qp, float* mx, float* sum, float* acc) {
  static_assert(NR <= 4 && (NB == 1 || NB == 2));
  __m512 a[NB][NR][4];
  KVX_KV_UNROLL
  for (int b = 0; b < NB; ++b) {
    KVX_KV_UNROLL
    for (int r = 0; r < NR; ++r) {
      KVX_KV_UNROLL
      for (int u = 0; u < 4; ++u) a[b][r][u] = _mm512_setzero_ps();
    }
  }
  // The prefetch pointers in registers, advanced per step (computing them
  // from blk[b].pf in the loop cost 6% of the kernel).
  const char* pf[NB];
  KVX_KV_UNROLL
  for (int b = 0; b < NB; ++b) pf[b] = blk[b].pf;
  for (int c = 0; c < dk; c += 4) {
    KVX_KV_UNROLL
    for (int b = 0; b < NB; ++b) {
      KVX_KV_UNROLL
      for (int i = 0; i < kPfPerStep; ++i) _mm_prefetch(pf[b] + i * 64, _MM_HINT_T0);
      pf[b] += kPfPerStep * 64;
    }
    KVX_KV_UNROLL
    for (int u = 0; u < 4; ++u) {
      __m512 x[NB];
      KVX_KV_UNROLL
      for (int b = 0; b < NB; ++b) x[b] = CvtPh(blk[b].kt + static_cast<size_t>(c + u) * T);
      KVX_KV_UNROLL
      for (int r = 0; r < NR; ++r) {
        const __m512 qv = _mm512_set1_ps(q[static_cast<size_t>(r) * dk + c + u]);
        KVX_KV_UNROLL
        for (int b = 0; b < NB; ++b) a[b][r][u] = _mm512_fmadd_ps(qv, x[b], a[b][r][u]);
      }
    }
  }
  // One online-softmax step per row and block, in order, as the general
  // path takes one per 16-entry page: block 0's factor rescales the row's
  // accumulator before the values, block 1's (f1) between the blocks' values.
  alignas(64) float w[NR][16 * NB];
  float f1[NR];
  KVX_KV_UNROLL
  for (int r = 0; r < NR; ++r) {
    KVX_KV_UNROLL
    for (int b = 0; b < NB; ++b) {
      const __m512 sc = _mm512_add_ps(_mm512_add_ps(a[b][r][0], a[b][r][1]), _mm512_add_ps(a[b][r][2], a[b][r][3]));
      const __mmask16 live = blk[b].valid == 16 ? 0xFFFF : static_cast<__mmask16>((1u << blk[b].valid) - 1);
      const __m512i pv = _mm512_loadu_si512(blk[b].pos);  // whole 16-entry blocks: T % 16 == 0
      const __mmask16 seen = _mm512_mask_cmple_epi32_mask(live, pv, _mm512_set1_epi32(qp[r]));
      const __m512 x = _mm512_mask_blend_ps(seen, _mm512_set1_ps(-__builtin_inff()), sc);
      float f = 1.0f;
      if (_mm512_cmp_ps_mask(x, _mm512_set1_ps(mx[r] + kSoftmaxSlack), _CMP_GT_OQ) != 0) {
        const float mnew = ReduceMax(x);
        if (mx[r] != -__builtin_inff()) f = __builtin_expf(mx[r] - mnew);
        mx[r] = mnew;
      }
      if (b == 0 && f != 1.0f) {
        float* ar = acc + static_cast<size_t>(r) * d;
        const __m512 fv = _mm512_set1_ps(f);
        for (int c = 0; c < d; c += 16) _mm512_storeu_ps(ar + c, _mm512_mul_ps(_mm512_loadu_ps(ar + c), fv));
      }
      if (b == 1) f1[r] = f;
      const __m512 mv = _mm512_set1_ps(mx[r] == -__builtin_inff() ? -__FLT_MAX__ : mx[r]);
      const __m512 e = ExpSoftmax16(_mm512_sub_ps(x, mv));
      _mm512_store_ps(&w[r][16 * b], e);
      // Summed as SoftmaxStep does, so that a decode step gives the same
      // bits whether an observer watches or not.
      sum[r] = MulThenAdd(sum[r], f, ReduceSum(e));
    }
  }
  // acc[r] += sum_j w[r][j] v_j, 64 channels (4 zmm per row) at a time.
  int c = 0;
  for (; c + 64 <= d; c += 64) {
    __m512 ac[NR][4];
    KVX_KV_UNROLL
    for (int r = 0; r < NR; ++r) {
      KVX_KV_UNROLL
      for (int u = 0; u < 4; ++u) ac[r][u] = _mm512_loadu_ps(acc + static_cast<size_t>(r) * d + c + 16 * u);
    }
    KVX_KV_UNROLL
    for (int b = 0; b < NB; ++b) {
      if (b == 1) {
        KVX_KV_UNROLL
        for (int r = 0; r < NR; ++r) {
          if (f1[r] == 1.0f) continue;
          KVX_KV_UNROLL
          for (int u = 0; u < 4; ++u) ac[r][u] = _mm512_mul_ps(ac[r][u], _mm512_set1_ps(f1[r]));
        }
      }
      const uint16_t* vb = blk[b].v + c;
      for (int j = 0; j < blk[b].valid; ++j) {
        __m512 x[4];
        KVX_KV_UNROLL
        for (int u = 0; u < 4; ++u) x[u] = CvtPh(vb + static_cast<size_t>(j) * d + 16 * u);
        KVX_KV_UNROLL
        for (int r = 0; r < NR; ++r) {
          const __m512 wr = _mm512_set1_ps(w[r][16 * b + j]);
          KVX_KV_UNROLL
          for (int u = 0; u < 4; ++u) ac[r][u] = _mm512_fmadd_ps(wr, x[u], ac[r][u]);
        }
      }
    }
    KVX_KV_UNROLL
    for (int r = 0; r < NR; ++r) {
      KVX_KV_UNROLL
      for (int u = 0; u < 4; ++u) _mm512_storeu_ps(acc + static_cast<size_t>(r) * d + c + 16 * u, ac[r][u]);
    }
  }
  for (; c < d; c += 16) {
    __m512 ac[NR];
    KVX_KV_UNROLL
    for (int r = 0; r < NR; ++r) ac[r] = _mm512_loadu_ps(acc + static_cast<size_t>(r) * d + c);
    KVX_KV_UNROLL
    for (int b = 0; b < NB; ++b) {
      if (b == 1) {
        KVX_KV_UNROLL
        for (int r = 0; r < NR; ++r) ac[r] = f1[r] == 1.0f ? ac[r] : _mm512_mul_ps(ac[r], _mm512_set1_ps(f1[r]));
      }
      for (int j = 0; j < blk[b].valid; ++j) {
        const __m512 x = CvtPh(blk[b].v + static_cast<size_t>(j) * d + c);
        KVX_KV_UNROLL
        for (int r = 0; r < NR; ++r) ac[r] = _mm512_fmadd_ps(_mm512_set1_ps(w[r][16 * b + j]), x, ac[r]);
      }
    }
    KVX_KV_UNROLL
    for (int r = 0; r < NR; ++r) _mm512_storeu_ps(acc + static_cast<size_t>(r) * d + c, ac[r]);
  }
}

// KVX_KV_AVX512 and KVX_KV_UNROLL stay defined for simd_avx512_prompt.h,
// which simd_x86.h includes next and which undefines them.

}  // namespace kvx::kv::simd::avx512

#endif  // KVX_KV_HAVE_X86_SIMD
