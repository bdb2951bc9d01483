// StreamingLLM (Xiao et al., 2023, "Efficient Streaming Language Models with
// Attention Sinks"): every head keeps the first `sinks` entries (the
// attention sinks) and the most recent `window` entries; everything between
// is evicted after each step, so the cache stays at sinks + window entries
// per head however long the sequence grows.
//
// Positions (positions=):
//   original  entries keep their original positions (kvx's attention masks
//             and RoPE use the stored positions): kvpress without
//             KeyRerotationPress; fine within the trained context.
//   repack    the paper's: positions by slot in the cache. RoPE is relative,
//             so kvx renumbers the k live entries of a head to
//             n-k .. n-1 (n = the sequence's length, the next query's
//             position): every query then sees its keys at their in-cache
//             distances, exactly as with in-cache indices 0..k-1, and no
//             engine change is needed. It rewrites stored positions only,
//             so it needs pre-RoPE keys (--kv prerope=1: RoPE applied at the
//             stored position on read). Re-rotating roped keys instead would
//             decode, rotate and re-encode every kept key at every step
//             (drifting with each re-quantization, METHODS.md B1 pitfall), so
//             positions=repack without prerope=1 is rejected.
//
// Because entries leave in chain order, whole pages die as the window moves
// and return to the pool at once: no compaction is needed (the page holding
// the window's start and the sink page may keep dead slots).
//
// Parameters (--kv policy group): sinks (default 4), window (default 1020),
// positions (original | repack, default original).
#pragma once

#include <memory>

#include "kv/policy/policy.h"

namespace kvx::kv {

class StreamingLLMPolicy : public KVPolicy {
 public:
  static Result<std::unique_ptr<KVPolicy>> Create(PolicyParamReader& params);
  PolicyParams Parameters() const override;
  double KeptBytesPerToken(const ResolvedKVSpec& resolved, int tokens, double bytes_per_token) const override {
    (void)resolved;
    return bytes_per_token * std::min(tokens, sinks_ + window_) / tokens;
  }
  std::string_view name() const override { return "streamingllm"; }
  Status OnStepCommitted(KVManager& manager, SeqId seq) override;
  Status CheckSpec(const ResolvedKVSpec& resolved) const override;
  int sinks() const { return sinks_; }
  int window() const { return window_; }
  bool repack() const { return repack_; }

 private:
  StreamingLLMPolicy(int sinks, int window, bool repack) : sinks_(sinks), window_(window), repack_(repack) {}
  int sinks_, window_;
  bool repack_;
};

}  // namespace kvx::kv
