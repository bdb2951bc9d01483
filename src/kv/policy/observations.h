// What score-based policies learn from attention probabilities.
//
// ProbabilityRecorder is the AttentionObserver of a scored-eviction policy:
// during a forward pass it accumulates, per sequence of the batch and per
// (layer, query head), statistics of the probabilities each cache entry
// received, indexed by the entry's stored POSITION (not its slot: slots move
// when pages are compacted, positions do not). After the step commits, the
// policy folds the step's statistics into the sequence's
// (SequenceObservations) either by accumulation (H2O: column sums over every
// query so far) or as a sliding window of about `fold_window` queries
// (SnapKV/CAKE's observation window, TOVA's last query, Scissorhands'
// history): a step with at least that many queries replaces the statistics;
// a shorter one (a decode step) blends in, old * (1 - q/w) + new, an
// exponential stand-in for a ring of the last w query rows (which would cost
// w * n floats per head). With `exact_window` the ring itself is kept
// (Scissorhands' history window as its paper defines it, ring=1): the
// newest steps whose queries cover w, their statistics summed.
//
// Per query head, not per kv head, so a scorer can reduce the GQA group as
// its paper does (mean, max) and CAKE can take variances per head.
//
// Thread-safety: OnProbabilities (and OnColumnSums, once per head and layer
// from the attention's calling thread) runs concurrently on pool threads (a lock
// per (batch sequence, layer, head) stripe guards each accumulation; a
// short global lock finds the buffers); everything else runs on the
// manager's thread between steps.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "kv/attention.h"
#include "kv/kv_manager.h"

namespace kvx::kv {

// What a scorer wants recorded.
struct ObservationNeeds {
  bool probabilities = false;  // false: no observer at all (key-norm, random)
  int query_window = 0;        // AttentionObserver::QueryWindow: last w queries per call (0 = all)
  int fold_window = 0;         // 0: accumulate over all steps; w > 0: ~ the last w queries
  bool squares = false;        // sum of p^2 per entry (variance over the window)
  bool low_hits = false;       // queries that gave the entry less than 1/visible
  bool entropy = false;        // per head: sum over queries of -sum_j p log p
  // fold_window > 0: keep the last steps covering fold_window queries
  // exactly (a ring of step statistics, ~w * n floats per head) instead of
  // the exponential blend.
  bool exact_window = false;
  // false: a call's single query of a sequence (a decode step) is not
  // observed. Once-mode policies compress after a prompt, so decode queries
  // would only cost them the fast attention kernels; continuous ones need
  // every step.
  bool single_queries = true;
};

// Statistics of one (layer, query head), indexed by position.
struct HeadStats {
  std::vector<float> sum;  // sum over observed queries of p
  std::vector<float> sq;   // of p^2 (needs.squares)
  std::vector<float> low;  // count of p < 1/visible (needs.low_hits)
  double entropy = 0.0;    // sum over queries of -sum_j p log p (needs.entropy)
  double queries = 0.0;    // queries observed (blended)

  float Sum(int32_t pos) const { return pos >= 0 && static_cast<size_t>(pos) < sum.size() ? sum[pos] : 0.0f; }
  float Sq(int32_t pos) const { return pos >= 0 && static_cast<size_t>(pos) < sq.size() ? sq[pos] : 0.0f; }
  float Low(int32_t pos) const { return pos >= 0 && static_cast<size_t>(pos) < low.size() ? low[pos] : 0.0f; }
};

// One sequence's statistics for every (layer, query head) observed.
class SequenceObservations {
 public:
  // nullptr when (layer, head) was never observed.
  const HeadStats* head(int layer, int head) const;
  HeadStats& mutable_head(int layer, int head) { return heads_[{layer, head}]; }
  // Query heads observed per layer (the largest head index + 1).
  int n_heads() const { return n_heads_; }
  void NoteHead(int head) { n_heads_ = std::max(n_heads_, head + 1); }
  // Folds `step` in: accumulate (fold_window 0) or sliding window.
  void Fold(const SequenceObservations& step, const ObservationNeeds& needs);
  bool empty() const { return heads_.empty(); }
  // Bytes the statistics take (heap).
  size_t Bytes() const;

 private:
  std::map<std::pair<int, int>, HeadStats> heads_;
  // needs.exact_window: per head, the steps heads_ sums (oldest first).
  std::map<std::pair<int, int>, std::deque<HeadStats>> rings_;
  int n_heads_ = 0;
};

class ProbabilityRecorder : public AttentionObserver {
 public:
  explicit ProbabilityRecorder(const ObservationNeeds& needs) : needs_(needs) {}
  int QueryWindow() const override { return needs_.query_window; }
  bool Observes(int seq, int n_q) const override {
    (void)seq;
    return needs_.single_queries || n_q > 1;
  }
  void OnProbabilities(int seq, int layer, int query_index, int head, int kv_head, const float* probs,
                       const int32_t* positions, int n) override;
  // Sums alone (H2O, SnapKV, TOVA) come as column sums for a prompt's
  // queries; squares, low hits and entropy need every row.
  bool WantsColumnSums() const override { return !needs_.squares && !needs_.low_hits && !needs_.entropy; }
  void OnColumnSums(int seq, int layer, int head, const float* sums, const int32_t* positions, int n,
                    int queries) override;

  // Folds what the last step recorded for `seq` (found through
  // manager.step_requests()) into its statistics; call once per sequence
  // from OnStepCommitted.
  void FoldStep(const KVManager& manager, SeqId seq);
  // The sequence's statistics (nullptr before any observation).
  const SequenceObservations* Find(SeqId seq) const;
  // Bytes kept for `seq` between steps (0 before any observation).
  size_t Bytes(SeqId seq) const {
    const SequenceObservations* o = Find(seq);
    return o == nullptr ? 0 : o->Bytes();
  }
  void Forget(SeqId seq) { seqs_.erase(seq); }
  const ObservationNeeds& needs() const { return needs_; }

 private:
  ObservationNeeds needs_;
  std::mutex mu_;                                                 // guards step_'s maps
  std::map<int, std::unique_ptr<SequenceObservations>> step_;     // by batch index, this step
  std::array<std::mutex, 64> stripes_;
  std::map<SeqId, SequenceObservations> seqs_;

  // This step's statistics of (batch sequence, layer, head), created on first use.
  HeadStats* StepHead(int seq, int layer, int head);
  // The stripe lock guarding them.
  std::mutex& Stripe(int seq, int layer, int head) {
    return stripes_[(static_cast<size_t>(seq) * 131 + layer * 17 + head) % stripes_.size()];
  }
};

}  // namespace kvx::kv
