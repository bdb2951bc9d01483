// AVX2/FMA/F16C versions of the codecs' attention inner loops, chosen at run
// time (the library is built for baseline x86-64); the multi-query kernels
// also have AVX-512 versions (simd_avx512.h) that the dispatchers at the end
// (DotRowsQN, AxpyRowsQN, DecodeRowsQ) prefer when the CPU has them. Every
// call on one machine takes the same path, so results stay deterministic and
// independent of the thread count; they differ from the scalar path only by
// rounding (FMA, summation order). Non-x86 builds use the scalar loops.
//
// Thread-safety: pure functions.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kv/codec/codec_id.h"
#include "util/cpu_features.h"
#include "util/fp16.h"

#if defined(__x86_64__) || defined(__i386__)
#define KVX_KV_HAVE_X86_SIMD 1
#include <immintrin.h>
#endif

namespace kvx::kv::simd {

#ifdef KVX_KV_HAVE_X86_SIMD

// The features the AVX2 kernels are compiled with, and the check that the
// CPU has every one of them (util/cpu_features.h; read once).
#define KVX_KV_AVX2_FEATURES "avx2,fma,f16c"
inline bool HasAvx2Fma() {
  static const bool has = util::MissingCpuFeatures(KVX_KV_AVX2_FEATURES).empty();
  return has;
}

#define KVX_KV_AVX2 __attribute__((target(KVX_KV_AVX2_FEATURES)))
// Fully unrolls the loops over query rows so their accumulators live in
// registers (GCC and clang both honour this spelling).
#define KVX_KV_UNROLL _Pragma("GCC unroll 8")

KVX_KV_AVX2 inline float HorizontalSum(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// ---- Multi-query kernels over row sources. ----
//
// A row source yields channels c..c+7 of row j as 8 floats. Quantized rows are
// packed planar (quant.h): channel c = plane * span + off sits in byte `off`
// at bit shift plane * B, so a source loads 8 bytes, shifts, masks and
// converts, then applies the affine map x^ = m + s * q with one FMA — the
// dequantization happens in registers, never into a buffer. Kernels visit
// channels as (plane, off) pairs: Src::kPlanes planes of span() channels.

// f16 rows (the f16 codec and f16 staging pages).
struct F16Rows {
  static constexpr int kPlanes = 1;
  const uint16_t* rows;
  int d;
  int span() const { return d; }
  KVX_KV_AVX2 __m256 Load(int j, int /*plane*/, int off, int /*c*/) const {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows + static_cast<size_t>(j) * d + off)));
  }
  KVX_KV_AVX2 void LoadPlanes(int j, int off, __m256* x) const { x[0] = Load(j, 0, off, off); }
};

// f32 rows (decoded tiles).
struct F32Rows {
  static constexpr int kPlanes = 1;
  const float* rows;
  int d;
  int span() const { return d; }
  KVX_KV_AVX2 __m256 Load(int j, int /*plane*/, int off, int /*c*/) const {
    return _mm256_loadu_ps(rows + static_cast<size_t>(j) * d + off);
  }
  KVX_KV_AVX2 void LoadPlanes(int j, int off, __m256* x) const { x[0] = Load(j, 0, off, off); }
};

// Codes of 8 consecutive channels in one plane as floats.
template <int B>
KVX_KV_AVX2 inline __m256 LoadCodes(const uint8_t* p, int shift) {
  __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  if constexpr (B < 8) {
    v = _mm256_and_si256(_mm256_srl_epi32(v, _mm_cvtsi32_si128(shift)), _mm256_set1_epi32((1 << B) - 1));
  }
  return _mm256_cvtepi32_ps(v);
}

// The codes of all 8/B planes at byte offset `off` (one load), as floats.
template <int B>
KVX_KV_AVX2 inline void LoadAllPlanes(const uint8_t* p, __m256* x) {
  const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m256i mask = _mm256_set1_epi32((1 << B) - 1);
  KVX_KV_UNROLL
  for (int plane = 0; plane < 8 / B; ++plane) {
    const __m256i c = B < 8 ? _mm256_and_si256(_mm256_srli_epi32(v, plane * B), mask) : v;
    x[plane] = _mm256_cvtepi32_ps(c);
  }
}

// Per-token groups: (scale, min) per 2^group_shift channels of each row, as
// floats [rows][groups][2] (converted from the page's f16 once per visit).
template <int B>
struct TokenRows {
  static constexpr int kPlanes = 8 / B;
  const uint8_t* codes;
  const float* params;
  int row_bytes, groups, group_shift;
  int span() const { return row_bytes; }
  KVX_KV_AVX2 __m256 Load(int j, int plane, int off, int c) const {
    const __m256 q = LoadCodes<B>(codes + static_cast<size_t>(j) * row_bytes + off, plane * B);
    const float* sm = params + (static_cast<size_t>(j) * groups + (c >> group_shift)) * 2;
    return _mm256_fmadd_ps(q, _mm256_broadcast_ss(sm), _mm256_broadcast_ss(sm + 1));
  }
  KVX_KV_AVX2 void LoadPlanes(int j, int off, __m256* x) const {
    LoadAllPlanes<B>(codes + static_cast<size_t>(j) * row_bytes + off, x);
    const float* row = params + static_cast<size_t>(j) * groups * 2;
    KVX_KV_UNROLL
    for (int plane = 0; plane < kPlanes; ++plane) {
      const float* sm = row + ((plane * row_bytes + off) >> group_shift) * 2;
      x[plane] = _mm256_fmadd_ps(x[plane], _mm256_broadcast_ss(sm), _mm256_broadcast_ss(sm + 1));
    }
  }
};

// s[r*ss + j] = q_r . row_j for r < NQ, j < n (q is [NQ][d]). Each row is
// loaded and dequantized once for all NQ query rows (a GQA group shares its
// kv head); the 8 bytes at `off` are loaded once for all planes. Two
// accumulator sets (alternating planes / 8-channel blocks) when NQ <= 4 so
// the FMA chains overlap. REQUIRES: span() % 8 == 0.
//
// Small NQ: KJ = 4 (NQ <= 3) or 2 (NQ <= 6) rows at a time, each with its own
// accumulators, reduced together with horizontal adds: reducing a row alone
// costs as much as half its FMAs at head_dim 64, jointly a quarter of that.
template <class Src, int NQ>
KVX_KV_AVX2 inline void DotRowsQ(const Src& src, int n, int d, const float* q, float* s, int ss) {
  constexpr int KJ = NQ <= 3 ? 4 : NQ <= 6 ? 2 : 1;
  constexpr bool kTwo = NQ <= 4;
  const int span = src.span();
  int j = 0;
  if constexpr (KJ > 1) {
    for (; j + KJ <= n; j += KJ) {
      __m256 a[KJ][NQ];
      KVX_KV_UNROLL
      for (int k = 0; k < KJ; ++k) {
        KVX_KV_UNROLL
        for (int r = 0; r < NQ; ++r) a[k][r] = _mm256_setzero_ps();
      }
      for (int off = 0; off < span; off += 8) {
        KVX_KV_UNROLL
        for (int k = 0; k < KJ; ++k) {
          __m256 x[Src::kPlanes];
          src.LoadPlanes(j + k, off, x);
          KVX_KV_UNROLL
          for (int plane = 0; plane < Src::kPlanes; ++plane) {
            const int c = plane * span + off;
            KVX_KV_UNROLL
            for (int r = 0; r < NQ; ++r) {
              a[k][r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + static_cast<size_t>(r) * d + c), x[plane], a[k][r]);
            }
          }
        }
      }
      KVX_KV_UNROLL
      for (int r = 0; r < NQ; ++r) {
        float* out = s + static_cast<size_t>(r) * ss + j;
        if constexpr (KJ == 4) {
          const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a[0][r], a[1][r]), _mm256_hadd_ps(a[2][r], a[3][r]));
          _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
        } else {
          const __m256 t = _mm256_hadd_ps(a[0][r], a[1][r]);  // [a01 a23 b01 b23 | a45 a67 b45 b67]
          __m128 h = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
          h = _mm_hadd_ps(h, h);
          _mm_storel_pi(reinterpret_cast<__m64*>(out), h);
        }
      }
    }
  }
  for (; j < n; ++j) {
    __m256 a0[NQ], a1[NQ];
    KVX_KV_UNROLL
    for (int r = 0; r < NQ; ++r) a0[r] = a1[r] = _mm256_setzero_ps();
    for (int off = 0; off < span; off += 8) {
      __m256 x[Src::kPlanes];
      src.LoadPlanes(j, off, x);
      KVX_KV_UNROLL
      for (int plane = 0; plane < Src::kPlanes; ++plane) {
        const int c = plane * span + off;
        KVX_KV_UNROLL
        for (int r = 0; r < NQ; ++r) {
          const __m256 qv = _mm256_loadu_ps(q + static_cast<size_t>(r) * d + c);
          if (kTwo && ((plane + (off >> 3)) & 1)) {
            a1[r] = _mm256_fmadd_ps(qv, x[plane], a1[r]);
          } else {
            a0[r] = _mm256_fmadd_ps(qv, x[plane], a0[r]);
          }
        }
      }
    }
    KVX_KV_UNROLL
    for (int r = 0; r < NQ; ++r) {
      s[static_cast<size_t>(r) * ss + j] = HorizontalSum(kTwo ? _mm256_add_ps(a0[r], a1[r]) : a0[r]);
    }
  }
}

// acc[r][c] += sum_{j<n} w[r*ws + j] * row_j[c] for r < NQ. Channel blocks
// outermost so the accumulators stay in registers across the rows. When the
// planes of one byte block fit (kPlanes * NQ <= 8 accumulators) they are
// processed together: the codes are loaded once and each weight broadcast
// once per row for all planes. Otherwise, for NQ <= 4, even and odd rows
// feed separate accumulators so the FMA chains overlap. Fixed order either way.
template <class Src, int NQ>
KVX_KV_AVX2 inline void AxpyRowsQ(const Src& src, int n, int d, const float* w, int ws, float* acc) {
  const int span = src.span();
  constexpr int P = Src::kPlanes;
  if constexpr (P > 1 && P * NQ <= 8) {
    for (int off = 0; off < span; off += 8) {
      __m256 a[P][NQ];
      KVX_KV_UNROLL
      for (int pl = 0; pl < P; ++pl) {
        KVX_KV_UNROLL
        for (int r = 0; r < NQ; ++r) a[pl][r] = _mm256_loadu_ps(acc + static_cast<size_t>(r) * d + pl * span + off);
      }
      for (int j = 0; j < n; ++j) {
        __m256 x[P];
        src.LoadPlanes(j, off, x);
        KVX_KV_UNROLL
        for (int r = 0; r < NQ; ++r) {
          const __m256 wr = _mm256_broadcast_ss(w + static_cast<size_t>(r) * ws + j);
          KVX_KV_UNROLL
          for (int pl = 0; pl < P; ++pl) a[pl][r] = _mm256_fmadd_ps(wr, x[pl], a[pl][r]);
        }
      }
      KVX_KV_UNROLL
      for (int pl = 0; pl < P; ++pl) {
        KVX_KV_UNROLL
        for (int r = 0; r < NQ; ++r) _mm256_storeu_ps(acc + static_cast<size_t>(r) * d + pl * span + off, a[pl][r]);
      }
    }
    return;
  }
  constexpr bool kTwo = NQ <= 4;
  for (int plane = 0; plane < P; ++plane) {
    for (int off = 0; off < span; off += 8) {
      const int c = plane * span + off;
      __m256 a0[NQ], a1[NQ];
      KVX_KV_UNROLL
      for (int r = 0; r < NQ; ++r) {
        a0[r] = _mm256_loadu_ps(acc + static_cast<size_t>(r) * d + c);
        a1[r] = _mm256_setzero_ps();
      }
      int j = 0;
      if constexpr (kTwo) {
        for (; j + 2 <= n; j += 2) {
          const __m256 x0 = src.Load(j, plane, off, c), x1 = src.Load(j + 1, plane, off, c);
          KVX_KV_UNROLL
          for (int r = 0; r < NQ; ++r) {
            const float* wr = w + static_cast<size_t>(r) * ws + j;
            a0[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(wr), x0, a0[r]);
            a1[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(wr + 1), x1, a1[r]);
          }
        }
      }
      for (; j < n; ++j) {
        const __m256 x = src.Load(j, plane, off, c);
        KVX_KV_UNROLL
        for (int r = 0; r < NQ; ++r) {
          a0[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(w + static_cast<size_t>(r) * ws + j), x, a0[r]);
        }
      }
      KVX_KV_UNROLL
      for (int r = 0; r < NQ; ++r) {
        _mm256_storeu_ps(acc + static_cast<size_t>(r) * d + c, kTwo ? _mm256_add_ps(a0[r], a1[r]) : a0[r]);
      }
    }
  }
}

}  // namespace kvx::kv::simd

#include "kv/codec/simd_avx2_columns.h"  // IWYU pragma: export

#include "kv/codec/simd_avx2_rows.h"  // IWYU pragma: export

#undef KVX_KV_AVX2
#undef KVX_KV_UNROLL

// The AVX-512 kernels (avx512::DotRowsQ, AxpyRowsQ, DecodeRowsQ) over the row
// sources above, and the channel-major ones (DotColumns, DotCodeColumns,
// F16DecodeStep...); the dispatchers below pick them when the CPU has AVX-512.
#include "kv/codec/simd_avx512.h"
#include "kv/codec/simd_avx512_columns.h"
#include "kv/codec/simd_avx512_prompt.h"

namespace kvx::kv::simd {

// Calls fn(std::integral_constant<int, NQ>{}) with NQ the runtime query-row
// count nq as a template constant (1..kMaxQueryRows; larger counts use 8).
template <class Fn>
inline void WithQueryRows(int nq, const Fn& fn) {
  static_assert(kMaxQueryRows == 8);
  switch (nq) {
    case 1: return fn(std::integral_constant<int, 1>{});
    case 2: return fn(std::integral_constant<int, 2>{});
    case 3: return fn(std::integral_constant<int, 3>{});
    case 4: return fn(std::integral_constant<int, 4>{});
    case 5: return fn(std::integral_constant<int, 5>{});
    case 6: return fn(std::integral_constant<int, 6>{});
    case 7: return fn(std::integral_constant<int, 7>{});
    default: return fn(std::integral_constant<int, 8>{});
  }
}

// The multi-query kernels for a runtime row count, on the AVX-512 kernels
// when the CPU and the source's shape allow, else AVX2.
template <class Src>
inline void DotRowsQN(const Src& src, int n, int d, const float* q, int nq, float* s, int ss) {
  const bool wide = UseAvx512For(src);
  WithQueryRows(nq, [&](auto rows) {
    constexpr int NQ = decltype(rows)::value;
    if (wide) return avx512::DotRowsQ<Src, NQ>(src, n, d, q, s, ss);
    DotRowsQ<Src, NQ>(src, n, d, q, s, ss);
  });
}
template <class Src>
inline void AxpyRowsQN(const Src& src, int n, int d, const float* w, int nq, int ws, float* acc) {
  const bool wide = UseAvx512For(src);
  WithQueryRows(nq, [&](auto rows) {
    constexpr int NQ = decltype(rows)::value;
    if (wide) return avx512::AxpyRowsQ<Src, NQ>(src, n, d, w, ws, acc);
    AxpyRowsQ<Src, NQ>(src, n, d, w, ws, acc);
  });
}

// Scores over channel-major f16 keys (DotColumnsAvx2): AVX-512 when the CPU
// has it, else AVX2 when the page size allows; false (nothing done) when
// neither applies (the caller runs F16Codec::ScoresScalar).
inline bool DotColumnsF16(const uint16_t* kt, int T, int n, int d, const float* q, int nq, float* s, int ss) {
  if (d % 4 != 0) return false;
  if (UseAvx512() && (T % 16 == 0 || T < 16)) {
    avx512::DotColumns(kt, T, n, d, q, nq, s, ss);
    return true;
  }
  if (T % 8 != 0) return false;
  DotColumnsAvx2(kt, T, n, d, q, nq, s, ss);
  return true;
}

// Whether F16DecodePages runs here: the AVX-512 kernels run and the shape
// allows (T % 16 == 0, d % 16 == 0).
inline bool HasF16DecodePages(int T, int d) { return UseAvx512() && T % 16 == 0 && d % 16 == 0; }

// avx512::F16PromptStep over a run of f16 pages (as F16DecodePages), two
// 16-entry blocks per step, for the nq rows of several queries; with `tap`
// (may be null) the weights go there too (codec_id.h, WeightTap). No
// prefetching: a prompt's row blocks read the same pages one after the
// other, mostly from L2, and requesting each page two ahead made kv_bench
// PrefillAttention f16 512 8-10% slower.
inline void F16PromptPages(const uint8_t* const* pages, int n_pages, int m_last, int T, int d, const float* q,
                           const int32_t* qp, int nq, float* mx, float* sum, float* acc, const WeightTap* tap) {
  const size_t data = PageDataOffset(T), values = static_cast<size_t>(T) * d;
  const int32_t qp_min = *std::min_element(qp, qp + nq);
  alignas(64) float vsum[kMaxQueryRows * 16];
  avx512::StartLaneSums(sum, nq, vsum);
  auto pass = [&](auto rows, auto tapped) {
    constexpr int kRows = decltype(rows)::value;
    constexpr bool kTap = decltype(tapped)::value;
    avx512::F16Block pair[2];
    int held = 0;
    for (int i = 0; i < n_pages; ++i) {
      const uint16_t* kt = reinterpret_cast<const uint16_t*>(pages[i] + data);
      const int m = i + 1 == n_pages ? m_last : T;
      const int k0 = kTap ? tap->page_offset[i] : 0;
      for (int j0 = 0; j0 < m; j0 += 16) {
        pair[held++] = {kt + j0, kt + values + static_cast<size_t>(j0) * d, PagePositions(pages[i]) + j0,
                        std::min(16, m - j0), k0 + j0};
        if (held == 2) {
          avx512::F16PromptStep<kRows, 2, kTap>(pair, T, d, q, qp, qp_min, mx, vsum, acc, tap);
          held = 0;
        }
      }
    }
    if (held == 1) {
      const avx512::F16Block one[1] = {pair[0]};
      avx512::F16PromptStep<kRows, 1, kTap>(one, T, d, q, qp, qp_min, mx, vsum, acc, tap);
    }
  };
  WithQueryRows(nq, [&](auto rows) {
    if (tap != nullptr) return pass(rows, std::true_type{});
    pass(rows, std::false_type{});
  });
  avx512::FinishLaneSums(vsum, nq, sum);
}

// Whether F16DecodePages takes F16PromptPages for these rows: several
// queries' rows (more than 4, not all at one position) of whole f16 pages
// (dk == d) with d % 32 == 0.
inline bool F16PromptPagesApply(int dk, int d, const int32_t* qp, int nq) {
  return dk == d && nq > 4 && d % 32 == 0 && !std::all_of(qp, qp + nq, [&](int32_t p) { return p == qp[0]; });
}

// F16DecodePages' loop over the pages for rows of one query (below), with
// kPfPerStep lines of prefetch per score step: the run's 16-entry blocks
// in pairs (avx512::F16DecodeStep; a last one alone), each block
// prefetching its share of the page two ahead of its own (the page's
// blocks spread that page over their score steps; what the steps do not
// cover, the position header's line or more after a partial page, is
// requested when the page's first block is taken).
template <int kPfPerStep>
inline void F16DecodeRun(const uint8_t* const* pages, int n_pages, int m_last, int T, int dk, int d,
                         size_t page_bytes, const float* q, const int32_t* qp, int nq, float* mx, float* sum,
                         float* acc, const uint8_t* after, size_t after_bytes) {
  const size_t data = PageDataOffset(T), values = static_cast<size_t>(T) * dk;
  const size_t block_lines = static_cast<size_t>(dk / 4) * kPfPerStep;  // per 16-entry block
  if (n_pages > 1) {
    for (size_t o = 0; o < page_bytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(pages[1]) + o, _MM_HINT_T0);
  }
  // The rows in groups of at most 4 (one register set each).
  auto step = [&](const auto& blk) {
    constexpr int kBlocks = static_cast<int>(std::extent_v<std::remove_reference_t<decltype(blk)>>);
    for (int r0 = 0; r0 < nq; r0 += 4) {
      const float* qr = q + static_cast<size_t>(r0) * dk;
      float* ar = acc + static_cast<size_t>(r0) * d;
      switch (std::min(4, nq - r0)) {
        case 1: avx512::F16DecodeStep<1, kBlocks, kPfPerStep>(blk, T, dk, d, qr, qp + r0, mx + r0, sum + r0, ar); break;
        case 2: avx512::F16DecodeStep<2, kBlocks, kPfPerStep>(blk, T, dk, d, qr, qp + r0, mx + r0, sum + r0, ar); break;
        case 3: avx512::F16DecodeStep<3, kBlocks, kPfPerStep>(blk, T, dk, d, qr, qp + r0, mx + r0, sum + r0, ar); break;
        default: avx512::F16DecodeStep<4, kBlocks, kPfPerStep>(blk, T, dk, d, qr, qp + r0, mx + r0, sum + r0, ar); break;
      }
    }
  };
  avx512::F16Block pair[2];
  int held = 0;
  for (int i = 0; i < n_pages; ++i) {
    const uint8_t* page = pages[i];
    const uint16_t* kt = reinterpret_cast<const uint16_t*>(page + data);
    const int m = i + 1 == n_pages ? m_last : T;
    const uint8_t* next = i + 2 < n_pages ? pages[i + 2] : i + 2 == n_pages ? after : nullptr;
    const size_t next_bytes = i + 2 < n_pages ? page_bytes : i + 2 == n_pages ? after_bytes : 0;
    const size_t spread = static_cast<size_t>((m + 15) / 16) * block_lines * 64;
    const char* pf = reinterpret_cast<const char*>(next != nullptr ? next : page);  // own page: already here
    for (size_t o = spread; next != nullptr && o < next_bytes; o += 64) _mm_prefetch(pf + o, _MM_HINT_T0);
    for (int j0 = 0; j0 < m; j0 += 16) {
      pair[held++] = {kt + j0, kt + values + static_cast<size_t>(j0) * d, PagePositions(page) + j0,
                      std::min(16, m - j0), 0, next != nullptr ? pf + static_cast<size_t>(j0 / 16) * block_lines * 64 : pf};
      if (held == 2) {
        step(pair);
        held = 0;
      }
    }
  }
  if (held == 1) {
    const avx512::F16Block one[1] = {pair[0]};
    step(one);
  }
}

// Cache lines of the page two ahead that F16DecodeStep requests per score
// step (4 channel rows of 16 entries): enough to cover a page's data in its
// steps, 4 for an f16 page (4 T d bytes over T d / 64 steps), more for a
// pruned page, whose T dk / 64 steps must cover 2 T (dk + d) bytes (6 for
// 32 of 64 channels), at most 8. With 4, the lines the steps missed were
// requested at once at the page's start, and kv_bench AllLayersPruned
// keep32 8k (1 thread, interleaved, loaded machine) ran 9.4-10.1 ms
// against 6.6-7.2 ms with 6.
inline int F16PrefetchLinesPerStep(int T, int dk, size_t page_bytes) {
  const size_t steps = static_cast<size_t>(T / 16) * (dk / 4);
  const size_t lines = (page_bytes - std::min(page_bytes, PageDataOffset(T)) + 63) / 64;
  return static_cast<int>(std::clamp<size_t>((lines + steps - 1) / steps, 4, 8));
}

// The fused f16 attention over a run of f16 pages (pages[i]: a page's
// start, its T positions then, from PageDataOffset(T), keys and values;
// every page holds T entries but the last, m_last), for nq <=
// kMaxQueryRows rows. The rows of several queries (a prompt's row block,
// 5-8 rows) take F16PromptPages when d % 32 == 0; otherwise
// avx512::F16DecodeStep runs over pairs of 16-entry blocks for groups of
// at most 4 rows, whose scores sum as the general path's do and whose
// softmax steps over 32 entries where the general path's steps over a
// page, so a decode step agrees with an observed one (the general path) up
// to the rounding of the weights' sums. While a page is
// computed the one two places on is prefetched: page_bytes of
// pages[i + 2], or after_bytes of `after` (may be null, the page the
// caller visits next) during the last but one; pages[1] at the start. (One
// page ahead left the stream short of requests: two ahead, kv_bench
// AllLayers f16 8k ran 4.5% faster on 2 threads and 3.5% on 1; three and
// four ahead were slower than two.) One call per run keeps the per-page
// cost outside the kernel low: calling the kernel page by page through the
// checks and dispatch of a single-page step, with the caller's per-page
// position checks, made decode attention at 8k context ~8% slower (kv_bench
// AllLayers f16, 2 threads). Keys of dk channel rows, values of d channels
// (F16DecodeStep): dk = d on f16 pages, fewer on ThinK's pruned pages,
// whose q is gathered to the kept channels ([nq][dk]) and whose prompt rows
// take the groups of 4. `tap` (may be null): the prompt kernel's weights
// (F16PromptPages), for an observer. REQUIRES: HasF16DecodePages(T, d),
// dk % 4 == 0; with a tap, F16PromptPagesApply(dk, d, qp, nq).
inline void F16DecodePages(const uint8_t* const* pages, int n_pages, int m_last, int T, int dk, int d,
                           size_t page_bytes, const float* q, const int32_t* qp, int nq, float* mx, float* sum,
                           float* acc, const uint8_t* after, size_t after_bytes, const WeightTap* tap = nullptr) {
  if (F16PromptPagesApply(dk, d, qp, nq)) {
    return F16PromptPages(pages, n_pages, m_last, T, d, q, qp, nq, mx, sum, acc, tap);
  }
  auto run = [&](auto pf) {
    F16DecodeRun<decltype(pf)::value>(pages, n_pages, m_last, T, dk, d, page_bytes, q, qp, nq, mx, sum, acc, after,
                                      after_bytes);
  };
  switch (F16PrefetchLinesPerStep(T, dk, page_bytes)) {
    case 5: return run(std::integral_constant<int, 5>{});
    case 6: return run(std::integral_constant<int, 6>{});
    case 7: return run(std::integral_constant<int, 7>{});
    case 8: return run(std::integral_constant<int, 8>{});
    default: return run(std::integral_constant<int, 4>{});
  }
}

// Scores over channel-major B-bit codes (DotCodeColumnsAvx2): AVX-512 when
// the CPU has it and columns are whole 16-byte blocks, else AVX2 for whole
// 8-byte blocks; false (nothing done) otherwise (the caller's scalar loop).
template <int B>
inline bool DotCodeColumns(const uint8_t* codes, int cb, int n, int d, const float* qs, int nq, const float* bias,
                           float* s, int ss) {
  if (UseAvx512() && cb % 16 == 0) {
    avx512::DotCodeColumns<B>(codes, cb, n, d, qs, nq, bias, s, ss);
    return true;
  }
  if (cb % 8 != 0) return false;
  DotCodeColumnsAvx2<B>(codes, cb, n, d, qs, nq, bias, s, ss);
  return true;
}

// avx512::DecodeCodeColumns when the AVX-512 kernels run and the shape
// allows (cb % 16 == 0, d % 16 == 0); false (nothing done) otherwise.
template <int B>
inline bool DecodeCodeColumns(const uint8_t* codes, int cb, const uint16_t* st, int n, int d, float* out) {
  if (!UseAvx512() || cb % 16 != 0 || d % 16 != 0) return false;
  avx512::DecodeCodeColumns<B>(codes, cb, st, n, d, out);
  return true;
}

// avx512::ScaleQueriesByChannel when the AVX-512 kernels run and d % 16 == 0;
// false (nothing done) otherwise.
inline bool ScaleQueriesByChannel(const uint16_t* st, int d, const float* q, int nq, float* qs, float* bias) {
  if (!UseAvx512() || d % 16 != 0 || nq > kMaxQueryRows) return false;
  avx512::ScaleQueriesByChannel(st, d, q, nq, qs, bias);
  return true;
}

// out[j][c] = row_j[c] (pre-RoPE keys, tests), AVX-512 or AVX2.
template <class Src>
inline void DecodeRowsQ(const Src& src, int n, int d, float* out) {
  if (UseAvx512For(src)) return avx512::DecodeRowsQ(src, n, d, out);
  DecodeRowsAvx2(src, n, d, out);
}

// avx512::SoftmaxStep when the AVX-512 kernels run; false (nothing done) when
// they do not.
inline bool SoftmaxStep(float* s, int ss, int n, int nr, float* mx, float* sum, float* f, bool* any) {
  if (!UseAvx512()) return false;
  WithQueryRows(nr, [&](auto rows) { *any = avx512::SoftmaxStep<decltype(rows)::value>(s, ss, n, mx, sum, f); });
  return true;
}

// Whether the SIMD path applies to rows of `d` elements on this CPU.
inline bool UseSimd(int d) {
  return d % 8 == 0 && HasAvx2Fma() && util::SimdClassAllowed(util::SimdClass::kAvx2);
}
// Whether the quantized SIMD path applies: whole 8-byte blocks per plane.
inline bool UseSimdQuant(int d, int bits) { return (d * bits) % 64 == 0 && UseSimd(d); }

#else

inline bool HasAvx512() { return false; }
inline bool UseSimd(int) { return false; }
inline bool UseSimdQuant(int, int) { return false; }
struct F16Rows {
  const uint16_t* rows;
  int d;
};
template <int B>
struct TokenRows {
  const uint8_t* codes;
  const float* params;
  int row_bytes, groups, group_shift;
};
template <class Src>
inline void DotRowsQN(const Src&, int, int, const float*, int, float*, int) {}
template <class Src>
inline void AxpyRowsQN(const Src&, int, int, const float*, int, int, float*) {}
inline void HalfToFloat(const uint16_t*, int, float*) {}
inline void FloatToHalf(const float*, int, uint16_t*) {}
struct F32Rows {
  const float* rows;
  int d;
};
template <class Src>
inline void DecodeRowsQ(const Src&, int, int, float*) {}
inline bool DotColumnsF16(const uint16_t*, int, int, int, const float*, int, float*, int) { return false; }
template <int B>
inline bool DotCodeColumns(const uint8_t*, int, int, int, const float*, int, const float*, float*, int) {
  return false;
}
inline bool ScaleQueriesByChannel(const uint16_t*, int, const float*, int, float*, float*) { return false; }
template <int B>
inline bool DecodeCodeColumns(const uint8_t*, int, const uint16_t*, int, int, float*) { return false; }
inline bool HasF16DecodePages(int, int) { return false; }
inline bool F16PromptPagesApply(int, int, const int32_t*, int) { return false; }
inline void F16DecodePages(const uint8_t* const*, int, int, int, int, int, size_t, const float*, const int32_t*, int,
                           float*, float*, float*, const uint8_t*, size_t, const WeightTap* = nullptr) {}
inline void RopeRow(float*, const float*, int, bool, bool) {}
inline float Max(const float*, int) { return 0; }
inline void Scale(float*, int, float) {}
inline void ScaledCopy(const float*, int, float, float*) {}
inline void AddScaled(float*, const float*, int, float) {}
inline bool SoftmaxStep(float*, int, int, int, float*, float*, float*, bool*) { return false; }
inline void MinMaxI32(const int32_t*, int, int32_t*, int32_t*) {}
inline float ExpSum(float*, int, float) { return 0; }

#endif

}  // namespace kvx::kv::simd
