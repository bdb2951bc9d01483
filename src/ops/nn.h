// Element-wise and row-wise neural-network kernels used by the forward pass:
// RMSNorm, softmax, SwiGLU, residual add and rotary position embeddings.
//
// Numerics follow llama.cpp's CPU backend (same float/double choices, same
// operation order) so that kvx logits can be compared against llama.cpp
// goldens at tight tolerances.
//
// Thread-safety: pure functions on caller-owned buffers. In-place use is
// allowed where documented (out may alias an input for the element-wise ops).
#pragma once

#include <cstdint>

namespace kvx::ops {

// out[i] = x[i] * (1 / sqrt(mean(x^2) + eps)) * weight[i].
// The sum of squares is accumulated in double (ggml_float); the mean and the
// scale are then computed in float, x is scaled first and multiplied by the
// weight second, exactly as ggml's rms_norm followed by mul.
// weight may be nullptr (no affine weight). out may alias x.
void RmsNorm(const float* x, const float* weight, int64_t n, float eps, float* out);

// In-place softmax: x[i] = exp(x[i] - max) / sum_j exp(x[j] - max).
// The sum is accumulated in double. Entries equal to -inf give 0.
// REQUIRES: n > 0 and at least one finite entry.
void Softmax(float* x, int64_t n);

// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)). out may alias
// gate or up.
void SwiGLU(const float* gate, const float* up, int64_t n, float* out);

// out[i] = a[i] + b[i]. out may alias a or b.
void Add(const float* a, const float* b, int64_t n, float* out);

// out[i] = a[i] * b[i]. out may alias a or b.
void Mul(const float* a, const float* b, int64_t n, float* out);

// x[i] *= s.
void Scale(float* x, int64_t n, float s);

// Rotary position embedding parameters (llama.cpp's rope with ext_factor = 0,
// attn_factor = 1, i.e. no YaRN ramp).
struct RopeParams {
  int n_dims;                          // rotated dimensions per head (<= head_dim, even)
  float freq_base = 10000;             // theta base
  float freq_scale = 1;                // linear position scaling (1 / context-scale factor)
  const float* freq_factors = nullptr; // optional per-pair divisor (n_dims/2 values, llama3 rope scaling)
  bool neox = false;                   // NeoX layout: pairs (i, i + n_dims/2) instead of (2i, 2i+1)
};

// Rotates x = [n_heads][head_dim] in place for token position pos; only the
// first n_dims of each head are rotated, the rest pass through.
// For pair i: angle_i = freq_scale * pos * base^(-2i/n_dims) / freq_factors[i],
// computed as llama.cpp does: theta starts at (float)pos and is multiplied by
// theta_scale = powf(base, -2/n_dims) once per pair (float, iterative).
// (x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos).
// REQUIRES: n_dims even, 0 < n_dims <= head_dim.
void Rope(float* x, int n_heads, int head_dim, int32_t pos, const RopeParams& p);

// Computes the (cos, sin) table for position pos: cs[2i] = cos, cs[2i+1] = sin
// for i < n_dims/2. Rope() uses it; attention code may reuse it across heads.
void RopeCosSin(int32_t pos, const RopeParams& p, float* cs);

// Applies a precomputed RopeCosSin table to one head of head_dim values.
void RopeApply(float* head, const float* cs, const RopeParams& p);

}  // namespace kvx::ops
