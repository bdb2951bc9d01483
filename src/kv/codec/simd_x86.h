// AVX2/FMA/F16C versions of the codecs' attention inner loops, chosen at run
// time (the library is built for baseline x86-64). Every call on one machine
// takes the same path, so results stay deterministic and independent of the
// thread count; they differ from the scalar path only by rounding (FMA,
// summation order). Non-x86 builds use the scalar loops.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#define KVX_KV_HAVE_X86_SIMD 1
#include <immintrin.h>
#endif

namespace kvx::kv::simd {

#ifdef KVX_KV_HAVE_X86_SIMD

// True when the CPU has AVX2, FMA and F16C (checked once).
inline bool HasAvx2Fma() {
  static const bool has = [] {
    __builtin_cpu_init();
    // F16C is read from CPUID leaf 1 (ECX bit 29) directly: clang 14's
    // __builtin_cpu_supports does not know "f16c".
    unsigned eax, ebx, ecx, edx;
    __asm__("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(1), "c"(0));
    const bool f16c = (ecx >> 29) & 1u;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  }();
  return has;
}

#define KVX_KV_AVX2 __attribute__((target("avx2,fma,f16c")))

KVX_KV_AVX2 inline float HorizontalSum(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

KVX_KV_AVX2 inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
KVX_KV_AVX2 inline __m256 Load8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// s[j] = q . rows[j] for j < n; rows are `d` elements apart. REQUIRES d % 8 == 0.
template <typename T>
KVX_KV_AVX2 inline void DotRows(const float* q, const T* rows, int n, int d, float* s) {
  for (int j = 0; j < n; ++j) {
    const T* r = rows + static_cast<size_t>(j) * d;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int c = 0;
    for (; c + 16 <= d; c += 16) {
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), Load8(r + c), a0);
      a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + c + 8), Load8(r + c + 8), a1);
    }
    if (c < d) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), Load8(r + c), a0);
    s[j] = HorizontalSum(_mm256_add_ps(a0, a1));
  }
}

// acc[c] += sum_{j<n} p[j] * rows[j][c]. REQUIRES d % 8 == 0.
// Loops channel blocks outermost so each accumulator stays in a register.
template <typename T>
KVX_KV_AVX2 inline void AxpyRows(const T* rows, int n, int d, const float* p, float* acc) {
  int c = 0;
  for (; c + 16 <= d; c += 16) {
    __m256 a0 = _mm256_loadu_ps(acc + c), a1 = _mm256_loadu_ps(acc + c + 8);
    for (int j = 0; j < n; ++j) {
      const T* r = rows + static_cast<size_t>(j) * d + c;
      const __m256 pj = _mm256_broadcast_ss(p + j);
      a0 = _mm256_fmadd_ps(pj, Load8(r), a0);
      a1 = _mm256_fmadd_ps(pj, Load8(r + 8), a1);
    }
    _mm256_storeu_ps(acc + c, a0);
    _mm256_storeu_ps(acc + c + 8, a1);
  }
  for (; c < d; c += 8) {
    __m256 a = _mm256_loadu_ps(acc + c);
    for (int j = 0; j < n; ++j) {
      a = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j), Load8(rows + static_cast<size_t>(j) * d + c), a);
    }
    _mm256_storeu_ps(acc + c, a);
  }
}

#undef KVX_KV_AVX2

// Whether the SIMD path applies to rows of `d` elements on this CPU.
inline bool UseSimd(int d) { return d % 8 == 0 && HasAvx2Fma(); }

#else

inline bool UseSimd(int) { return false; }
template <typename T>
inline void DotRows(const float*, const T*, int, int, float*) {}
template <typename T>
inline void AxpyRows(const T*, int, int, const float*, float*) {}

#endif

}  // namespace kvx::kv::simd
