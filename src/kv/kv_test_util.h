// Test helpers for kv/ unit tests: a dense double-precision attention
// reference and a pool sized for a spec. Not part of the library.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "kv/block_pool.h"
#include "kv/codec/simd_x86.h"
#include "kv/kv_spec.h"
#include "kv/sequence_kv.h"

// Expects a pool's invariants to hold, printing the violation otherwise.
#define EXPECT_INVARIANTS(pool) EXPECT_TRUE((pool).CheckInvariants().ok()) << (pool).CheckInvariants().ToString()

namespace kvx::kv::testing {

// Dense reference in double: per query head, softmax over entries with
// position <= q_pos. keys/values are [n][kv_heads][dim].
inline std::vector<double> DenseAttention(const std::vector<float>& k, const std::vector<float>& v,
                                          const std::vector<int32_t>& pos, const std::vector<float>& q,
                                          const std::vector<int32_t>& q_pos, int n_heads, int kv_heads, int dim,
                                          double scale) {
  const int n = static_cast<int>(pos.size()), n_q = static_cast<int>(q_pos.size());
  const int group = n_heads / kv_heads;
  std::vector<double> out(static_cast<size_t>(n_q) * n_heads * dim, 0.0);
  for (int i = 0; i < n_q; ++i) {
    for (int h = 0; h < n_heads; ++h) {
      const int kh = h / group;
      const float* qi = &q[(static_cast<size_t>(i) * n_heads + h) * dim];
      std::vector<double> s(n, -INFINITY);
      double mx = -INFINITY;
      for (int j = 0; j < n; ++j) {
        if (pos[j] > q_pos[i]) continue;
        double dot = 0;
        for (int c = 0; c < dim; ++c) dot += static_cast<double>(qi[c]) * k[(static_cast<size_t>(j) * kv_heads + kh) * dim + c];
        s[j] = dot * scale;
        mx = std::max(mx, s[j]);
      }
      if (mx == -INFINITY) continue;
      double sum = 0;
      for (int j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - mx));
      for (int j = 0; j < n; ++j) {
        for (int c = 0; c < dim; ++c) {
          out[(static_cast<size_t>(i) * n_heads + h) * dim + c] +=
              s[j] / sum * v[(static_cast<size_t>(j) * kv_heads + kh) * dim + c];
        }
      }
    }
  }
  return out;
}

// A pool that holds `n_ctx` tokens with `codec` (plus `extra_pages` pages of
// the largest size, for forks).
inline std::unique_ptr<BlockPool> PoolFor(const KVLayout& layout, const CodecConfig& codec, int n_ctx,
                                          int extra_pages = 0) {
  auto r = BlockPool::Create({.budget_bytes = BudgetForContext(layout, codec, n_ctx) +
                                              static_cast<uint64_t>(extra_pages) * PageBytes(layout, codec),
                              .page_bytes = PageBytes(layout, codec)});
  return r.ok() ? std::move(r).value() : nullptr;
}

inline CodecConfig Codec(std::string_view spec) { return ParseKVSpec(spec)->codec; }
inline int PageOf(std::string_view spec) { return ParseKVSpec(spec)->page_tokens; }

// sqrt(sum (a - b)^2 / sum b^2).
inline double RelError(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
  return std::sqrt(num / std::max(den, 1e-30));
}

// The attention kernel paths a test can force: the best the CPU has (AVX-512
// or AVX2), AVX2 even on an AVX-512 CPU, and the scalar reference. On CPUs
// without AVX-512 (or non-x86) the first two (or all three) coincide.
enum class KernelPath { kBest, kAvx2, kScalar };
inline const char* Name(KernelPath p) {
  return p == KernelPath::kBest ? "best" : p == KernelPath::kAvx2 ? "avx2" : "scalar";
}
inline constexpr KernelPath kAllKernelPaths[] = {KernelPath::kBest, KernelPath::kAvx2, KernelPath::kScalar};

// Forces a kernel path for its lifetime (tests run single-threaded here).
class ScopedKernelPath {
 public:
  explicit ScopedKernelPath(KernelPath p) {
    simd::ForceAvx2ForTest() = p == KernelPath::kAvx2;
    simd::ForceScalarForTest() = p == KernelPath::kScalar;
  }
  ~ScopedKernelPath() {
    simd::ForceAvx2ForTest() = false;
    simd::ForceScalarForTest() = false;
  }
  ScopedKernelPath(const ScopedKernelPath&) = delete;
  ScopedKernelPath& operator=(const ScopedKernelPath&) = delete;
};

}  // namespace kvx::kv::testing
