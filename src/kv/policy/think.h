// ThinK (Xu et al., 2024, arXiv 2407.21018; METHODS.md C4): query-driven
// key-channel pruning. A head's keys have a few channels that carry most of
// q.k for the queries that matter; the others are dropped from the stored
// keys of the older tokens, which then cost fewer bytes.
//
// At the compression moment (after a context's prefill, like SnapKV and
// MiniCache: mode=once), per (layer, kv head):
//   s_c = mean_i Qw[i,c]^2 * mean_j K[j,c]^2
// with Qw the last `window` prompt queries of the group's query heads (GQA:
// the query term averaged over the G heads, as kvpress's ThinKPress) and K
// the live keys outside the last `recent` entries (all live keys when there
// are no others). The top keep = head_dim - floor(lambda * head_dim)
// channels stay (kvpress's int(head_dim * compression_ratio) pruned), ties to
// the lower channel; `keep=` sets the count directly.
//
// Storage (SequenceKV::PruneKeyChannels, kv/pruned_keys.h): the table's
// channel mask beside it (one per (layer, kv head), per sequence: it depends
// on the query), and every packed page wholly older than the last `recent`
// entries rewritten as a pruned page: keys with the kept channels only,
// encoded with the layer's block codec (f16 for f16/f32 layers, the layer
// codec itself for int8/int4/int2: same bits, group and sym over the kept
// channels), values whole and as the packed page stored them (f32 values
// rounded to f16); its own, smaller, pool size class. So memory is
// really freed (kvpress only zeroes the channels). Recent and newly generated
// tokens keep all channels in ordinary pages. Attention dots a pruned page's
// keys with the queries' kept channels (a pruned channel counts as zero).
//
// Channels, not rotary pairs: kvx stores keys post-RoPE and never rotates
// them again, so a single channel can go (pre-RoPE keys, prerope=1, are
// rejected: RoPE at read time would mix a kept channel with its pruned
// partner).
//
// Composes with eviction run before it in the same --kv (kvpress
// ComposedPress: "policy=snapkv,ratio=0.5;policy=think,lambda=0.4") and after
// it (an entry evicted from a pruned page is simply dropped); with f16, f32,
// int8, int4 and int2 layer codecs. Rejected at parse time: kivi* (keys
// quantized per channel over a sealed page: no pruned format yet),
// outliers=, a keep that saves no bytes in the layer codec (quantized keys
// are stored in whole groups), prerope=1, rotate=hadamard, quest,
// minicache, mode=continuous.
// Forks share pruned pages and copy the masks; session files refuse a
// pruned cache.
//
// Parameters (--kv policy group, e.g. "codec=f16;policy=think,lambda=0.4"):
//   lambda  fraction of key channels pruned           default 0.4
//   keep    key channels kept (instead of lambda)     default: from lambda
//   window  prompt queries scored                     default 32
//   recent  newest entries kept with every channel    default 32
//   mode    once (the only mode)
//
// Thread-safety: as KVPolicy (the observer's OnQueries runs on the caller).
#pragma once

#include <map>
#include <memory>
#include <cstdint>
#include <mutex>
#include <vector>

#include "kv/policy/policy.h"

namespace kvx::kv {

struct ThinKConfig {
  double lambda = 0.4;
  int keep = 0;  // 0: from lambda
  int window = 32;
  int recent = 32;
  // Key channels kept of head_dim.
  int KeepFor(int head_dim) const;
};

// The channels ThinK keeps, ascending: the `keep` largest of
// s_c = mean over (rows, heads) of q^2 times mean over keys of k^2.
// q: [n_rows][G][d] one GQA group's queries; k: [n_keys][d].
std::vector<int> ThinKKeptChannels(const float* q, int n_rows, int G, const float* k, int n_keys, int d, int keep);

// What the last Compress did, for tests and reports.
struct ThinKStats {
  int tables = 0;        // (layer, kv head) tables given a mask
  int64_t pages = 0;     // pages rewritten as pruned pages, all tables
};

class ThinKPolicy : public KVPolicy, public AttentionObserver {
 public:
  static Result<std::unique_ptr<KVPolicy>> Create(PolicyParamReader& params);
  PolicyParams Parameters() const override;
  std::string_view name() const override { return "think"; }
  Status OnStepCommitted(KVManager& manager, SeqId seq) override;
  Status Compress(KVManager& manager, SeqId seq) override;
  bool compresses_once() const override { return true; }
  // The ring of the last `window` prompt queries.
  std::optional<int> prompt_window() const override { return config_.window; }
  void OnSequenceReleased(SeqId seq) override;
  Status CheckSpec(const ResolvedKVSpec& resolved) const override;
  AttentionObserver* observer() override { return this; }

  // The observer: the last `window` queries of each prompt (calls of
  // several queries), per layer; never the probabilities.
  int QueryWindow() const override { return config_.window; }
  bool Observes(int seq, int n_q) const override {
    (void)seq;
    return n_q > 1;
  }
  bool WantsProbabilities() const override { return false; }
  void OnQueries(int seq, int layer, const float* q, int n_q, int n_heads, int head_dim) override;
  void OnProbabilities(int, int, int, int, int, const float*, const int32_t*, int) override {}

  const ThinKConfig& config() const { return config_; }
  const ThinKStats& last_stats() const { return stats_; }

 private:
  explicit ThinKPolicy(const ThinKConfig& c) : config_(c) {}
  // The last queries of one sequence: per layer, rows [n][n_heads * head_dim].
  struct Queries {
    int n_heads = 0, head_dim = 0;
    std::map<int, std::vector<float>> rows;  // by layer
  };
  void Keep(Queries* into, int layer, const float* q, int n_rows, int n_heads, int head_dim) const;

  ThinKConfig config_;
  ThinKStats stats_;
  std::mutex mu_;
  std::map<int, Queries> step_;    // by batch index, this step
  std::map<SeqId, Queries> seqs_;  // folded, per sequence
};

}  // namespace kvx::kv
