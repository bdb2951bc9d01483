// MiniCache (Liu et al., 2024, arXiv 2405.14366): cross-layer KV merging.
// From the middle layers up, a token's keys (values) in two adjacent layers
// point in similar directions, so a pair of layers keeps ONE direction per
// token and kv head plus each layer's own norm, and the tokens whose
// directions differ most stay exact in both layers.
//
// Per pair (a, b) = (start, start + 1), (start + 2, start + 3), ... (an odd
// last layer stays as it is), per kv head, per token present in both layers
// (matched by position; a token one layer evicted stays that layer's own):
//   u_a = x_a / |x_a|, u_b = x_b / |x_b|, W = acos(u_a . u_b)
//   e   = sin((1 - t) W) / sin W * u_a + sin(t W) / sin W * u_b   (SLERP;
//         the normalised linear interpolation when sin W ~ 0)
//   layer i reads |x_i| e   (x = K, and V alike)
// Retention: d = max(W_K, W_V) / pi per token (one index set for K and V);
//   retain=topk   the ceil(gamma * N) tokens of largest d stay exact
//                 (KVCache-Factory's rule)
//   retain=range  tokens with d > d_min + (d_max - d_min) * gamma stay exact
//                 (the xKV baseline's rule)
// Storage (SequenceKV::ShareEntries): the merged directions in pages both
// layers' tables list (one copy in the pool), each table's per-entry norms
// as entry scales beside it (page_table.h; attention multiplies scores by
// the key norm and weights by the value norm), the retained tokens in each
// layer's own pages. A pair of N tokens with R retained holds N + R entries
// instead of 2N (plus 8 bytes of norms per entry and layer).
//
// When: at the explicit compression moment (KVManager::Compress:
// `kvx eval --compress excluded|included`), once per call; tokens appended
// later stay unmerged in each layer's own pages. mode=continuous (merging
// new tokens as decode goes, the paper's "periodically") is rejected.
//
// Parameters (--kv policy group, e.g. "codec=f16;policy=minicache,t=0.6"):
//   start   first merged layer                          default n_layers / 2
//   t       SLERP interpolation towards the upper layer  default 0.6
//   gamma   retention (see retain)                      default 0.05
//   retain  topk | range                                default topk
//   mode    once (the only mode)
// Composes with the row-wise codecs (f32, f16, int8, int4, int2; rotate=,
// prerope=) and with eviction policies run before it; rejects sealed codecs
// (kivi*, residual=), sinks=, outliers=, different bits in a merged pair and
// quest (CanShareAcrossLayers).
//
// Thread-safety: as KVPolicy.
#pragma once

#include <memory>
#include <string>

#include "kv/policy/policy.h"

namespace kvx::kv {

struct MiniCacheConfig {
  int start = -1;  // -1: n_layers / 2
  double t = 0.6;
  double gamma = 0.05;
  bool retain_range = false;  // retain=range (else topk)
};

// What the last Compress did, for tests and reports.
struct MiniCacheStats {
  int64_t merged = 0;    // tokens merged (one stored direction per pair and kv head)
  int64_t retained = 0;  // matched tokens kept exact in both layers
  int pairs = 0;
};

// The SLERP merge of one token: e (unit, [d]) from x_a, x_b ([d] each), and
// the angle W between them in [0, pi]. A zero vector takes the other's
// direction (W = 0); both zero give e = 0.
double SlerpDirection(const float* x_a, const float* x_b, int d, double t, float* e);

class MiniCachePolicy : public KVPolicy {
 public:
  static Result<std::unique_ptr<KVPolicy>> Create(PolicyParamReader& params);
  PolicyParams Parameters() const override;
  std::string_view name() const override { return "minicache"; }
  Status OnStepCommitted(KVManager& manager, SeqId seq) override {
    (void)manager;
    (void)seq;
    return Status::Ok();
  }
  Status Compress(KVManager& manager, SeqId seq) override;
  // It merges at Compress from the pages alone.
  std::optional<int> prompt_window() const override { return 0; }
  Status CheckSpec(const ResolvedKVSpec& resolved) const override;

  const MiniCacheConfig& config() const { return config_; }
  const MiniCacheStats& last_stats() const { return stats_; }

 private:
  explicit MiniCachePolicy(const MiniCacheConfig& c) : config_(c) {}
  int Start(int n_layers) const { return config_.start >= 0 ? config_.start : n_layers / 2; }
  Status MergePair(SequenceKV& kv, int a, int b, int kv_head);

  MiniCacheConfig config_;
  MiniCacheStats stats_;
};

}  // namespace kvx::kv
