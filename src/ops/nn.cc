#include "ops/nn.h"

#include <cmath>
#include <limits>
#include <vector>

#include "ops/nn_internal.h"
#include "util/check.h"

namespace kvx::ops {
namespace internal {

void RmsNormScalar(const float* x, const float* weight, int64_t n, float eps, float* out) {
  KVX_DCHECK(n > 0);
  // ggml: sum += (ggml_float)(x*x) -- the square is a float product, the sum double.
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  if (weight) {
    for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * scale) * weight[i];
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale;
  }
}

void SoftmaxScalar(float* x, int64_t n) {
  KVX_DCHECK(n > 0);
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) max = x[i] > max ? x[i] : max;
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float e = std::exp(x[i] - max);
    x[i] = e;
    sum += static_cast<double>(e);
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void SwiGLUScalar(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = (g / (1.0f + std::exp(-g))) * up[i];
  }
}

void RopeApplyScalar(float* head, const float* cs, int n_dims, bool neox, int first_pair) {
  const int half = n_dims / 2;
  for (int i = first_pair; i < half; ++i) {
    const float c = cs[2 * i], s = cs[2 * i + 1];
    // Normal layout rotates adjacent pairs; NeoX rotates the two halves.
    const int j0 = neox ? i : 2 * i;
    const int j1 = neox ? i + half : 2 * i + 1;
    const float x0 = head[j0], x1 = head[j1];
    head[j0] = x0 * c - x1 * s;
    head[j1] = x0 * s + x1 * c;
  }
}

void AddScalar(const float* a, const float* b, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace internal

void RmsNorm(const float* x, const float* weight, int64_t n, float eps, float* out) {
  internal::RmsNormBest(x, weight, n, eps, out);
}
void Softmax(float* x, int64_t n) { internal::SoftmaxBest(x, n); }
void SwiGLU(const float* gate, const float* up, int64_t n, float* out) { internal::SwiGLUBest(gate, up, n, out); }

void Add(const float* a, const float* b, int64_t n, float* out) { internal::AddBest(a, b, n, out); }

void Mul(const float* a, const float* b, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
}

void Scale(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void RopeCosSin(int32_t pos, const RopeParams& p, float* cs) {
  KVX_CHECK(p.n_dims > 0 && p.n_dims % 2 == 0);
  const float theta_scale = std::pow(p.freq_base, -2.0f / static_cast<float>(p.n_dims));
  float theta = static_cast<float>(pos);
  for (int i = 0; i < p.n_dims / 2; ++i) {
    const float ff = p.freq_factors ? p.freq_factors[i] : 1.0f;
    const float angle = p.freq_scale * (theta / ff);
    cs[2 * i] = std::cos(angle);
    cs[2 * i + 1] = std::sin(angle);
    theta *= theta_scale;
  }
}

void RopeApply(float* head, const float* cs, const RopeParams& p) {
  internal::RopeApplyBest(head, cs, p.n_dims, p.neox);
}

void Rope(float* x, int n_heads, int head_dim, int32_t pos, const RopeParams& p) {
  KVX_CHECK(p.n_dims > 0 && p.n_dims % 2 == 0 && p.n_dims <= head_dim);
  constexpr int kStack = 512;
  float stack_cs[kStack];
  std::vector<float> heap_cs;
  float* cs = stack_cs;
  if (p.n_dims > kStack) {
    heap_cs.resize(p.n_dims);
    cs = heap_cs.data();
  }
  RopeCosSin(pos, p, cs);
  for (int h = 0; h < n_heads; ++h) RopeApply(x + static_cast<int64_t>(h) * head_dim, cs, p);
}

}  // namespace kvx::ops
