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
#include <cstddef>
#include <cstdint>

namespace kvx::kv::simd {

// The features the AVX-512 kernels are compiled with, and the check that
// the CPU (and OS: zmm/opmask state in XCR0) has every one of them
// (util/cpu_features.h; read once).
#define KVX_KV_AVX512_FEATURES "avx512f,avx512bw,avx512vl,avx512dq," KVX_KV_AVX2_FEATURES
inline bool HasAvx512() {
  static const bool has = util::MissingCpuFeatures(KVX_KV_AVX512_FEATURES).empty();
  return has;
}

namespace avx512 {

#define KVX_KV_AVX512 __attribute__((target(KVX_KV_AVX512_FEATURES)))
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
// a * b + c with two roundings, never contracted into one fma (whatever
// -ffp-contract allows): the softmax running sums of the AVX-512 kernels
// (SoftmaxStep, F16DecodeStep) use it, so that their rounding is fixed by
// construction rather than by the compiler's choice.
KVX_KV_AVX512 inline float MulThenAdd(float a, float b, float c) {
  float p = a * b;
  __asm__("" : "+v"(p));  // opaque: the product is rounded before the add
  return p + c;
}
KVX_KV_AVX512 inline float ReduceSum(__m512 v) { return _mm512_cvtss_f32(Fold<0>(Fold<1>(Fold<2>(Fold<3>(v))))); }

// exp(x) for x <= kSoftmaxSlack: ExpSoftmax (simd_x86.h) on 16 lanes, the same
// polynomial and cut-offs, exp_poly (exactly 0 below -87.3, so -inf gives 0).
KVX_KV_AVX512 inline __m512 ExpSoftmax16(__m512 x) {
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
// x_r = s + r * ss: M = mx[r] unless max_j x_r[j] > mx[r] + kSoftmaxSlack,
// then M = max_j x_r[j] (the reference max, codec_id.h); x_r[j] = exp(x_r[j] - M)
// (0 for -inf; all 0 while M = -inf); sum[r] = sum[r] * f[r] + sum_j x_r[j]
// with f[r] = exp(mx[r] - M), the factor the row's accumulator must be
// scaled by (1 when the max did not rise or the row had nothing yet); mx[r] =
// M. Returns whether any weight is > 0.
// Fused over the rows, which are unrolled so their exp chains overlap, and
// the row max is reduced only when the reference rises: with 16-entry pages this
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
    if (_mm512_cmp_ps_mask(vmax[r], _mm512_set1_ps(mx[r] + kSoftmaxSlack), _CMP_GT_OQ) != 0) {
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
    acc[r] = ExpSoftmax16(_mm512_sub_ps(x0[r], m));
    StoreBlock(x, 0, full, tail, acc[r]);
    for (int b = 1; b < nb; ++b) {
      const __m512 e = ExpSoftmax16(_mm512_sub_ps(LoadBlock(x, b, full, tail), m));
      StoreBlock(x, b, full, tail, e);
      acc[r] = _mm512_add_ps(acc[r], e);
    }
  }
  bool any = false;
  KVX_KV_UNROLL
  for (int r = 0; r < NQ; ++r) {
    const float block_sum = ReduceSum(acc[r]);  // weights are >= 0: > 0 iff any is
    sum[r] = MulThenAdd(sum[r], f[r], block_sum);
    any |= block_sum > 0.0f;
  }
  return any;
}

// KVX_KV_AVX512 and KVX_KV_UNROLL stay defined for simd_avx512_columns.h,
// which simd_x86.h includes next and which undefines them.

}  // namespace avx512

// Whether the AVX-512 kernels run (CPU, and the class a test or benchmark
// forced through ops::ForceSimdTarget); for a row source, also its shape.
inline bool UseAvx512() { return HasAvx512() && util::SimdClassAllowed(util::SimdClass::kAvx512); }
template <class Src>
inline bool UseAvx512For(const Src& src) {
  return UseAvx512() && avx512::Zmm<Src>::Ok(src);
}

}  // namespace kvx::kv::simd

#endif  // KVX_KV_HAVE_X86_SIMD
