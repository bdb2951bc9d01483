// AVX-512 versions of the multi-query attention kernels of simd_x86.h
// (DotRowsQ, AxpyRowsQ, DecodeRowsQ over the same row sources), chosen at run
// time by the dispatchers there when the CPU has AVX-512F/BW/VL/DQ.
//
// Why a separate path: decode attention is compute-bound once the page is in
// cache, and on CPUs with full-width AVX-512 (Zen 5, recent Xeons) a zmm FMA
// does twice the work of a ymm one; the 32 zmm registers also hold all the
// accumulators of a GQA group for a whole head_dim row, so AxpyRowsQ walks a
// page row-major (sequential memory) instead of in column blocks. The library
// is built for baseline x86-64, so the code is compiled per function with a
// target attribute (no -mavx512 flags) and never runs on CPUs without it.
//
// Every call on one machine takes the same path with a fixed summation order,
// so results are deterministic and independent of the thread count; they
// differ from the AVX2 and scalar paths only by rounding.
//
// Included by simd_x86.h (after the row sources it adapts); include that.
#pragma once

#ifdef KVX_KV_HAVE_X86_SIMD

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace kvx::kv::simd {

// Tests only: route the kernels to the AVX2 path even when AVX-512 is there.
inline std::atomic<bool>& ForceAvx2ForTest() {
  static std::atomic<bool> force{false};
  return force;
}

// True when the CPU (and OS: zmm/opmask state enabled in XCR0) has
// AVX-512F/BW/VL/DQ on top of AVX2/FMA/F16C (checked once).
inline bool HasAvx512() {
  static const bool has = [] {
    if (!HasAvx2Fma()) return false;
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))) {
      return false;
    }
    unsigned eax, ebx, ecx, edx;  // volatile: see HasAvx2Fma
    __asm__ volatile("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(1), "c"(0));
    if (!((ecx >> 27) & 1u)) return false;  // OSXSAVE
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 0xE6u) == 0xE6u;  // SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM
  }();
  return has;
}

namespace avx512 {

#define KVX_KV_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define KVX_KV_UNROLL _Pragma("GCC unroll 16")

// ---- Row sources, 16 channels per zmm. ----
//
// Zmm<Src>::LoadPlanes(src, j, off, x) yields x[plane] = channels
// plane * span + off .. +15 of row j for each of kPlanes planes: for f16/f32
// rows 16 elements at `off`; for planar quantized rows (quant.h) the 16 bytes
// at byte `off`, one shift and mask per plane (the same packing the AVX2
// sources read 8 bytes at a time), then the affine map x^ = m + s * q.
// Ok(src) says whether the source's shape allows 16-wide blocks (otherwise
// the AVX2 kernels run).

// Conversions spelled with an all-ones zero-mask: GCC 12's unmasked
// intrinsics pass _mm512_undefined_*() (self-initialised) as the merge source,
// which trips -Wmaybe-uninitialized once inlined (GCC PR105593); with a
// constant full mask the compiler emits the same unmasked instructions.
KVX_KV_AVX512 inline __m512 CvtPh(const uint16_t* p) {
  return _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
KVX_KV_AVX512 inline __m512i CvtU8(const uint8_t* p) {
  return _mm512_maskz_cvtepu8_epi32(0xFFFF, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
KVX_KV_AVX512 inline __m512 CvtI32(__m512i v) { return _mm512_maskz_cvtepi32_ps(0xFFFF, v); }

template <class Src>
struct Zmm;

template <>
struct Zmm<F16Rows> {
  static constexpr int kPlanes = 1;
  static bool Ok(const F16Rows& s) { return s.d % 16 == 0; }
  KVX_KV_AVX512 static void LoadPlanes(const F16Rows& s, int j, int off, __m512* x) {
    x[0] = CvtPh(s.rows + static_cast<size_t>(j) * s.d + off);
  }
};

template <>
struct Zmm<F32Rows> {
  static constexpr int kPlanes = 1;
  static bool Ok(const F32Rows& s) { return s.d % 16 == 0; }
  KVX_KV_AVX512 static void LoadPlanes(const F32Rows& s, int j, int off, __m512* x) {
    x[0] = _mm512_loadu_ps(s.rows + static_cast<size_t>(j) * s.d + off);
  }
};

// The codes of all 8/B planes at the 16 bytes `p`, as floats.
template <int B>
KVX_KV_AVX512 inline void LoadAllPlanes16(const uint8_t* p, __m512* x) {
  const __m512i v = CvtU8(p);
  const __m512i mask = _mm512_set1_epi32((1 << B) - 1);
  KVX_KV_UNROLL
  for (int plane = 0; plane < 8 / B; ++plane) {
    const __m512i c = B < 8 ? _mm512_and_si512(_mm512_maskz_srli_epi32(0xFFFF, v, plane * B), mask) : v;
    x[plane] = CvtI32(c);
  }
}

// Per-token groups: REQUIRES groups of >= 16 channels (group_shift >= 4) so a
// 16-channel block has one (scale, min).
template <int B>
struct Zmm<TokenRows<B>> {
  static constexpr int kPlanes = 8 / B;
  static bool Ok(const TokenRows<B>& s) { return s.row_bytes % 16 == 0 && s.group_shift >= 4; }
  KVX_KV_AVX512 static void LoadPlanes(const TokenRows<B>& s, int j, int off, __m512* x) {
    LoadAllPlanes16<B>(s.codes + static_cast<size_t>(j) * s.row_bytes + off, x);
    const float* row = s.params + static_cast<size_t>(j) * s.groups * 2;
    KVX_KV_UNROLL
    for (int plane = 0; plane < kPlanes; ++plane) {
      const float* sm = row + ((plane * s.row_bytes + off) >> s.group_shift) * 2;
      x[plane] = _mm512_fmadd_ps(x[plane], _mm512_set1_ps(sm[0]), _mm512_set1_ps(sm[1]));
    }
  }
};

// ---- Joint horizontal reduction of several rows' accumulators. ----

// Level L of the reduction tree: a and b each hold partial sums of 2^L keys
// (key = lane mod 2^L); the result holds the 2^(L+1) keys of both (a's in
// lanes with bit L clear, b's with it set), each lane the sum of the lane and
// its partner lane i ^ 2^L. One blend, one two-source permute, one add.
template <int L>
inline constexpr std::array<int32_t, 16> kPartner = [] {
  // partner of lane i: lane i ^ 2^L of (i has bit L ? b : a); index bit 4 selects b.
  std::array<int32_t, 16> idx{};
  for (int i = 0; i < 16; ++i) idx[i] = (i ^ (1 << L)) | ((i >> L) & 1 ? 16 : 0);
  return idx;
}();

template <int L>
KVX_KV_AVX512 inline __m512 Merge(__m512 a, __m512 b) {
  constexpr __mmask16 kMask = L == 0 ? 0xAAAA : L == 1 ? 0xCCCC : L == 2 ? 0xF0F0 : 0xFF00;  // lanes with bit L
  const __m512 own = _mm512_mask_blend_ps(kMask, a, b);  // lane i: (bit L ? b : a)[i]
  const __m512 partner = _mm512_permutex2var_ps(a, _mm512_loadu_si512(kPartner<L>.data()), b);
  return _mm512_add_ps(own, partner);
}

// v + v's lanes moved by 2^L (within 2^(L+1)-lane blocks): lanes with bit L
// clear then hold the sums of their pair.
template <int L>
KVX_KV_AVX512 inline __m512 Fold(__m512 v) {
  if constexpr (L == 3) return _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(0xFFFF, v, v, 0x4E));
  if constexpr (L == 2) return _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(0xFFFF, v, v, 0xB1));
  if constexpr (L == 1) return _mm512_add_ps(v, _mm512_maskz_permute_ps(0xFFFF, v, 0x4E));
  if constexpr (L == 0) return _mm512_add_ps(v, _mm512_maskz_permute_ps(0xFFFF, v, 0xB1));
}

// out[k] = sum of the lanes of a[k] for k < KJ (KJ in 1, 2, 4, 8, 16), in a
// fixed order: a reduction tree over the keys (key k ends in lanes k mod KJ),
// then the 16/KJ lanes of each key folded together.
template <int KJ>
KVX_KV_AVX512 inline void ReduceStore(const __m512* a, float* out) {
  __m512 t[KJ];
  KVX_KV_UNROLL
  for (int k = 0; k < KJ; ++k) t[k] = a[k];
  if constexpr (KJ >= 2) {
    KVX_KV_UNROLL
    for (int k = 0; k < KJ / 2; ++k) t[k] = Merge<0>(t[2 * k], t[2 * k + 1]);
  }
  if constexpr (KJ >= 4) {
    KVX_KV_UNROLL
    for (int k = 0; k < KJ / 4; ++k) t[k] = Merge<1>(t[2 * k], t[2 * k + 1]);
  }
  if constexpr (KJ >= 8) {
    KVX_KV_UNROLL
    for (int k = 0; k < KJ / 8; ++k) t[k] = Merge<2>(t[2 * k], t[2 * k + 1]);
  }
  if constexpr (KJ >= 16) t[0] = Merge<3>(t[0], t[1]);
  __m512 v = t[0];
  if constexpr (KJ <= 8) v = Fold<3>(v);
  if constexpr (KJ <= 4) v = Fold<2>(v);
  if constexpr (KJ <= 2) v = Fold<1>(v);
  if constexpr (KJ <= 1) v = Fold<0>(v);
  _mm512_mask_storeu_ps(out, static_cast<__mmask16>((1u << KJ) - 1), v);
}

// ---- Kernels. Same contracts as the AVX2 ones in simd_x86.h, plus
// Zmm<Src>::Ok(src) (span() a multiple of 16). ----

// Scores of rows j..j+KJ-1 against the NQ query rows: per row and query one
// 16-lane accumulator over the row's channel blocks, then one joint
// reduction per query over the KJ rows.
template <class Src, int NQ, int KJ>
KVX_KV_AVX512 __attribute__((always_inline)) inline void DotBlock(const Src& src, int j, int span, int d, const float* q, float* s, int ss) {
  constexpr int P = Zmm<Src>::kPlanes;
  __m512 a[NQ][KJ];
  KVX_KV_UNROLL
  for (int r = 0; r < NQ; ++r) {
    KVX_KV_UNROLL
    for (int k = 0; k < KJ; ++k) a[r][k] = _mm512_setzero_ps();
  }
  for (int off = 0; off < span; off += 16) {
    __m512 qv[P][NQ];
    KVX_KV_UNROLL
    for (int plane = 0; plane < P; ++plane) {
      KVX_KV_UNROLL
      for (int r = 0; r < NQ; ++r) qv[plane][r] = _mm512_loadu_ps(q + static_cast<size_t>(r) * d + plane * span + off);
    }
    KVX_KV_UNROLL
    for (int k = 0; k < KJ; ++k) {
      __m512 x[P];
      Zmm<Src>::LoadPlanes(src, j + k, off, x);
      KVX_KV_UNROLL
      for (int plane = 0; plane < P; ++plane) {
        KVX_KV_UNROLL
        for (int r = 0; r < NQ; ++r) a[r][k] = _mm512_fmadd_ps(qv[plane][r], x[plane], a[r][k]);
      }
    }
  }
  KVX_KV_UNROLL
  for (int r = 0; r < NQ; ++r) ReduceStore<KJ>(a[r], s + static_cast<size_t>(r) * ss + j);
}

// s[r*ss + j] = q_r . row_j for r < NQ, j < n. KJ rows at a time (NQ * KJ
// >= 8 accumulators keep both FMA pipes busy; the joint reduction costs about
// one blend + permute + add per row and query).
template <class Src, int NQ>
KVX_KV_AVX512 inline void DotRowsQ(const Src& src, int n, int d, const float* q, float* s, int ss) {
  constexpr int KJ = NQ == 1 ? 8 : NQ <= 4 ? 4 : 2;
  const int span = src.span();
  int j = 0;
  for (; j + KJ <= n; j += KJ) DotBlock<Src, NQ, KJ>(src, j, span, d, q, s, ss);
  if constexpr (KJ > 4) {
    if (j + 4 <= n) {
      DotBlock<Src, NQ, 4>(src, j, span, d, q, s, ss);
      j += 4;
    }
  }
  if constexpr (KJ > 2) {
    if (j + 2 <= n) {
      DotBlock<Src, NQ, 2>(src, j, span, d, q, s, ss);
      j += 2;
    }
  }
  for (; j < n; ++j) DotBlock<Src, NQ, 1>(src, j, span, d, q, s, ss);
}

// acc[r][c] += sum_{j<n} w[r*ws + j] * row_j[c] for the W 16-byte (or
// 16-element) blocks at offset off0, all planes: the NQ * W * P accumulators
// stay in registers while the rows are walked in order. With few accumulators
// even and odd rows feed separate sets (added at the end) so the FMA chains
// overlap. Fixed order either way.
template <class Src, int NQ, int W>
KVX_KV_AVX512 inline void AxpyBlock(const Src& src, int n, int off0, int span, int d, const float* w, int ws,
                                    float* acc) {
  constexpr int P = Zmm<Src>::kPlanes;
  constexpr bool kTwo = NQ * W * P <= 4;
  __m512 a0[NQ][W][P], a1[NQ][W][P];
  KVX_KV_UNROLL
  for (int r = 0; r < NQ; ++r) {
    KVX_KV_UNROLL
    for (int b = 0; b < W; ++b) {
      KVX_KV_UNROLL
      for (int pl = 0; pl < P; ++pl) {
        a0[r][b][pl] = _mm512_loadu_ps(acc + static_cast<size_t>(r) * d + pl * span + off0 + 16 * b);
        a1[r][b][pl] = _mm512_setzero_ps();
      }
    }
  }
  int j = 0;
  if constexpr (kTwo) {
    for (; j + 2 <= n; j += 2) {
      __m512 x0[W][P], x1[W][P];
      KVX_KV_UNROLL
      for (int b = 0; b < W; ++b) {
        Zmm<Src>::LoadPlanes(src, j, off0 + 16 * b, x0[b]);
        Zmm<Src>::LoadPlanes(src, j + 1, off0 + 16 * b, x1[b]);
      }
      KVX_KV_UNROLL
      for (int r = 0; r < NQ; ++r) {
        const __m512 w0 = _mm512_set1_ps(w[static_cast<size_t>(r) * ws + j]);
        const __m512 w1 = _mm512_set1_ps(w[static_cast<size_t>(r) * ws + j + 1]);
        KVX_KV_UNROLL
        for (int b = 0; b < W; ++b) {
          KVX_KV_UNROLL
          for (int pl = 0; pl < P; ++pl) {
            a0[r][b][pl] = _mm512_fmadd_ps(w0, x0[b][pl], a0[r][b][pl]);
            a1[r][b][pl] = _mm512_fmadd_ps(w1, x1[b][pl], a1[r][b][pl]);
          }
        }
      }
    }
  }
  for (; j < n; ++j) {
    __m512 x[W][P];
    KVX_KV_UNROLL
    for (int b = 0; b < W; ++b) Zmm<Src>::LoadPlanes(src, j, off0 + 16 * b, x[b]);
    KVX_KV_UNROLL
    for (int r = 0; r < NQ; ++r) {
      const __m512 wr = _mm512_set1_ps(w[static_cast<size_t>(r) * ws + j]);
      KVX_KV_UNROLL
      for (int b = 0; b < W; ++b) {
        KVX_KV_UNROLL
        for (int pl = 0; pl < P; ++pl) a0[r][b][pl] = _mm512_fmadd_ps(wr, x[b][pl], a0[r][b][pl]);
      }
    }
  }
  KVX_KV_UNROLL
  for (int r = 0; r < NQ; ++r) {
    KVX_KV_UNROLL
    for (int b = 0; b < W; ++b) {
      KVX_KV_UNROLL
      for (int pl = 0; pl < P; ++pl) {
        const __m512 v = kTwo ? _mm512_add_ps(a0[r][b][pl], a1[r][b][pl]) : a0[r][b][pl];
        _mm512_storeu_ps(acc + static_cast<size_t>(r) * d + pl * span + off0 + 16 * b, v);
      }
    }
  }
}

// acc[r][c] += sum_{j<n} w[r*ws + j] * row_j[c] for r < NQ. The row is cut
// into the widest blocks whose accumulators fit (<= kMaxAcc zmm; d = 64 is a
// single block up to 6 query rows for f16), so each row is read once per
// block, sequentially. Too many accumulators even for one block (many planes
// and query rows): the query rows are split in two.
template <class Src, int NQ>
KVX_KV_AVX512 inline void AxpyRowsQ(const Src& src, int n, int d, const float* w, int ws, float* acc) {
  constexpr int P = Zmm<Src>::kPlanes, kMaxAcc = 24;
  if constexpr (NQ * P > kMaxAcc) {
    constexpr int kHalf = NQ / 2;
    avx512::AxpyRowsQ<Src, kHalf>(src, n, d, w, ws, acc);
    avx512::AxpyRowsQ<Src, NQ - kHalf>(src, n, d, w + static_cast<size_t>(kHalf) * ws, ws, acc + static_cast<size_t>(kHalf) * d);
  } else {
    const int span = src.span();
    int off = 0;
    if constexpr (NQ * P * 8 <= kMaxAcc) {
      for (; off + 128 <= span; off += 128) AxpyBlock<Src, NQ, 8>(src, n, off, span, d, w, ws, acc);
    }
    if constexpr (NQ * P * 4 <= kMaxAcc) {
      for (; off + 64 <= span; off += 64) AxpyBlock<Src, NQ, 4>(src, n, off, span, d, w, ws, acc);
    }
    if constexpr (NQ * P * 2 <= kMaxAcc) {
      for (; off + 32 <= span; off += 32) AxpyBlock<Src, NQ, 2>(src, n, off, span, d, w, ws, acc);
    }
    for (; off < span; off += 16) AxpyBlock<Src, NQ, 1>(src, n, off, span, d, w, ws, acc);
  }
}

// out[j][c] = row_j[c].
template <class Src>
KVX_KV_AVX512 inline void DecodeRowsQ(const Src& src, int n, int d, float* out) {
  constexpr int P = Zmm<Src>::kPlanes;
  const int span = src.span();
  for (int j = 0; j < n; ++j) {
    float* o = out + static_cast<size_t>(j) * d;
    for (int off = 0; off < span; off += 16) {
      __m512 x[P];
      Zmm<Src>::LoadPlanes(src, j, off, x);
      KVX_KV_UNROLL
      for (int plane = 0; plane < P; ++plane) _mm512_storeu_ps(o + plane * span + off, x[plane]);
    }
  }
}

// ---- Scores over channel-major f16 keys (see DotColumnsAvx2). ----

// out[b][r] = the scores of rows [0, NR) of q against the 16 entries at
// j0 + 16 b, b < NB (channel loads masked by `load` unless kFullLoad: a
// page of fewer than 16 entries). Same summation order as the AVX2 and
// scalar paths.
template <int NR, int NB, bool kFullLoad>
KVX_KV_AVX512 inline void ColumnDots(const uint16_t* kt, int T, int j0, __mmask16 load, int d, const float* q,
                                     __m512 (&out)[NB][NR], const char* pf = nullptr, int pf_lines = 0) {
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
    // Optional software prefetch spread over the loop: pf_lines cache lines
    // from pf per step (F16DecodePage's next page).
    for (int i = 0; i < pf_lines; ++i) _mm_prefetch(pf + (static_cast<size_t>(c / 4) * pf_lines + i) * 64, _MM_HINT_T0);
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

// ---- Softmax. ----

// (Full-mask spellings for the reason given at CvtPh.)
KVX_KV_AVX512 inline __m512 Max16(__m512 a, __m512 b) { return _mm512_maskz_max_ps(0xFFFF, a, b); }
// The largest and the sum of the 16 lanes.
KVX_KV_AVX512 inline float ReduceMax(__m512 v) {
  v = Max16(v, _mm512_maskz_shuffle_f32x4(0xFFFF, v, v, 0x4E));
  v = Max16(v, _mm512_maskz_shuffle_f32x4(0xFFFF, v, v, 0xB1));
  v = Max16(v, _mm512_maskz_permute_ps(0xFFFF, v, 0x4E));
  v = Max16(v, _mm512_maskz_permute_ps(0xFFFF, v, 0xB1));
  return _mm512_cvtss_f32(v);
}
KVX_KV_AVX512 inline float ReduceSum(__m512 v) { return _mm512_cvtss_f32(Fold<0>(Fold<1>(Fold<2>(Fold<3>(v))))); }

// exp(x) for x <= 0: ExpNonPositive (simd_x86.h) on 16 lanes, the same
// polynomial and cut-offs, exp_poly (exactly 0 below -87.3, so -inf gives 0).
KVX_KV_AVX512 inline __m512 ExpNonPositive16(__m512 x) {
  using namespace exp_poly;
  const __mmask16 zero_below = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kCut), _CMP_LT_OQ);
  x = Max16(x, _mm512_set1_ps(kCut));
  const __m512 t = _mm512_fmadd_ps(x, _mm512_set1_ps(kLog2e), _mm512_set1_ps(0.5f));
  const __m512 fx = _mm512_maskz_roundscale_ps(0xFFFF, t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);  // floor
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(kLn2Hi), x);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(kLn2Lo), x);
  __m512 y = _mm512_set1_ps(kP[0]);
  for (int i = 1; i < 6; ++i) y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(kP[i]));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
  // y * 2^fx: fx >= -126, so this is the multiplication by the normal 2^fx.
  return _mm512_maskz_scalef_ps(static_cast<__mmask16>(~zero_below), y, fx);
}

// Block b of 16 floats at x: whole when b < full, else the `tail` lanes
// (loaded as -inf beyond them).
KVX_KV_AVX512 inline __m512 LoadBlock(const float* x, int b, int full, __mmask16 tail) {
  if (b < full) return _mm512_loadu_ps(x + 16 * b);
  return _mm512_mask_loadu_ps(_mm512_set1_ps(-__builtin_inff()), tail, x + 16 * b);
}
KVX_KV_AVX512 inline void StoreBlock(float* x, int b, int full, __mmask16 tail, __m512 v) {
  if (b < full) {
    _mm512_storeu_ps(x + 16 * b, v);
  } else {
    _mm512_mask_storeu_ps(x + 16 * b, tail, v);
  }
}

// One online-softmax step over a block of n >= 1 scores per row, for the NQ rows
// x_r = s + r * ss: M = max(mx[r], max_j x_r[j]); x_r[j] = exp(x_r[j] - M)
// (0 for -inf; all 0 while M = -inf); sum[r] = sum[r] * f[r] + sum_j x_r[j]
// with f[r] = exp(mx[r] - M), the factor the row's accumulator must be
// scaled by (1 when the max did not rise or the row had nothing yet); mx[r] =
// M. Returns whether any weight is > 0.
// Fused over the rows, which are unrolled so their exp chains overlap, and
// the row max is reduced only when it rises: with 16-entry pages this
// bookkeeping otherwise costs about as much as the scores. A block of at most
// 16 stays in registers.
template <int NQ>
KVX_KV_AVX512 inline bool SoftmaxStep(float* s, int ss, int n, float* mx, float* sum, float* f) {
  const int full = n / 16;  // whole blocks of 16, then a masked tail
  const __mmask16 tail = static_cast<__mmask16>((1u << (n % 16)) - 1);
  const int nb = full + (tail != 0);
  __m512 x0[NQ], vmax[NQ];
  KVX_KV_UNROLL
  for (int r = 0; r < NQ; ++r) {
    const float* x = s + static_cast<size_t>(r) * ss;
    vmax[r] = x0[r] = LoadBlock(x, 0, full, tail);
    for (int b = 1; b < nb; ++b) vmax[r] = Max16(vmax[r], LoadBlock(x, b, full, tail));
  }
  KVX_KV_UNROLL
  for (int r = 0; r < NQ; ++r) {
    f[r] = 1.0f;
    if (_mm512_cmp_ps_mask(vmax[r], _mm512_set1_ps(mx[r]), _CMP_GT_OQ) != 0) {
      const float m = ReduceMax(vmax[r]);
      if (mx[r] != -__builtin_inff()) f[r] = __builtin_expf(mx[r] - m);
      mx[r] = m;
    }
  }
  // A row with nothing visible yet (M = -inf) has only -inf scores: against
  // -FLT_MAX instead of M they still give exp(-inf) = 0, without a branch.
  __m512 acc[NQ];
  KVX_KV_UNROLL
  for (int r = 0; r < NQ; ++r) {
    float* x = s + static_cast<size_t>(r) * ss;
    const __m512 m = _mm512_set1_ps(mx[r] == -__builtin_inff() ? -__FLT_MAX__ : mx[r]);
    acc[r] = ExpNonPositive16(_mm512_sub_ps(x0[r], m));
    StoreBlock(x, 0, full, tail, acc[r]);
    for (int b = 1; b < nb; ++b) {
      const __m512 e = ExpNonPositive16(_mm512_sub_ps(LoadBlock(x, b, full, tail), m));
      StoreBlock(x, b, full, tail, e);
      acc[r] = _mm512_add_ps(acc[r], e);
    }
  }
  bool any = false;
  KVX_KV_UNROLL
  for (int r = 0; r < NQ; ++r) {
    const float block_sum = ReduceSum(acc[r]);  // weights are >= 0: > 0 iff any is
    sum[r] = sum[r] * f[r] + block_sum;
    any |= block_sum > 0.0f;
  }
  return any;
}

// ---- KIVI keys: queries scaled per channel. ----

// qs[r][c] = q[r][c] * scale_c and bias[r] = sum_c q[r][c] * min_c for
// r < nq, from the page's interleaved f16 (scale_c, min_c) pairs st[2c],
// st[2c + 1]: DotCodeColumns' inputs, once per page visit. REQUIRES:
// d % 16 == 0, nq <= 8.
KVX_KV_AVX512 inline void ScaleQueriesByChannel(const uint16_t* st, int d, const float* q, int nq, float* qs,
                                                float* bias) {
  alignas(64) static constexpr int32_t kEven[16] = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
  alignas(64) static constexpr int32_t kOdd[16] = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
  const __m512i even = _mm512_load_si512(kEven), odd = _mm512_load_si512(kOdd);
  __m512 b[8];
  for (int r = 0; r < nq; ++r) b[r] = _mm512_setzero_ps();
  for (int c0 = 0; c0 < d; c0 += 16) {
    const __m512 lo = CvtPh(st + 2 * c0), hi = CvtPh(st + 2 * c0 + 16);
    const __m512 scale = _mm512_permutex2var_ps(lo, even, hi), min = _mm512_permutex2var_ps(lo, odd, hi);
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
  alignas(64) static constexpr int32_t kEven[16] = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
  alignas(64) static constexpr int32_t kOdd[16] = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
  const __m512i even = _mm512_load_si512(kEven), odd = _mm512_load_si512(kOdd);
  const __m512i mask = _mm512_set1_epi32((1 << B) - 1);
  for (int c0 = 0; c0 < d; c0 += 16) {
    alignas(64) float scale[16], min[16];
    const __m512 lo = CvtPh(st + 2 * c0), hi = CvtPh(st + 2 * c0 + 16);
    _mm512_store_ps(scale, _mm512_permutex2var_ps(lo, even, hi));
    _mm512_store_ps(min, _mm512_permutex2var_ps(lo, odd, hi));
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

// The page's first m entries (keys channel-major kt, values row-major v),
// all visible to the NR query rows q, folded into each row's running
// (mx, sum, acc) 16 entries at a time: the block's scores stay in registers
// (ColumnDots), one online-softmax step (the max is reduced only when it
// rises; a rise rescales the row's sum and accumulator), and the weights go
// straight into the value FMAs. The same arithmetic as DotColumns +
// SoftmaxStep + AxpyRowsQ except that the softmax steps over blocks of 16
// (not whole pages), so results agree with them up to rounding. On
// 16-entry pages the separate kernels spent as long on the softmax
// bookkeeping between them as on the scores. REQUIRES: T % 16 == 0,
// d % 16 == 0, NR <= 4.
template <int NR>
KVX_KV_AVX512 inline void F16DecodePage(const uint16_t* kt, const uint16_t* v, int T, int m, int d, const float* q,
                                        float* mx, float* sum, float* acc, const uint8_t* next, size_t next_bytes) {
  alignas(64) float w[NR][16];
  // The next page is prefetched a few lines per score step, spread over the
  // page's 16-entry blocks, so its misses overlap this page's arithmetic.
  const int steps = (m + 15) / 16 * (d / 4);
  const int pf_lines = next == nullptr ? 0 : static_cast<int>((next_bytes / 64 + steps - 1) / steps);
  const char* pf = reinterpret_cast<const char*>(next);
  for (int j0 = 0; j0 < m; j0 += 16) {
    const int valid = std::min(16, m - j0);
    __m512 sc[1][NR];
    ColumnDots<NR, 1, true>(kt, T, j0, 0xFFFF, d, q, sc, pf, pf_lines);
    pf += static_cast<size_t>(d / 4) * pf_lines * 64;
    const __mmask16 live = valid == 16 ? 0xFFFF : static_cast<__mmask16>((1u << valid) - 1);
    KVX_KV_UNROLL
    for (int r = 0; r < NR; ++r) {
      const __m512 x = _mm512_mask_blend_ps(live, _mm512_set1_ps(-__builtin_inff()), sc[0][r]);
      float f = 1.0f;
      if (_mm512_cmp_ps_mask(x, _mm512_set1_ps(mx[r]), _CMP_GT_OQ) != 0) {
        const float mnew = ReduceMax(x);
        if (mx[r] != -__builtin_inff()) f = __builtin_expf(mx[r] - mnew);
        mx[r] = mnew;
      }
      const __m512 mv = _mm512_set1_ps(mx[r] == -__builtin_inff() ? -__FLT_MAX__ : mx[r]);
      const __m512 e = ExpNonPositive16(_mm512_sub_ps(x, mv));
      _mm512_store_ps(w[r], e);
      if (f != 1.0f) {
        float* a = acc + static_cast<size_t>(r) * d;
        const __m512 fv = _mm512_set1_ps(f);
        for (int c = 0; c < d; c += 16) _mm512_storeu_ps(a + c, _mm512_mul_ps(_mm512_loadu_ps(a + c), fv));
      }
      sum[r] = sum[r] * f + ReduceSum(e);
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

#undef KVX_KV_AVX512
#undef KVX_KV_UNROLL

}  // namespace avx512

// Whether the AVX-512 kernels run (CPU, test hook); for a row source, also its shape.
inline bool UseAvx512() { return HasAvx512() && !ForceAvx2ForTest().load(std::memory_order_relaxed); }
template <class Src>
inline bool UseAvx512For(const Src& src) {
  return UseAvx512() && avx512::Zmm<Src>::Ok(src);
}

}  // namespace kvx::kv::simd

#endif  // KVX_KV_HAVE_X86_SIMD
