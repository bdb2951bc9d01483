// Scalar building blocks of the quantized page codecs: the asymmetric b-bit
// quantizer with an f16 (scale, zero point) pair, the planar bit packing of a
// row, and outlier selection. The SIMD kernels (simd_x86.h) read exactly
// these encodings; the scalar loops here are their reference.
//
// Asymmetric quantizer (KIVI, KVQuant's uniform baseline, llama.cpp's q4_1):
// a group of values with range [lo, hi] gets
//     m = f16(lo),  s = f16((hi - m) / (2^b - 1)),  q = round((x - m) / s),
//     x^ = m + s * q,   q in [0, 2^b - 1].
// s and m are rounded to f16 BEFORE the codes are chosen, so the codes are
// optimal for the stored parameters; s is nudged up by f16 ulps until
// m + s (2^b - 1) >= hi so the top of the range stays representable. Error
// bound for x in [lo, hi]: |x - x^| <= s/2 + |lo - m| (the second term is an
// f16 rounding of lo: <= 2^-11 |lo|).
//
// Planar packing: a row of d b-bit codes occupies R = d*b/8 bytes; channel c
// lives in byte (c mod R) at bit offset b * (c div R). Eight consecutive
// channels c..c+7 with c mod R <= R-8 therefore sit in 8 consecutive bytes at
// one shift, which the AVX2 kernels unpack with one load, one shift and one
// mask (no shuffles), and the layout has no padding for any d with d*b % 8 == 0.
//
// Thread-safety: pure functions.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kv/codec/f16_codec.h"
#include "util/fp16.h"

namespace kvx::kv::quant {

inline constexpr int Levels(int bits) { return (1 << bits) - 1; }
// Bytes of one packed row. REQUIRES d * bits % 8 == 0.
inline constexpr int RowBytes(int d, int bits) { return d * bits / 8; }

inline void PackRow(const uint8_t* codes, int d, int bits, uint8_t* out) {
  const int r = RowBytes(d, bits);
  std::memset(out, 0, static_cast<size_t>(r));
  for (int c = 0; c < d; ++c) out[c % r] = static_cast<uint8_t>(out[c % r] | (codes[c] << (bits * (c / r))));
}

inline int CodeAt(const uint8_t* row, int d, int bits, int c) {
  const int r = RowBytes(d, bits);
  return (row[c % r] >> (bits * (c / r))) & Levels(bits);
}

inline constexpr float kF16Max = 65504.0f;

// Chooses the f16 (scale, min) for values in [lo, hi] (see the header);
// writes them to st[0], st[1] and returns them as floats in *s, *m.
inline void ChooseAffine(float lo, float hi, int bits, uint16_t* st, float* s, float* m) {
  lo = std::clamp(lo, -kF16Max, kF16Max);
  hi = std::clamp(hi, -kF16Max, kF16Max);
  const uint16_t m16 = FloatToFp16(lo);
  const float mf = HalfToFloatFast(m16);
  const float levels = static_cast<float>(Levels(bits));
  const float want = std::max(0.0f, (hi - mf) / levels);
  uint16_t s16 = FloatToFp16(std::min(want, kF16Max));
  float sf = HalfToFloatFast(s16);
  // f16 rounding may have shrunk the range: widen by ulps (positive f16 bits are monotone).
  while (mf + sf * levels < hi && s16 < 0x7BFFu) sf = HalfToFloatFast(++s16);
  st[0] = s16;
  st[1] = m16;
  *s = sf;
  *m = mf;
}

// Symmetric variant (`sym=1`), llama.cpp's q8_0/q4_0 rules: only an f16
// scale s; the zero point is fixed at z = 2^(b-1), so x^ = s (q - z), i.e. the
// affine map with m = -z s.
//   8 bits (q8_0): s = absmax / 127, codes z-127..z+127; error <= s/2.
//   4, 2 bits (q4_0): s = xmax / -z with xmax the SIGNED value of largest
//     magnitude, so xmax is exact at code 0 and all 2^b codes are used; values
//     of the opposite sign beyond (z-1)|s| clamp; error <= |s|.
// s may be negative. It is widened by f16 ulps when rounding shrank it.
inline int SymZero(int bits) { return 1 << (bits - 1); }
inline void ChooseSymmetric(float xmax, int bits, uint16_t* st, float* s, float* m) {
  xmax = std::clamp(xmax, -kF16Max, kF16Max);
  const float absmax = std::fabs(xmax);
  const float steps = bits == 8 ? static_cast<float>(SymZero(bits) - 1) : static_cast<float>(SymZero(bits));
  const float want = bits == 8 ? absmax / steps : -xmax / steps;
  uint16_t s16 = FloatToFp16(want);
  float sf = HalfToFloatFast(s16);
  // Positive and negative f16 bit patterns both grow in magnitude with the bits.
  while (std::fabs(sf) * steps < absmax && (s16 & 0x7FFFu) < 0x7BFFu) sf = HalfToFloatFast(++s16);
  st[0] = s16;
  *s = sf;
  *m = -static_cast<float>(SymZero(bits)) * sf;
}

inline uint8_t QuantizeOne(float x, float s, float m, int bits) {
  if (s == 0.0f || !std::isfinite(s)) return 0;
  const float q = std::floor((x - m) / s + 0.5f);
  return static_cast<uint8_t>(std::clamp(q, 0.0f, static_cast<float>(Levels(bits))));
}

// Chooses a group's (scale, zero point) — asymmetric or `sym` — for the values
// x[i * stride], i < n, ignoring entries with skip[i * stride] != 0 (outliers
// stored exactly). Writes the f16 parameters to st (2 values, or 1 with sym)
// and returns them as floats. With `clip`, the range is also shrunk around
// its center (asymmetric) or scaled (symmetric) by each factor in
// kClipFactors and the choice with the least squared error over the group is
// kept (ties to the wider range): clipping a rare extreme value buys a finer
// grid for all others (the MSE search of llama.cpp's k-quants, QuaRot's clip
// ratio). The search includes factor 1, so it never does worse in MSE.
inline constexpr float kClipFactors[] = {1.0f, 0.95f, 0.9f, 0.85f, 0.8f, 0.75f, 0.7f, 0.6f};

inline void ChooseGroup(const float* x, int n, int stride, const uint8_t* skip, int bits, bool sym, bool clip,
                        uint16_t* st, float* s, float* m) {
  float lo = INFINITY, hi = -INFINITY;
  for (int i = 0; i < n; ++i) {
    if (skip != nullptr && skip[static_cast<size_t>(i) * stride]) continue;
    lo = std::min(lo, x[static_cast<size_t>(i) * stride]);
    hi = std::max(hi, x[static_cast<size_t>(i) * stride]);
  }
  if (lo > hi) lo = hi = 0.0f;  // every entry is an outlier
  auto choose = [&](float f, uint16_t* out, float* sf, float* mf) {
    if (sym) {
      ChooseSymmetric((std::fabs(lo) > std::fabs(hi) ? lo : hi) * f, bits, out, sf, mf);
    } else {
      const float c = 0.5f * (lo + hi), h = 0.5f * (hi - lo) * f;
      ChooseAffine(c - h, c + h, bits, out, sf, mf);
    }
  };
  choose(1.0f, st, s, m);
  if (!clip || lo == hi) return;
  auto sse = [&](float sf, float mf) {
    double e = 0;
    for (int i = 0; i < n; ++i) {
      const size_t at = static_cast<size_t>(i) * stride;
      if (skip != nullptr && skip[at]) continue;
      const float back = mf + sf * static_cast<float>(QuantizeOne(x[at], sf, mf, bits));
      e += static_cast<double>(x[at] - back) * (x[at] - back);
    }
    return e;
  };
  double best = sse(*s, *m);
  for (size_t k = 1; k < sizeof(kClipFactors) / sizeof(kClipFactors[0]); ++k) {
    uint16_t cand[2] = {0, 0};  // cand[1] is unset for symmetric grids; gcc cannot see sym guards its read
    float sf, mf;
    choose(kClipFactors[k], cand, &sf, &mf);
    const double e = sse(sf, mf);
    if (e < best) {
      best = e;
      st[0] = cand[0];
      if (!sym) st[1] = cand[1];
      *s = sf;
      *m = mf;
    }
  }
}

inline float Dequant(const uint16_t* st, int code) {
  return HalfToFloatFast(st[1]) + HalfToFloatFast(st[0]) * static_cast<float>(code);
}

// Outlier side storage (KVQuant's dense-and-sparse decomposition): a fixed
// number of entries per page and tensor, kept as exact f32 values with their
// flat index j*d + c (u16 when T*d <= 65536, else u32), sorted by index.
// The dense codes at those positions are ordinary (clamped) codes; readers
// add the correction x - x^dense, so attention sees the exact value.
inline bool WideOutlierIndex(int page_tokens, int head_dim) { return page_tokens * head_dim > 65536; }
inline size_t OutlierBytes(int n, int page_tokens, int head_dim) {
  return (static_cast<size_t>(n) * (4 + (WideOutlierIndex(page_tokens, head_dim) ? 4 : 2)) + 7) / 8 * 8;
}

struct OutlierList {
  int n = 0;
  const float* value = nullptr;
  const uint8_t* index = nullptr;  // u16 or u32 array
  bool wide = false;
  uint32_t Index(int i) const {
    if (wide) {
      uint32_t v;
      std::memcpy(&v, index + 4 * static_cast<size_t>(i), 4);
      return v;
    }
    uint16_t v;
    std::memcpy(&v, index + 2 * static_cast<size_t>(i), 2);
    return v;
  }
};

inline OutlierList ReadOutliers(const uint8_t* base, int n, int page_tokens, int head_dim) {
  OutlierList o;
  o.n = n;
  o.value = reinterpret_cast<const float*>(base);
  o.index = base + 4 * static_cast<size_t>(n);
  o.wide = WideOutlierIndex(page_tokens, head_dim);
  return o;
}

// Picks the `k` largest dev[i] (ties to the lower index: deterministic),
// writes their indices ascending to idx, sets skip[i] = 1 for them (skip has
// n entries, cleared first) and stores (x[i], i) at `base`.
inline void SelectOutliers(const float* x, const float* dev, int n, int k, int page_tokens, int head_dim,
                           uint8_t* skip, uint8_t* base) {
  std::fill(skip, skip + n, uint8_t{0});
  if (k <= 0) return;
  k = std::min(k, n);
  std::vector<uint32_t> order(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) order[i] = static_cast<uint32_t>(i);
  auto larger = [dev](uint32_t a, uint32_t b) { return dev[a] != dev[b] ? dev[a] > dev[b] : a < b; };
  std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), larger);
  std::sort(order.begin(), order.begin() + k);
  float* value = reinterpret_cast<float*>(base);
  uint8_t* index = base + 4 * static_cast<size_t>(k);
  const bool wide = WideOutlierIndex(page_tokens, head_dim);
  for (int i = 0; i < k; ++i) {
    const uint32_t at = order[i];
    skip[at] = 1;
    value[i] = x[at];
    if (wide) {
      std::memcpy(index + 4 * static_cast<size_t>(i), &at, 4);
    } else {
      const uint16_t a16 = static_cast<uint16_t>(at);
      std::memcpy(index + 2 * static_cast<size_t>(i), &a16, 2);
    }
  }
}

}  // namespace kvx::kv::quant
