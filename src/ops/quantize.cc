#include "ops/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/quant_blocks.h"
#include "util/check.h"

namespace kvx::ops {
namespace {

// Round to nearest, ties to even (what ggml's nearest_int does in the default
// rounding mode).
inline int NearestInt(float v) { return static_cast<int>(std::nearbyint(v)); }

// ---- Q8_0: d = max|x| / 127, q = round(x / d). ----
void QuantizeBlockQ8_0(const float* x, uint8_t* b) {
  float amax = 0;
  for (int j = 0; j < kQK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  StoreF16(b, d);
  int8_t* q = reinterpret_cast<int8_t*>(b + 2);
  for (int j = 0; j < kQK8_0; ++j) q[j] = static_cast<int8_t>(std::round(x[j] * id));
}

// ---- Q4_0: the element of largest magnitude m maps to quant 0 (value -8d),
// so d = m / -8 and q = clamp(floor(x/d + 8.5), 0, 15). ----
void QuantizeBlockQ4_0(const float* x, uint8_t* b) {
  float amax = 0, max = 0;
  for (int j = 0; j < kQK4_0; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -8.0f;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  StoreF16(b, d);
  uint8_t* qs = b + 2;
  auto quant = [&](float v) {
    return static_cast<uint8_t>(std::clamp(static_cast<int>(std::floor(v * id + 8.5f)), 0, 15));
  };
  for (int j = 0; j < kQK4_0 / 2; ++j) {
    qs[j] = static_cast<uint8_t>(quant(x[j]) | (quant(x[j + kQK4_0 / 2]) << 4));
  }
}

// ---- Asymmetric sub-block fit for q4_K / q5_K ----
// Finds scale >= 0 and min >= 0 with x ~= scale * L - min, L in [0, nmax],
// minimizing sum w_i (scale*L_i - min - x_i)^2 where w_i = rms(x) + |x_i|
// (larger elements matter more). Candidate rounding grids iscale = (nmax + s)
// / (hi - lo) for a few offsets s are tried; for each grid the quants are
// rounded and (scale, min) solved in closed form by weighted least squares.
void FitScaleMin(const float* x, int n, int nmax, float* scale_out, float* min_out) {
  float lo = x[0], hi = x[0], sum_x2 = 0;
  for (int i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    sum_x2 += x[i] * x[i];
  }
  lo = std::min(lo, 0.0f);  // min is stored as a non-negative offset
  if (hi <= lo) {           // constant block (all zero, or all equal <= 0)
    *scale_out = 0;
    *min_out = -lo;
    return;
  }
  const float rms = std::sqrt(sum_x2 / static_cast<float>(n));
  float w[kQK_K];
  for (int i = 0; i < n; ++i) w[i] = rms + std::fabs(x[i]);

  float best_err = INFINITY, best_scale = (hi - lo) / nmax, best_min = -lo;
  for (int step = -8; step <= 8; ++step) {
    const float iscale = (static_cast<float>(nmax) + 0.1f * static_cast<float>(step)) / (hi - lo);
    // Weighted normal equations for x ~= a*L + b (b = -min).
    double sw = 0, sl = 0, sll = 0, sx = 0, slx = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(NearestInt(iscale * (x[i] - lo)), 0, nmax);
      sw += w[i];
      sl += w[i] * l;
      sll += w[i] * l * l;
      sx += w[i] * x[i];
      slx += w[i] * l * x[i];
    }
    const double det = sw * sll - sl * sl;
    if (det <= 0) continue;
    double a = (sw * slx - sl * sx) / det;
    double b = (sll * sx - sl * slx) / det;
    if (b > 0) {  // min must be >= 0: refit scale with b = 0
      b = 0;
      a = sll > 0 ? slx / sll : 0;
    }
    if (a <= 0) continue;
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(NearestInt(static_cast<float>((x[i] - b) / a)), 0, nmax);
      const double e = a * l + b - x[i];
      err += w[i] * e * e;
    }
    if (err < best_err) {
      best_err = err;
      best_scale = static_cast<float>(a);
      best_min = static_cast<float>(-b);
    }
  }
  *scale_out = best_scale;
  *min_out = best_min;
}

// q4_K (nmax 15) and q5_K (nmax 31): fit each 32-element sub-block, quantize
// the 8 scales and 8 mins to 6 bits against d = max_scale/63 and
// dmin = max_min/63, then round the quants with the final decoded scales.
template <bool kHighBits>
void QuantizeBlockQxK(const float* x, uint8_t* b) {
  constexpr int nmax = kHighBits ? 31 : 15;
  float scales[8], mins[8], max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    FitScaleMin(x + 32 * j, 32, nmax, &scales[j], &mins[j]);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  uint8_t ls[8], lm[8];
  for (int j = 0; j < 8; ++j) {
    ls[j] = static_cast<uint8_t>(std::min(63, NearestInt(inv_scale * scales[j])));
    lm[j] = static_cast<uint8_t>(std::min(63, NearestInt(inv_min * mins[j])));
  }
  StoreF16(b, max_scale / 63.0f);
  StoreF16(b + 2, max_min / 63.0f);
  PackScaleMinK4(ls, lm, b + 4);
  const float d = LoadF16(b), dmin = LoadF16(b + 2);

  uint8_t L[kQK_K];
  for (int j = 0; j < 8; ++j) {
    const float dj = d * static_cast<float>(ls[j]);
    const float mj = dmin * static_cast<float>(lm[j]);
    for (int i = 0; i < 32; ++i) {
      L[32 * j + i] = dj != 0 ? static_cast<uint8_t>(std::clamp(NearestInt((x[32 * j + i] + mj) / dj), 0, nmax))
                              : 0;
    }
  }
  uint8_t* qh = b + 4 + kKScaleBytes;
  uint8_t* qs = qh + (kHighBits ? 32 : 0);
  if constexpr (kHighBits) std::memset(qh, 0, 32);
  for (int g = 0; g < 4; ++g) {
    for (int l = 0; l < 32; ++l) {
      const int lo = L[64 * g + l], hi = L[64 * g + 32 + l];
      qs[32 * g + l] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
      if constexpr (kHighBits) {
        qh[l] = static_cast<uint8_t>(qh[l] | ((lo >> 4) << (2 * g)) | ((hi >> 4) << (2 * g + 1)));
      }
    }
  }
}

// ---- Symmetric sub-block fit for q6_K ----
// Finds a signed scale with x ~= scale * L, L in [-32, 31]: the element of
// largest magnitude m anchors the grid (m -> -32 when scale = m / -32), a few
// nearby grids are tried and the scale is refit by weighted least squares.
float FitScaleSymmetric(const float* x, int n) {
  float amax = 0, max = 0, sum_x2 = 0;
  for (int i = 0; i < n; ++i) {
    sum_x2 += x[i] * x[i];
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax == 0) return 0;
  const float rms = std::sqrt(sum_x2 / static_cast<float>(n));
  float best_scale = max / -32.0f;
  double best_err = INFINITY;
  for (int step = -6; step <= 6; ++step) {
    const float iscale = -(32.0f + 0.1f * static_cast<float>(step)) / max;
    double slx = 0, sll = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(NearestInt(iscale * x[i]), -32, 31);
      const double w = rms + std::fabs(x[i]);
      slx += w * l * x[i];
      sll += w * l * l;
    }
    if (sll <= 0) continue;
    const double a = slx / sll;
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(NearestInt(static_cast<float>(x[i] / a)), -32, 31);
      const double e = a * l - x[i];
      err += (rms + std::fabs(x[i])) * e * e;
    }
    if (err < best_err) {
      best_err = err;
      best_scale = static_cast<float>(a);
    }
  }
  return best_scale;
}

// q6_K: 16 signed sub-block scales quantized to int8 against d = max/-128
// (the sub-block scale of largest magnitude maps to -128), quants re-rounded
// with the final d*scale.
void QuantizeBlockQ6_K(const float* x, uint8_t* b) {
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  int8_t* sc = reinterpret_cast<int8_t*>(b + 192);
  float scales[16], amax = 0, max = 0;
  for (int j = 0; j < 16; ++j) {
    scales[j] = FitScaleSymmetric(x + 16 * j, 16);
    if (std::fabs(scales[j]) > amax) {
      amax = std::fabs(scales[j]);
      max = scales[j];
    }
  }
  std::memset(b, 0, kQ6_KBytes);
  if (amax == 0) return;  // all-zero block: d = 0
  const float iscale = -128.0f / max;
  StoreF16(b + 208, 1.0f / iscale);
  for (int j = 0; j < 16; ++j) sc[j] = static_cast<int8_t>(std::clamp(NearestInt(iscale * scales[j]), -128, 127));
  const float d = LoadF16(b + 208);
  uint8_t L[kQK_K];
  for (int j = 0; j < 16; ++j) {
    const float dj = d * static_cast<float>(sc[j]);
    for (int i = 0; i < 16; ++i) {
      L[16 * j + i] = dj != 0 ? static_cast<uint8_t>(std::clamp(NearestInt(x[16 * j + i] / dj), -32, 31) + 32)
                              : 32;
    }
  }
  for (int h = 0; h < 2; ++h) {
    const uint8_t* Lh = L + 128 * h;
    for (int l = 0; l < 32; ++l) {
      ql[64 * h + l] = static_cast<uint8_t>((Lh[l] & 0xF) | ((Lh[l + 64] & 0xF) << 4));
      ql[64 * h + 32 + l] = static_cast<uint8_t>((Lh[l + 32] & 0xF) | ((Lh[l + 96] & 0xF) << 4));
      qh[32 * h + l] = static_cast<uint8_t>((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) |
                                            ((Lh[l + 64] >> 4) << 4) | ((Lh[l + 96] >> 4) << 6));
    }
  }
}

}  // namespace

void QuantizeRow(gguf::TensorType type, const float* src, void* dst, int64_t n) {
  using T = gguf::TensorType;
  const BlockGeometry g = GetBlockGeometry(type);
  KVX_CHECK_MSG(g.block_size != 0, "QuantizeRow: unsupported tensor type");
  KVX_CHECK(n % g.block_size == 0);
  uint8_t* p = static_cast<uint8_t*>(dst);
  const int64_t nb = n / g.block_size;
  switch (type) {
    case T::kF32:
      std::memcpy(p, src, static_cast<size_t>(n) * 4);
      return;
    case T::kF16:
      for (int64_t i = 0; i < n; ++i) StoreF16(p + 2 * i, src[i]);
      return;
    case T::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t v = FloatToBf16(src[i]);
        std::memcpy(p + 2 * i, &v, 2);
      }
      return;
    case T::kQ8_0:
      for (int64_t i = 0; i < nb; ++i) QuantizeBlockQ8_0(src + i * kQK8_0, p + i * kQ8_0Bytes);
      return;
    case T::kQ4_0:
      for (int64_t i = 0; i < nb; ++i) QuantizeBlockQ4_0(src + i * kQK4_0, p + i * kQ4_0Bytes);
      return;
    case T::kQ4_K:
      for (int64_t i = 0; i < nb; ++i) QuantizeBlockQxK<false>(src + i * kQK_K, p + i * kQ4_KBytes);
      return;
    case T::kQ5_K:
      for (int64_t i = 0; i < nb; ++i) QuantizeBlockQxK<true>(src + i * kQK_K, p + i * kQ5_KBytes);
      return;
    case T::kQ6_K:
      for (int64_t i = 0; i < nb; ++i) QuantizeBlockQ6_K(src + i * kQK_K, p + i * kQ6_KBytes);
      return;
    default:
      KVX_CHECK_MSG(false, "QuantizeRow: unsupported tensor type");
  }
}

}  // namespace kvx::ops
