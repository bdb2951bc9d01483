// Budget allocation for score-based eviction: how many entries each layer
// and each kv head keeps, and which.
//
// Layers (the average per-head capacity C, sinks and window included, is
// what ratio= or budget= asks for; every allocation keeps the total
// L * C exactly, rounding remainders going to the largest fractions):
//   uniform  every layer C;
//   pyramid  PyramidKV (METHODS.md B6): with w the protected entries,
//            min = (C-w)/beta, max = 2(C-w) - min, capped at n-w (then
//            min = 2(C-w) - max); layer l keeps max - l(max-min)/(L-1) + w,
//            layer 0 the most; n < 2(C-w) falls back to uniform as the
//            reference does;
//   cake     CAKE (B7): the scored part L(C-w) in proportion to the layers'
//            preferences P_l = H_l^(1/tau1) V_l^(1/tau2), each capped at
//            n-w with the excess redistributed.
// Heads (within a layer of H kv heads):
//   uniform  every head keeps its own top C_l;
//   adakv    Ada-KV (B8): each head keeps its top floor(alpha * C_l) (the
//            safeguard), the rest of the layer's H * C_l is taken from the
//            best remaining scores across all heads, so peaked heads give
//            entries to flat ones.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

namespace kvx::kv {

// Integer shares of `total` proportional to `weights` (>= 0; all zero =
// equal), each capped at cap[i], summing to min(total, sum cap) exactly.
std::vector<int> ProportionalShares(const std::vector<double>& weights, int64_t total, const std::vector<int>& cap);

// Per-layer kept entries per head (protected `w` included) for n tokens
// and average capacity C (PyramidKV). REQUIRES: n_layers >= 1, 0 <= w <= C.
std::vector<int> PyramidBudgets(int n_layers, int capacity, int n, int w, double beta);
// CAKE: preferences per layer (>= 0).
std::vector<int> PreferenceBudgets(const std::vector<double>& preference, int capacity, int n, int w);

// Which candidates each head keeps. scores[h][i], positions[h][i] of head
// h's candidate i; keep[h] the candidates head h keeps (uniform) or, with
// `adaptive`, its share of the layer's total sum(keep) (Ada-KV with floor
// alpha). Returns kept[h][i] (1 = keep). Ranking: higher score first, ties
// to the later position.
std::vector<std::vector<uint8_t>> SelectKept(const std::vector<std::vector<float>>& scores,
                                             const std::vector<std::vector<int32_t>>& positions,
                                             const std::vector<int>& keep, bool adaptive, double alpha);

}  // namespace kvx::kv
