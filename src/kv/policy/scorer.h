// Scorer: the per-method part of score-based eviction. Given the live
// candidates of one (layer, kv head) — every live entry but the protected
// sinks and recent window, in chain order — it returns one score per
// candidate; the selection keeps the highest. Scores come from the
// attention probabilities the policy's recorder observed (H2O, TOVA,
// SnapKV, CAKE, Scissorhands), from the stored keys (key norm), or from a
// seeded generator (random). Everything else — budgets per layer and head,
// sinks, window, what happens to the evicted, compaction — is shared
// (scored_eviction.h), so a method is a scorer plus defaults.
//
// Thread-safety: Score is called from the manager's thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kv/policy/observations.h"
#include "kv/policy/policy.h"
#include "kv/sequence_kv.h"

namespace kvx::kv {

struct ScoringInput {
  const SequenceKV& kv;
  const SequenceObservations* obs;  // nullptr when nothing was observed (yet)
  int layer = 0;
  int kv_head = 0;
  const std::vector<int>& slots;          // the candidates' slots, chain order
  const std::vector<int32_t>& positions;  // their stored positions
};

class Scorer {
 public:
  virtual ~Scorer() = default;
  virtual std::string_view name() const = 0;
  virtual ObservationNeeds needs() const = 0;
  // The scorer's own keys with the values in use (KVPolicy::Parameters).
  virtual PolicyParams Parameters() const { return {}; }
  // scores->size() == in.slots.size() on return; higher = keep first. Ties
  // are broken by position (the later entry stays).
  virtual void Score(const ScoringInput& in, std::vector<float>* scores) const = 0;
};

// How a per-query-head statistic becomes a per-kv-head one (METHODS.md,
// "GQA aggregation").
enum class GroupReduce { kMean, kMax, kMin, kSum };
Result<GroupReduce> ParseGroupReduce(std::string_view text);
std::string_view GroupReduceName(GroupReduce reduce);

// For every candidate, the statistic `stat(head_stats, position)` of the
// query heads of kv_head's group, reduced. Heads never observed count as 0.
// The group is obs->n_heads() / n_kv_heads query heads. A `pool_kernel` > 1
// smooths each query head's statistic (Pool1D) before the reduction, as
// SnapKV and CAKE do.
template <typename Stat>
void GroupStat(const ScoringInput& in, GroupReduce reduce, const Stat& stat, std::vector<float>* out,
               int pool_kernel = 1, bool max_pool = false);

// 1-D pooling over the candidates in chain order (SnapKV's smoothing):
// kernel k (odd), stride 1, centred; average over the in-range neighbours
// (no zero padding, which would lower the edges: METHODS.md B5 pitfall) or
// max. k <= 1 leaves the scores unchanged.
void Pool1D(std::vector<float>* scores, int kernel, bool max_pool);

// ---- template definition ----
template <typename Stat>
void GroupStat(const ScoringInput& in, GroupReduce reduce, const Stat& stat, std::vector<float>* out, int pool_kernel,
               bool max_pool) {
  const size_t n = in.positions.size();
  out->assign(n, 0.0f);
  if (in.obs == nullptr || in.obs->n_heads() == 0) return;
  const int H = in.kv.layout().n_kv_heads;
  const int G = std::max(1, in.obs->n_heads() / H);
  std::vector<float> v(n);
  for (int g = 0; g < G; ++g) {
    const HeadStats* hs = in.obs->head(in.layer, in.kv_head * G + g);
    for (size_t i = 0; i < n; ++i) v[i] = hs == nullptr ? 0.0f : stat(*hs, in.positions[i]);
    Pool1D(&v, pool_kernel, max_pool);
    for (size_t i = 0; i < n; ++i) {
      float& o = (*out)[i];
      switch (reduce) {
        case GroupReduce::kMax: o = g == 0 ? v[i] : std::max(o, v[i]); break;
        case GroupReduce::kMin: o = g == 0 ? v[i] : std::min(o, v[i]); break;
        default: o += v[i];
      }
    }
  }
  if (reduce == GroupReduce::kMean) {
    for (float& o : *out) o /= static_cast<float>(G);
  }
}

}  // namespace kvx::kv
