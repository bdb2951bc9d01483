// SIMD versions of the nn kernels (RMSNorm, softmax, SwiGLU, RoPE, Add) with Highway:
// portable vector code compiled per target (foreach_target) and dispatched at
// run time; the scalar target uses the references in nn.cc.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/nn_simd.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"

#include <cmath>

#include "ops/nn_internal.h"

HWY_BEFORE_NAMESPACE();
namespace kvx::ops::internal {
namespace HWY_NAMESPACE {

#if HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128  // the scalar baseline
void RmsNorm(const float* x, const float* weight, int64_t n, float eps, float* out) {
  RmsNormScalar(x, weight, n, eps, out);
}
void Softmax(float* x, int64_t n) { SoftmaxScalar(x, n); }
void SwiGLU(const float* gate, const float* up, int64_t n, float* out) { SwiGLUScalar(gate, up, n, out); }
void RopeApply(float* head, const float* cs, int n_dims, bool neox) { RopeApplyScalar(head, cs, n_dims, neox, 0); }
void Add(const float* a, const float* b, int64_t n, float* out) { AddScalar(a, b, n, out); }
#else
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using DD = hn::Repartition<double, DF>;
using DH = hn::Half<DF>;

// Sum over lanes of x*x (float products, double sums, as ggml), plus the sum
// of (x - shift) exponentials when kExp... (kept separate for clarity).
HWY_INLINE double SumSquares(const float* x, int64_t n) {
  const DF d;
  const DD dd;
  const DH dh;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  auto s0 = hn::Zero(dd), s1 = hn::Zero(dd);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto v = hn::LoadU(d, x + i);
    const auto sq = hn::Mul(v, v);
    s0 = hn::Add(s0, hn::PromoteTo(dd, hn::LowerHalf(dh, sq)));
    s1 = hn::Add(s1, hn::PromoteTo(dd, hn::UpperHalf(dh, sq)));
  }
  double sum = hn::GetLane(hn::SumOfLanes(dd, hn::Add(s0, s1)));
  for (; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  return sum;
}

void RmsNorm(const float* x, const float* weight, int64_t n, float eps, float* out) {
  const float mean = static_cast<float>(SumSquares(x, n) / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto vs = hn::Set(d, scale);
  int64_t i = 0;
  if (weight != nullptr) {
    for (; i + N <= n; i += N) {
      hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(d, x + i), vs), hn::LoadU(d, weight + i)), d, out + i);
    }
    for (; i < n; ++i) out[i] = (x[i] * scale) * weight[i];
  } else {
    for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, x + i), vs), d, out + i);
    for (; i < n; ++i) out[i] = x[i] * scale;
  }
}

// exp(x) for x <= 0 (softmax) or clamped arguments; Highway's Exp is valid
// up to +104 and flushes to 0 far below.
HWY_INLINE hn::Vec<DF> ExpClamped(DF d, hn::Vec<DF> x) { return hn::Exp(d, hn::Min(x, hn::Set(d, 88.0f))); }

void Softmax(float* x, int64_t n) {
  const DF d;
  const DD dd;
  const DH dh;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  float max = -INFINITY;
  int64_t i = 0;
  if (n >= N) {
    auto vmax = hn::Set(d, -INFINITY);
    for (; i + N <= n; i += N) vmax = hn::Max(vmax, hn::LoadU(d, x + i));
    max = hn::GetLane(hn::MaxOfLanes(d, vmax));
  }
  for (; i < n; ++i) max = x[i] > max ? x[i] : max;
  const auto vmax = hn::Set(d, max);
  auto s0 = hn::Zero(dd), s1 = hn::Zero(dd);
  i = 0;
  for (; i + N <= n; i += N) {
    // exp(-inf) = 0 for masked entries.
    const auto e = hn::Exp(d, hn::Sub(hn::LoadU(d, x + i), vmax));
    hn::StoreU(e, d, x + i);
    s0 = hn::Add(s0, hn::PromoteTo(dd, hn::LowerHalf(dh, e)));
    s1 = hn::Add(s1, hn::PromoteTo(dd, hn::UpperHalf(dh, e)));
  }
  double sum = hn::GetLane(hn::SumOfLanes(dd, hn::Add(s0, s1)));
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += static_cast<double>(x[i]);
  }
  const float inv = static_cast<float>(1.0 / sum);
  const auto vinv = hn::Set(d, inv);
  i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, x + i), vinv), d, x + i);
  for (; i < n; ++i) x[i] *= inv;
}

void SwiGLU(const float* gate, const float* up, int64_t n, float* out) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto one = hn::Set(d, 1.0f);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto g = hn::LoadU(d, gate + i);
    const auto silu = hn::Div(g, hn::Add(one, ExpClamped(d, hn::Neg(g))));
    hn::StoreU(hn::Mul(silu, hn::LoadU(d, up + i)), d, out + i);
  }
  SwiGLUScalar(gate + i, up + i, n - i, out + i);
}

// The rotation of RopeApplyScalar, the same products and sums per lane.
void RopeApply(float* head, const float* cs, int n_dims, bool neox) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  const int half = n_dims / 2;
  int pair = 0;  // pairs [0, pair) done
  if (!neox) {   // pairs (2i, 2i + 1), cos and sin interleaved alike
    int j = 0;
    for (; j + N <= n_dims; j += N) {
      const auto x = hn::LoadU(d, head + j), t = hn::LoadU(d, cs + j);
      const auto p = hn::Mul(x, hn::DupEven(t));                   // (x_a cos, x_b cos)
      const auto q = hn::Mul(hn::Shuffle2301(x), hn::DupOdd(t));  // (x_b sin, x_a sin)
      hn::StoreU(hn::OddEven(hn::Add(p, q), hn::Sub(p, q)), d, head + j);
    }
    pair = j / 2;
  } else {  // pairs (i, i + half)
    for (; pair + N <= half; pair += N) {
      const auto lo = hn::LoadU(d, cs + 2 * pair), hi = hn::LoadU(d, cs + 2 * pair + N);
      const auto c = hn::ConcatEven(d, hi, lo), s = hn::ConcatOdd(d, hi, lo);
      const auto a = hn::LoadU(d, head + pair), b = hn::LoadU(d, head + pair + half);
      hn::StoreU(hn::Sub(hn::Mul(a, c), hn::Mul(b, s)), d, head + pair);
      hn::StoreU(hn::Add(hn::Mul(a, s), hn::Mul(b, c)), d, head + pair + half);
    }
  }
  RopeApplyScalar(head, cs, n_dims, neox, pair);
}

void Add(const float* a, const float* b, int64_t n, float* out) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Add(hn::LoadU(d, a + i), hn::LoadU(d, b + i)), d, out + i);
  AddScalar(a + i, b + i, n - i, out + i);
}
#endif

}  // namespace HWY_NAMESPACE
}  // namespace kvx::ops::internal
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvx::ops::internal {
HWY_EXPORT(RmsNorm);
HWY_EXPORT(Softmax);
HWY_EXPORT(SwiGLU);
HWY_EXPORT(RopeApply);
HWY_EXPORT(Add);
void RopeApplyBest(float* head, const float* cs, int n_dims, bool neox) {
  HWY_DYNAMIC_DISPATCH(RopeApply)(head, cs, n_dims, neox);
}
void AddBest(const float* a, const float* b, int64_t n, float* out) { HWY_DYNAMIC_DISPATCH(Add)(a, b, n, out); }
void RmsNormBest(const float* x, const float* weight, int64_t n, float eps, float* out) {
  HWY_DYNAMIC_DISPATCH(RmsNorm)(x, weight, n, eps, out);
}
void SoftmaxBest(float* x, int64_t n) { HWY_DYNAMIC_DISPATCH(Softmax)(x, n); }
void SwiGLUBest(const float* gate, const float* up, int64_t n, float* out) {
  HWY_DYNAMIC_DISPATCH(SwiGLU)(gate, up, n, out);
}
}  // namespace kvx::ops::internal
#endif
