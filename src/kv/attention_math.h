// The row arithmetic of attention (kv/attention.cc): max, scale, exp-sum
// and the online-softmax step over blocks of scores, each with a SIMD path
// when the machine has one and a scalar loop otherwise. Inline, so the
// attention kernels that call them per block keep them in their loops.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "kv/codec/codecs.h"

namespace kvx::kv::attention_math {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// max_j x[j], -inf for n == 0 (SIMD when available).
inline float Max(const float* x, int n) {
  if (simd::UseSimd(8)) return simd::Max(x, n);
  float m = kNegInf;
  for (int j = 0; j < n; ++j) m = std::max(m, x[j]);
  return m;
}

// x[j] *= f (SIMD when available).
inline void Scale(float* x, int n, float f) {
  if (simd::UseSimd(8)) return simd::Scale(x, n, f);
  for (int j = 0; j < n; ++j) x[j] *= f;
}

// y[j] = x[j] * f (SIMD when available).
inline void ScaledCopy(const float* x, int n, float f, float* y) {
  if (simd::UseSimd(8)) return simd::ScaledCopy(x, n, f, y);
  for (int j = 0; j < n; ++j) y[j] = x[j] * f;
}

// y[j] += a * x[j] (SIMD when available).
inline void AddScaled(float* y, const float* x, int n, float a) {
  if (simd::UseSimd(8)) return simd::AddScaled(y, x, n, a);
  for (int j = 0; j < n; ++j) y[j] += a * x[j];
}

// Smallest and largest of the n >= 1 positions (SIMD when available).
inline void MinMax(const int32_t* pos, int n, int32_t* lo, int32_t* hi) {
  if (simd::UseSimd(8)) return simd::MinMaxI32(pos, n, lo, hi);
  *lo = *hi = pos[0];
  for (int j = 1; j < n; ++j) *lo = std::min(*lo, pos[j]), *hi = std::max(*hi, pos[j]);
}

// x[j] = exp(x[j] - m) (0 for -inf), returns the sum (SIMD when available).
inline float ExpSum(float* x, int n, float m) {
  if (simd::UseSimd(8)) return simd::ExpSum(x, n, m);
  float sum = 0.0f;
  for (int j = 0; j < n; ++j) sum += (x[j] = std::exp(x[j] - m));
  return sum;
}

// Entry scales (page_table.h; cross-layer shared pages, MiniCache): a table
// may scale each stored entry, key by a and value by b. The scores of such a
// page are multiplied by a after PageScores (q.(a k) = a (q.k)), before the
// mask, the observer and the softmax; its weights by b after the softmax has
// summed them, just before AccumulateValues (sum_j p_j (b_j v_j)). Tables
// without scales (every table but MiniCache's) skip both, and only they may
// take the fused f16 run kernel, so their results are bit-identical to the
// kernels without this mechanism.
// x[r * ss + j] *= scale[j] for the n entries of each of nr rows.
inline void ScaleEntries(const float* scale, int n, int nr, float* x, int ss) {
  for (int r = 0; r < nr; ++r) {
    float* row = x + static_cast<size_t>(r) * ss;
    for (int j = 0; j < n; ++j) row[j] *= scale[j];
  }
}

// One online-softmax step over a block of n >= 1 scores of each row r < nr (row
// r at s + r * ss): M = mx[r], the row's reference max, unless the block's
// max exceeds it by more than kSoftmaxSlack (or mx[r] = -inf), when M = the
// block's max; the scores become the weights exp(s - M) (0 for -inf; all 0
// while M = -inf), sum[r] = sum[r] * f[r] + their sum where f[r] =
// exp(mx[r] - M) is the factor the row's accumulator must be scaled by (1
// when it need not be), mx[r] = M. Returns whether any weight is > 0. Fused
// AVX-512 kernel when available.
inline bool SoftmaxStep(float* s, int ss, int n, int nr, float* mx, float* sum, float* f) {
  bool any = false;
  if (simd::UseSimd(8) && simd::SoftmaxStep(s, ss, n, nr, mx, sum, f, &any)) return any;
  for (int r = 0; r < nr; ++r) {
    float* row = s + static_cast<size_t>(r) * ss;
    const float block_max = Max(row, n);
    f[r] = 1.0f;
    if (block_max > mx[r] + kSoftmaxSlack) {
      if (mx[r] != kNegInf) f[r] = std::exp(mx[r] - block_max);
      mx[r] = block_max;
    }
    if (mx[r] == kNegInf) {  // nothing visible to this row yet
      std::fill(row, row + n, 0.0f);
      continue;
    }
    const float block_sum = ExpSum(row, n, mx[r]);  // weights are >= 0: sum > 0 iff any is
    sum[r] = sum[r] * f[r] + block_sum;
    any |= block_sum > 0.0f;
  }
  return any;
}

}  // namespace kvx::kv::attention_math
