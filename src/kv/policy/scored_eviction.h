// ScoredEvictionPolicy: the one eviction mechanism every score-based method
// shares (H2O, Scissorhands, TOVA, SnapKV, PyramidKV, CAKE, Ada-KV, key norm,
// random; MiKV and KVMerger through their fates). A method is a Scorer
// (scorer.h) plus default parameters; this class does the rest:
//
//   observe   a ProbabilityRecorder (observations.h) when the scorer needs
//             attention probabilities; folded after every committed step;
//   budget    the average entries kept per kv head, C: budget=B tokens, or
//             ratio=r (the fraction of the sequence's tokens removed):
//             C = ceil((1 - r) * tokens); then per layer (layers=uniform |
//             pyramid | cake) and per head (heads=uniform | adakv), budget.h;
//   select    per (layer, kv head): the first `sinks` and the last `window`
//             live entries (chain order) are always kept; of the rest, the
//             top-scored up to the head's budget;
//   evict     the others go to the fate (fate=drop by default: removed,
//             eviction_fate.h); the sequence is marked
//             (KVManager::MarkEntriesRemoved);
//   compact   a table whose live entries fill less than `compact` of its
//             pages' slots is compacted (SequenceKV::Compact), so the pages
//             really return to the pool and fragmentation stays bounded;
//             so is a table the fate made bigger (fate=demote allocates the
//             demoted pages), whatever its fill.
//
// Two moments (kvpress's distinction): mode=once compresses only when asked
// (KVManager::Compress / Session::Compress: after a context's prefill, with
// or without the question), mode=continuous after every committed step
// (decode under a fixed budget; with ratio=, the kept count follows the
// sequence's length). Continuous also compresses when asked.
//
// Positions: survivors keep their original positions (attention masks by
// stored position, RoPE'd keys keep their rotation).
//
// Parameters (every method; defaults per method, METHODS.md):
//   ratio     fraction of entries removed, 0 <= r < 1        (or budget=)
//   budget    entries kept per kv head on average, >= 1       (or ratio=)
//   window    recent entries always kept                      (method default)
//   sinks     first entries always kept                       (method default)
//   mode      once | continuous
//   layers    uniform | pyramid | cake;  beta (pyramid, 20), tau1, tau2 (cake, 1)
//             are read only with their layers= (refused otherwise); cake's
//             preferences come from attention entropy and variance, which
//             the recorder then keeps for any scorer that observes
//             attention (refused for knorm and random, which observe none)
//   heads     uniform | adakv;  alpha (adakv floor, 0.2) only with adakv
//   compact   live fraction of a table's slots under which it is compacted,
//             0..1 (1: whenever a page can be freed)
//   fate      drop | (registered fates), with their own parameters
//
// Thread-safety: as KVPolicy.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kv/policy/eviction_fate.h"
#include "kv/policy/observations.h"
#include "kv/policy/params.h"
#include "kv/policy/policy.h"
#include "kv/policy/scorer.h"

namespace kvx::kv {

struct EvictionConfig {
  double ratio = 0.5;  // used when budget == 0
  int budget = 0;
  int window = 32;
  double window_fraction = 0.0;  // > 0: window = this fraction of the capacity (H2O's recent half); window= overrides
  int sinks = 4;
  bool continuous = false;
  std::string layers = "uniform";
  double beta = 20.0;
  double tau1 = 1.0, tau2 = 1.0;
  std::string heads = "uniform";
  double alpha = 0.2;
  double compact = 1.0;  // once; continuous defaults to 0.75 (compacting at every step would cost O(n) per token)
  std::string fate = "drop";
};

// Reads the shared parameters over `defaults`.
Status ReadEvictionConfig(PolicyParamReader& params, EvictionConfig* config);

// What one eviction pass decided, for tests and reports.
struct EvictionStats {
  std::vector<int> layer_budget;  // per layer: entries kept per kv head on average (window included)
  std::vector<int> kept;          // per (layer * n_kv_heads + head): live entries after the pass, demoted ones not counted
  int64_t evicted = 0;
  int compactions = 0;
};

class ScoredEvictionPolicy : public KVPolicy {
 public:
  using ScorerFactory = std::function<Result<std::unique_ptr<Scorer>>(PolicyParamReader& params)>;
  // Reads the scorer's parameters (make_scorer), then the shared ones over
  // `defaults`, then the fate's (PolicyRegistry::Create refuses the rest).
  static Result<std::unique_ptr<KVPolicy>> Create(std::string name, PolicyParamReader& params,
                                                  const EvictionConfig& defaults, const ScorerFactory& make_scorer);

  std::string_view name() const override { return name_; }
  Status OnStepCommitted(KVManager& manager, SeqId seq) override;
  Status Compress(KVManager& manager, SeqId seq) override;
  bool compresses_once() const override { return !config_.continuous; }
  // Once-mode scorers that see no probabilities or a replacing window
  // (SnapKV, TOVA, CAKE, ...) depend on the prompt's last queries only;
  // accumulated sums (H2O) and continuous eviction on all of it.
  std::optional<int> prompt_window() const override;
  uint64_t CompressionHeadroomBytes(const ResolvedKVSpec& resolved) const override;
  void OnSequenceReleased(SeqId seq) override;
  Status CheckSpec(const ResolvedKVSpec& resolved) const override;
  AttentionObserver* observer() override { return recorder_.get(); }
  PolicyParams Parameters() const override;
  // The attention statistics kept for the sequence.
  uint64_t SideBytes(SeqId seq) const override { return recorder_ != nullptr ? recorder_->Bytes(seq) : 0; }
  // Its budget of entries (and the fate's copies of the evicted).
  double KeptBytesPerToken(const ResolvedKVSpec& resolved, int tokens, double bytes_per_token) const override;

  const EvictionConfig& config() const { return config_; }
  const Scorer& scorer() const { return *scorer_; }
  const EvictionStats& last_stats() const { return stats_; }
  // The average entries kept per kv head for a sequence of `tokens` tokens.
  int Capacity(int tokens) const;

 private:
  ScoredEvictionPolicy() = default;
  Status Evict(KVManager& manager, SeqId seq);
  std::vector<double> CakePreferences(const SequenceObservations* obs, int n_layers) const;

  std::string name_;
  EvictionConfig config_;
  std::unique_ptr<Scorer> scorer_;
  std::unique_ptr<EvictionFate> fate_;
  std::unique_ptr<ProbabilityRecorder> recorder_;
  EvictionStats stats_;
};

// Live entries over the slots of the pages the sequence holds (1 = no
// fragmentation): what compaction bounds.
double LiveEntryFraction(const SequenceKV& kv);

}  // namespace kvx::kv
