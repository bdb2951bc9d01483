// The fused f16 attention step for a prompt's row blocks: 5-8 query rows
// that belong to several queries (F16DecodePages' "wide" pass), against
// two blocks of 16 entries at a time. The decode step (F16DecodeStep, up
// to 4 rows of one query) and F16Block are in simd_avx512_columns.h.
//
// Included by simd_x86.h right after simd_avx512_columns.h (uses
// KVX_KV_AVX512 and KVX_KV_UNROLL, then undefines them); include
// simd_x86.h.
#pragma once

#ifdef KVX_KV_HAVE_X86_SIMD

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace kvx::kv::simd::avx512 {

// vsum[16 r + i] = (i == 0 ? sum[r] : 0): F16PromptStep's per-lane sums of
// nr rows, starting from the rows' running sums.
KVX_KV_AVX512 inline void StartLaneSums(const float* sum, int nr, float* vsum) {
  for (int r = 0; r < nr; ++r) _mm512_store_ps(vsum + 16 * r, _mm512_maskz_mov_ps(1, _mm512_set1_ps(sum[r])));
}
// sum[r] = the sum of vsum's 16 lanes of row r.
KVX_KV_AVX512 inline void FinishLaneSums(const float* vsum, int nr, float* sum) {
  for (int r = 0; r < nr; ++r) sum[r] = ReduceSum(_mm512_load_ps(vsum + 16 * r));
}

// Folds NB (1 or 2) blocks into the running (mx, vsum, acc) of NR query rows
// q (row r sees entries at positions <= qp[r]; qp_min = the smallest qp).
// The arithmetic of F16DecodeStep, organised for many rows:
//   * every converted key and value vector serves all NR rows, and each
//     query broadcast serves both blocks: with one 16-entry block per step
//     the scores issued a load per FMA (the broadcasts) and took 40% of
//     the kernel against 30% for the values, which have as many FMAs;
//   * one online-softmax step per row for both blocks (a rise of the
//     reference max beyond kSoftmaxSlack rescales the row once);
//   * the rows' sums stay in lanes (vsum, 16 per row; StartLaneSums and
//     FinishLaneSums around a run): a horizontal sum per row and block was
//     a fifth of the softmax step;
//   * the accumulators are loaded and stored once per step, 32 channels
//     of 8 rows (16 registers) at a time.
// Results agree with the decode kernel up to the rounding of the score and
// weight sums. kTap: each block's weights and the row's reference max also
// go to `tap` (an observed block: codec_id.h, WeightTap; tap->group == 16).
// REQUIRES: d % 32 == 0, T % 16 == 0, NR <= 8, NB in {1, 2}.
template <int NR, int NB, bool kTap>
KVX_KV_AVX512 inline void F16PromptStep(const F16Block (&blk)[NB], int T, int d, const float* q, const int32_t* qp,
                                        int32_t qp_min, float* mx, float* vsum, float* acc, const WeightTap* tap) {
  static_assert(NR >= 1 && NR <= 8 && (NB == 1 || NB == 2));
  alignas(64) float w[NR][16 * NB];
  __m512 sc[NB][NR];
  KVX_KV_UNROLL
  for (int b = 0; b < NB; ++b) {
    KVX_KV_UNROLL
    for (int r = 0; r < NR; ++r) sc[b][r] = _mm512_setzero_ps();
  }
  for (int c = 0; c < d; ++c) {
    __m512 x[NB];
    KVX_KV_UNROLL
    for (int b = 0; b < NB; ++b) x[b] = CvtPh(blk[b].kt + static_cast<size_t>(c) * T);
    KVX_KV_UNROLL
    for (int r = 0; r < NR; ++r) {
      const __m512 qr = _mm512_set1_ps(q[static_cast<size_t>(r) * d + c]);
      KVX_KV_UNROLL
      for (int b = 0; b < NB; ++b) sc[b][r] = _mm512_fmadd_ps(qr, x[b], sc[b][r]);
    }
  }

  // Masks: the lanes past a partial block, and (not on the pages every row
  // sees whole, all but a prompt's diagonal) the entries after a row.
  __mmask16 live[NB];
  __m512i pv[NB];
  bool all_seen = true;
  KVX_KV_UNROLL
  for (int b = 0; b < NB; ++b) {
    live[b] = blk[b].valid == 16 ? 0xFFFF : static_cast<__mmask16>((1u << blk[b].valid) - 1);
    pv[b] = _mm512_loadu_si512(blk[b].pos);  // whole 16-entry blocks: T % 16 == 0
    all_seen &= _mm512_mask_cmple_epi32_mask(live[b], pv[b], _mm512_set1_epi32(qp_min)) == live[b];
  }
  const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
  KVX_KV_UNROLL
  for (int r = 0; r < NR; ++r) {
    __m512 s[NB];
    __mmask16 rise = 0;
    const __m512 limit = _mm512_set1_ps(mx[r] + kSoftmaxSlack);
    KVX_KV_UNROLL
    for (int b = 0; b < NB; ++b) {
      const __mmask16 seen = all_seen ? live[b] : _mm512_mask_cmple_epi32_mask(live[b], pv[b], _mm512_set1_epi32(qp[r]));
      s[b] = seen == 0xFFFF ? sc[b][r] : _mm512_mask_blend_ps(seen, neg_inf, sc[b][r]);
      rise |= _mm512_cmp_ps_mask(s[b], limit, _CMP_GT_OQ);
    }
    float f = 1.0f;
    if (rise != 0) {
      const float mnew = ReduceMax(NB == 2 ? Max16(s[0], s[NB - 1]) : s[0]);
      if (mx[r] != -__builtin_inff()) f = __builtin_expf(mx[r] - mnew);
      mx[r] = mnew;
    }
    const __m512 mv = _mm512_set1_ps(mx[r] == -__builtin_inff() ? -__FLT_MAX__ : mx[r]);
    float* vs = vsum + 16 * r;
    __m512 total = _mm512_load_ps(vs);
    if (f != 1.0f) {
      total = _mm512_mul_ps(total, _mm512_set1_ps(f));
      float* a = acc + static_cast<size_t>(r) * d;
      const __m512 fv = _mm512_set1_ps(f);
      for (int c = 0; c < d; c += 16) _mm512_storeu_ps(a + c, _mm512_mul_ps(_mm512_loadu_ps(a + c), fv));
    }
    KVX_KV_UNROLL
    for (int b = 0; b < NB; ++b) {
      const __m512 e = ExpSoftmax16(_mm512_sub_ps(s[b], mv));
      _mm512_store_ps(&w[r][16 * b], e);
      if constexpr (kTap) {
        _mm512_storeu_ps(tap->w + static_cast<size_t>(r) * tap->stride + blk[b].tap, e);
        tap->ref[static_cast<size_t>(r) * (tap->stride / 16) + blk[b].tap / 16] = mx[r];
      }
      total = _mm512_add_ps(total, e);
    }
    _mm512_store_ps(vs, total);
  }

  // acc[r] += sum_j w[r][j] v_j over both blocks, 32 channels at a time.
  for (int c = 0; c < d; c += 32) {
    __m512 a[NR][2];
    KVX_KV_UNROLL
    for (int r = 0; r < NR; ++r) {
      a[r][0] = _mm512_loadu_ps(acc + static_cast<size_t>(r) * d + c);
      a[r][1] = _mm512_loadu_ps(acc + static_cast<size_t>(r) * d + c + 16);
    }
    KVX_KV_UNROLL
    for (int b = 0; b < NB; ++b) {
      const uint16_t* vb = blk[b].v + c;
      for (int j = 0; j < blk[b].valid; ++j) {
        const __m512 x0 = CvtPh(vb + static_cast<size_t>(j) * d);
        const __m512 x1 = CvtPh(vb + static_cast<size_t>(j) * d + 16);
        KVX_KV_UNROLL
        for (int r = 0; r < NR; ++r) {
          const __m512 wr = _mm512_set1_ps(w[r][16 * b + j]);
          a[r][0] = _mm512_fmadd_ps(wr, x0, a[r][0]);
          a[r][1] = _mm512_fmadd_ps(wr, x1, a[r][1]);
        }
      }
    }
    KVX_KV_UNROLL
    for (int r = 0; r < NR; ++r) {
      _mm512_storeu_ps(acc + static_cast<size_t>(r) * d + c, a[r][0]);
      _mm512_storeu_ps(acc + static_cast<size_t>(r) * d + c + 16, a[r][1]);
    }
  }
}

#undef KVX_KV_AVX512
#undef KVX_KV_UNROLL

}  // namespace kvx::kv::simd::avx512

#endif  // KVX_KV_HAVE_X86_SIMD
