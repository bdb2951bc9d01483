// Test helpers for kv/ unit tests: a dense double-precision attention
// reference, a pool sized for a spec, a manager filled in one step, decode
// outputs to compare caches by. Not part of the library.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kv/attention.h"
#include "kv/block_pool.h"
#include "kv/codec/simd_x86.h"
#include "kv/kv_manager.h"
#include "kv/kv_spec.h"
#include "kv/sequence_kv.h"
#include "ops/simd_target.h"

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

// The largest |a[i] - b[i]|.
inline double MaxAbsDiff(const float* a, const float* b, size_t n) {
  double d = 0;
  for (size_t i = 0; i < n; ++i) d = std::max(d, static_cast<double>(std::fabs(a[i] - b[i])));
  return d;
}
inline double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  return MaxAbsDiff(a.data(), b.data(), a.size());
}

// A manager of `spec` over `layout` (pool sized for n_ctx tokens) with one
// sequence holding n tokens at positions 0..n-1, appended in one step: layer
// l's keys and values are x.K(l), x.V(l) ([n][kv heads][dim] floats).
// `after_append(manager, seq, layer)`, when given, runs after each layer's
// append inside the step, where a forward pass shows the policies'
// observers that layer's queries.
template <typename KV>
std::unique_ptr<KVManager> FilledManager(const std::string& spec, const KVLayout& layout, int n_ctx, int n, const KV& x,
                                         SeqId* seq,
                                         const std::function<void(KVManager&, SeqId, int)>& after_append = nullptr) {
  auto r = ResolveKVSpec(spec, layout, n_ctx, 1);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return nullptr;
  auto m = std::move(KVManager::Create(std::move(*r))).value();
  *seq = m->AddSequence();
  std::vector<int32_t> toks(n, 1), pos(n);
  std::iota(pos.begin(), pos.end(), 0);
  const StepRequest req{*seq, toks, pos};
  EXPECT_TRUE(m->BeginStep({&req, 1}).ok());
  for (int l = 0; l < layout.n_layers; ++l) {
    EXPECT_TRUE(m->kv(*seq).Append(l, n, pos.data(), x.K(l), x.V(l)).ok());
    if (after_append) after_append(*m, *seq, l);
  }
  EXPECT_TRUE(m->CommitStep().ok());
  return m;
}

// Attention of one decode query per layer (N(0, 1) in every channel, drawn
// from `seed`, at position qpos) over the cache: [layer][n_heads][dim].
inline std::vector<float> DecodeOutputs(const SequenceKV& kv, int n_heads, int32_t qpos, uint32_t seed) {
  const KVLayout& layout = kv.layout();
  const int D = layout.head_dim;
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(n_heads) * D), out(static_cast<size_t>(layout.n_layers) * n_heads * D);
  for (int l = 0; l < layout.n_layers; ++l) {
    for (float& x : q) x = g(rng);
    Attention(kv, l, q.data(), &qpos, 1, n_heads, 1.0f / std::sqrt(static_cast<float>(D)),
              out.data() + static_cast<size_t>(l) * n_heads * D, nullptr);
  }
  return out;
}

// sqrt(sum (a - b)^2 / sum b^2).
inline double RelError(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
  return std::sqrt(num / std::max(den, 1e-30));
}

// The attention kernel paths a test can force: the best the CPU has (AVX-512
// or AVX2), AVX2 even on an AVX-512 CPU, and the scalar reference. On CPUs
// without AVX-512 (or non-x86) the first two (or all three) coincide; so do
// best and AVX2 in a build whose ops compile the baseline target only (TSan).
enum class KernelPath { kBest, kAvx2, kScalar };
inline const char* Name(KernelPath p) {
  return p == KernelPath::kBest ? "best" : p == KernelPath::kAvx2 ? "avx2" : "scalar";
}
inline constexpr KernelPath kAllKernelPaths[] = {KernelPath::kBest, KernelPath::kAvx2, KernelPath::kScalar};

// Forces a kernel path for its lifetime through the one SIMD hook,
// ops::ForceSimdTarget (tests run single-threaded here).
class ScopedKernelPath {
 public:
  explicit ScopedKernelPath(KernelPath p) {
    ops::ForceSimdTarget("");
    if (p == KernelPath::kAvx2) ops::ForceSimdTarget("AVX2");
    if (p == KernelPath::kScalar) ops::ForceSimdTarget(ops::AvailableSimdTargets().back());
  }
  ~ScopedKernelPath() { ops::ForceSimdTarget(""); }
  ScopedKernelPath(const ScopedKernelPath&) = delete;
  ScopedKernelPath& operator=(const ScopedKernelPath&) = delete;
};

}  // namespace kvx::kv::testing
