// Randomized Hadamard rotation of head vectors (QuaRot arXiv 2404.00456,
// RotateKV arXiv 2501.16383), applied to K and V before quantization.
//
// Why: a few key channels carry most of the magnitude; per-token quantization
// then wastes its range on them. An orthogonal rotation spreads every
// channel's energy over all channels, so each token's values look Gaussian and
// a per-token grid fits them well. Exactness: with Q = (1/sqrt(B)) H_B D
// (H_B the Sylvester Hadamard matrix, D a fixed random +-1 diagonal, B the
// block size) Q is orthogonal, so
//   scores:  (Q q) . (Q k) = q . k          -> rotate the query once per head;
//   outputs: sum_j p_j (Q v_j) = Q o        -> apply Q^-1 = D (1/sqrt(B)) H_B
//                                              to the attention output.
// Every query head of a GQA group uses the same Q (pitfall A4). head_dim need
// not be a power of two: the rotation is block-diagonal with B = the largest
// power of two dividing head_dim (64 -> one 64-block, 96 -> three 32-blocks).
// The transform is the fast Walsh-Hadamard butterfly, O(d log d), in float.
//
// Thread-safety: immutable after construction; Forward/Inverse are const.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace kvx::kv {

class HadamardRotation {
 public:
  static constexpr uint64_t kDefaultSeed = 0x6b7678726f74ull;  // "kvxrot"

  explicit HadamardRotation(int head_dim, uint64_t seed = kDefaultSeed) : d_(head_dim) {
    block_ = head_dim & -head_dim;  // largest power of two dividing head_dim
    norm_ = 1.0f / std::sqrt(static_cast<float>(block_));
    sign_.resize(head_dim);
    uint64_t state = seed;
    for (int c = 0; c < head_dim; ++c) sign_[c] = (SplitMix64(&state) >> 63) ? -1.0f : 1.0f;
    inverse_factors_.resize(head_dim);
    for (int c = 0; c < head_dim; ++c) inverse_factors_[c] = sign_[c] * norm_;
  }

  int head_dim() const { return d_; }
  int block() const { return block_; }
  // [head_dim]: Inverse(x) is the unnormalized butterfly of each block, then
  // channel c times inverse_factors()[c] (its sign over sqrt(B)), for
  // kernels that run the butterflies themselves (simd_avx512_prerope.h).
  const float* inverse_factors() const { return inverse_factors_.data(); }

  // x <- Q x  (signs, then the normalized butterfly per block).
  void Forward(float* x) const {
    for (int c = 0; c < d_; ++c) x[c] *= sign_[c];
    Butterfly(x);
  }
  // x <- Q^-1 x = Q^T x  (butterfly, then signs).
  void Inverse(float* x) const {
    Butterfly(x);
    for (int c = 0; c < d_; ++c) x[c] *= sign_[c];
  }

 private:
  static uint64_t SplitMix64(uint64_t* s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // In-place (1/sqrt(B)) H_B on each block: (a, b) -> (a + b, a - b) over
  // log2(B) stages of doubling span.
  void Butterfly(float* x) const {
    for (int b0 = 0; b0 < d_; b0 += block_) {
      float* xb = x + b0;
      for (int len = 1; len < block_; len <<= 1) {
        for (int i = 0; i < block_; i += 2 * len) {
          for (int j = i; j < i + len; ++j) {
            const float a = xb[j], b = xb[j + len];
            xb[j] = a + b;
            xb[j + len] = a - b;
          }
        }
      }
      for (int c = 0; c < block_; ++c) xb[c] *= norm_;
    }
  }

  int d_;
  int block_;
  float norm_;
  std::vector<float> sign_;
  std::vector<float> inverse_factors_;
};

}  // namespace kvx::kv
