// The `merge` eviction fate (eviction_fate.h): KVMerger / D2O's "merge
// instead of drop". Each evicted entry e goes to the kept entry r whose key
// is most similar (cosine over the head's keys); r's key and value become
// the weighted mean of r and the entries merged into it,
//     k_r' = (k_r + sum_e w_e k_e) / (1 + sum_e w_e)   (values alike),
// with
//     merge_weight=cos    w_e = (cos(k_e, k_r) + 1) / 2  (KVCache-Factory's
//                         "weighted" merge, its stand-in for KVMerger)
//     merge_weight=gauss  w_e = exp(-|k_e - k_r|^2 / (2 sigma^2)), KVMerger's
//                         Gaussian kernel centred on the pivot r, sigma^2 =
//                         the mean squared distance of the head's evicted
//                         entries to their pivots (the paper's sigma is not
//                         given: an assumption)
// and then e is removed. An evicted entry whose best cosine is below the
// threshold is dropped without merging: merge_min_sim, fixed (kvx's
// default, -1: every evicted entry merges), or with merge_ema=beta D2O's
// exponential moving average of the evictions' best similarities,
//     tau_t = beta tau_{t-1} + (1 - beta) mean_e maxcos(e)   (tau_1 = mean),
// one per (sequence, layer, kv head) since kvx evicts per head (D2O keeps
// one per layer); beta is not given by METHODS.md's sources (an assumption,
// like sigma below). The merged entry keeps r's
// position. Keys are merged as stored: with prerope=1 that is pre-RoPE (what
// METHODS.md recommends); otherwise roped keys of different positions are
// averaged (the phase error METHODS.md warns about). The merged entry counts
// once in the softmax (no log-count logit bias: attention has no per-entry
// weight), as in KVCache-Factory.
//
// Registered as fate "merge" and as policy `kvmerger` (H2O's accumulated
// attention picks the evicted and the pivots, fate=merge).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kv/policy/eviction_fate.h"
#include "kv/policy/policy.h"

namespace kvx::kv {

class MergeFate : public EvictionFate {
 public:
  static Result<std::unique_ptr<EvictionFate>> Create(PolicyParamReader& params);
  std::string_view name() const override { return "merge"; }
  Status Apply(KVManager& manager, SeqId seq, int layer, int kv_head, const std::vector<int>& evicted,
               const std::vector<int>& kept) override;

  PolicyParams Parameters() const override;
  void Forget(SeqId seq) override;
  // Entries merged (not dropped) so far, for tests and reports.
  int64_t merged() const { return merged_; }

 private:
  // The threshold an eviction of these similarities merges above (updates
  // the EMA when on).
  double Threshold(SeqId seq, int layer, int kv_head, const std::vector<double>& best_sims);

  bool gauss_ = false;
  double min_sim_ = -1.0;
  double ema_beta_ = 0.0;  // 0: the fixed min_sim_
  std::map<std::tuple<SeqId, int, int>, double> ema_;
  int64_t merged_ = 0;
};

}  // namespace kvx::kv
