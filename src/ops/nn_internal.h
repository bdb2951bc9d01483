// Internal to ops/: scalar references of the nn kernels (nn.cc) and their
// SIMD versions dispatched to the best target (nn_simd.cc). The SIMD
// versions differ from the scalar ones only in float rounding: exp is
// Highway's (max error 1 ulp) instead of libm's, and sums of squares are
// accumulated in double lanes in a different order.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

namespace kvx::ops::internal {

void RmsNormScalar(const float* x, const float* weight, int64_t n, float eps, float* out);
void SoftmaxScalar(float* x, int64_t n);
void SwiGLUScalar(const float* gate, const float* up, int64_t n, float* out);
// Rotates the pairs [first_pair, n_dims / 2) of one head (see RopeApply).
void RopeApplyScalar(float* head, const float* cs, int n_dims, bool neox, int first_pair);
void AddScalar(const float* a, const float* b, int64_t n, float* out);

void RmsNormBest(const float* x, const float* weight, int64_t n, float eps, float* out);
void SoftmaxBest(float* x, int64_t n);
void SwiGLUBest(const float* gate, const float* up, int64_t n, float* out);
void RopeApplyBest(float* head, const float* cs, int n_dims, bool neox);
void AddBest(const float* a, const float* b, int64_t n, float* out);

}  // namespace kvx::ops::internal
