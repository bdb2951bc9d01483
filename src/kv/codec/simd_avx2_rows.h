// AVX2 row helpers: rows decoded to floats, the rotary embedding of a row,
// half <-> float conversions, and the vectorised exp and softmax pieces the
// attention kernels use.
//
// Included by simd_x86.h at the end of its AVX2 section (whose KVX_KV_AVX2
// and KVX_KV_UNROLL macros and helpers it uses); include simd_x86.h.
#pragma once

#ifdef KVX_KV_HAVE_X86_SIMD

namespace kvx::kv::simd {

// out[j][c] = row_j[c]: rows decoded to floats (pre-RoPE keys, tests).
template <class Src>
KVX_KV_AVX2 inline void DecodeRowsAvx2(const Src& src, int n, int d, float* out) {
  const int span = src.span();
  for (int j = 0; j < n; ++j) {
    float* o = out + static_cast<size_t>(j) * d;
    for (int off = 0; off < span; off += 8) {
      __m256 x[Src::kPlanes];
      src.LoadPlanes(j, off, x);
      KVX_KV_UNROLL
      for (int plane = 0; plane < Src::kPlanes; ++plane) _mm256_storeu_ps(o + plane * span + off, x[plane]);
    }
  }
}

// Rotary embedding of row x in place with cs = ops::RopeCosSin(pos) (cos, sin
// interleaved per pair), the same rotation as ops::RopeApply up to FMA rounding:
//   (x_a, x_b) -> (x_a cos - x_b sin, x_a sin + x_b cos);
// with `inverse` the rotation by -angle (sin negated).
// Normal layout (pairs 2i, 2i+1): REQUIRES n_dims % 8 == 0. NeoX (pairs i,
// i + n_dims/2): REQUIRES n_dims % 16 == 0.
KVX_KV_AVX2 inline void RopeRow(float* x, const float* cs, int n_dims, bool neox, bool inverse) {
  const __m256 sign = _mm256_set1_ps(inverse ? -1.0f : 1.0f);
  if (!neox) {
    for (int c = 0; c < n_dims; c += 8) {
      const __m256 v = _mm256_loadu_ps(x + c), t = _mm256_loadu_ps(cs + c);
      const __m256 cos = _mm256_moveldup_ps(t), sin = _mm256_mul_ps(_mm256_movehdup_ps(t), sign);
      const __m256 swapped = _mm256_permute_ps(v, 0xB1);  // (x_b, x_a) per pair
      // even lanes: x_a cos - x_b sin; odd lanes: x_b cos + x_a sin.
      _mm256_storeu_ps(x + c, _mm256_fmaddsub_ps(v, cos, _mm256_mul_ps(swapped, sin)));
    }
    return;
  }
  const int half = n_dims / 2;
  for (int i = 0; i < half; i += 8) {
    const __m256 t0 = _mm256_loadu_ps(cs + 2 * i), t1 = _mm256_loadu_ps(cs + 2 * i + 8);
    // Deinterleave (c0 s0 c1 s1 ...) into cos[i..i+7] and sin[i..i+7].
    const __m256 cos = _mm256_castpd_ps(
        _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(t0, t1, 0x88)), 0xD8));
    const __m256 sin = _mm256_mul_ps(
        sign, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(t0, t1, 0xDD)), 0xD8)));
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + half);
    _mm256_storeu_ps(x + i, _mm256_fmsub_ps(a, cos, _mm256_mul_ps(b, sin)));
    _mm256_storeu_ps(x + i + half, _mm256_fmadd_ps(a, sin, _mm256_mul_ps(b, cos)));
  }
}

// n halves -> floats.
KVX_KV_AVX2 inline void HalfToFloat(const uint16_t* h, int n, float* out) {
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
  }
  for (; i < n; ++i) out[i] = _cvtsh_ss(h[i]);
}

// n floats -> halves, exactly FloatToFp16 (util/fp16.h): F16C rounds to
// nearest even as it does; it keeps NaN payloads, which FloatToFp16 does
// not (every NaN becomes the quiet NaN 0x7E00 with its sign), so a group
// holding a NaN is redone by it.
KVX_KV_AVX2 inline void FloatToHalf(const float* x, int n, uint16_t* out) {
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0) {
      for (int j = i; j < i + 8; ++j) out[j] = FloatToFp16(x[j]);
      continue;
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) out[i] = FloatToFp16(x[i]);
}

// ---- Softmax pieces. ----

// exp(x) for the softmax's x = s - reference max <= kSoftmaxSlack (codec_id.h;
// the result is built as poly * 2^n, valid while n + 127 fits an exponent)
// (Cephes expf: x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial; about
// 1 ulp), exactly 1 at 0 and exactly 0 below -87.3 (so masked entries,
// x = -inf, get weight 0).
// Its constants, shared with the AVX-512 version (simd_avx512.h).
namespace exp_poly {
inline constexpr float kCut = -87.3f;                    // below: exactly 0
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;  // ln 2 in two parts
inline constexpr float kP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
}  // namespace exp_poly
KVX_KV_AVX2 inline __m256 ExpSoftmax(__m256 x) {
  using namespace exp_poly;
  const __m256 zero_below = _mm256_cmp_ps(x, _mm256_set1_ps(kCut), _CMP_LT_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(kCut));
  const __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(kLog2e), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(kLn2Hi), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(kLn2Lo), x);
  __m256 y = _mm256_set1_ps(kP[0]);
  for (int i = 1; i < 6; ++i) y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(kP[i]));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(zero_below, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

// max_j x[j] (-inf for n == 0).
KVX_KV_AVX2 inline float Max(const float* x, int n) {
  __m256 mx = _mm256_set1_ps(-__builtin_inff());
  int j = 0;
  for (; j + 8 <= n; j += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(x + j));
  float m = -__builtin_inff();
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, mx);
  for (float l : lanes) m = l > m ? l : m;
  for (; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

// x[j] *= f.
KVX_KV_AVX2 inline void Scale(float* x, int n, float f) {
  const __m256 fv = _mm256_set1_ps(f);
  int j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(x + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), fv));
  for (; j < n; ++j) x[j] *= f;
}

// y[j] = x[j] * f: Scale into another buffer, one pass instead of a copy
// and Scale (whose loads then waited on the copy's stores).
KVX_KV_AVX2 inline void ScaledCopy(const float* x, int n, float f, float* y) {
  const __m256 fv = _mm256_set1_ps(f);
  int j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), fv));
  for (; j < n; ++j) y[j] = x[j] * f;
}

// y[j] += a * x[j] (fused: one rounding, where the scalar tail rounds twice).
KVX_KV_AVX2 inline void AddScaled(float* y, const float* x, int n, float a) {
  const __m256 av = _mm256_set1_ps(a);
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    _mm256_storeu_ps(y + j, _mm256_fmadd_ps(_mm256_loadu_ps(x + j), av, _mm256_loadu_ps(y + j)));
  }
  for (; j < n; ++j) y[j] += a * x[j];
}

// Smallest and largest of x[0..n) (n >= 1).
KVX_KV_AVX2 inline void MinMaxI32(const int32_t* x, int n, int32_t* lo, int32_t* hi) {
  int j = 0;
  int32_t mn = x[0], mx = x[0];
  if (n >= 8) {
    __m256i vmn = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)), vmx = vmn;
    for (j = 8; j + 8 <= n; j += 8) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j));
      vmn = _mm256_min_epi32(vmn, v);
      vmx = _mm256_max_epi32(vmx, v);
    }
    alignas(32) int32_t a[8], b[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(a), vmn);
    _mm256_store_si256(reinterpret_cast<__m256i*>(b), vmx);
    for (int t = 0; t < 8; ++t) mn = a[t] < mn ? a[t] : mn, mx = b[t] > mx ? b[t] : mx;
  }
  for (; j < n; ++j) mn = x[j] < mn ? x[j] : mn, mx = x[j] > mx ? x[j] : mx;
  *lo = mn;
  *hi = mx;
}

// x[j] = exp(x[j] - m) (0 for x[j] = -inf); returns sum_j x[j], summed in 8
// lanes then pairwise (a fixed order).
KVX_KV_AVX2 inline float ExpSum(float* x, int n, float m) {
  const __m256 mv = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 e = ExpSoftmax(_mm256_sub_ps(_mm256_loadu_ps(x + j), mv));
    _mm256_storeu_ps(x + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  if (j < n) {  // tail through a padded lane block (-inf pads give 0)
    alignas(32) float tail[8];
    for (int t = 0; t < 8; ++t) tail[t] = j + t < n ? x[j + t] : -__builtin_inff();
    const __m256 e = ExpSoftmax(_mm256_sub_ps(_mm256_load_ps(tail), mv));
    _mm256_store_ps(tail, e);
    for (int t = 0; j + t < n; ++t) x[j + t] = tail[t];
    acc = _mm256_add_ps(acc, e);
  }
  return HorizontalSum(acc);
}

}  // namespace kvx::kv::simd

#endif  // KVX_KV_HAVE_X86_SIMD
