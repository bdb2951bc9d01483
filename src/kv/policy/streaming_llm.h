// StreamingLLM (Xiao et al., 2023, "Efficient Streaming Language Models with
// Attention Sinks"): every head keeps the first `sinks` entries (the
// attention sinks) and the most recent `window` entries; everything between
// is evicted after each step, so the cache stays at sinks + window entries
// per head however long the sequence grows. Entries keep their original
// positions (kvx's attention masks and RoPE use the stored positions); the
// paper's re-packed positions (positions within the cache) are not
// implemented yet.
//
// Because entries leave in chain order, whole pages die as the window moves
// and return to the pool at once: no compaction is needed (the page holding
// the window's start and the sink page may keep dead slots).
//
// Parameters (--kv policy group): sinks (default 4), window (default 1020).
#pragma once

#include <memory>

#include "kv/policy/policy.h"

namespace kvx::kv {

class StreamingLLMPolicy : public KVPolicy {
 public:
  static Result<std::unique_ptr<KVPolicy>> Create(const PolicyParams& params);
  std::string_view name() const override { return "streamingllm"; }
  Status OnStepCommitted(KVManager& manager, SeqId seq) override;
  int sinks() const { return sinks_; }
  int window() const { return window_; }

 private:
  StreamingLLMPolicy(int sinks, int window) : sinks_(sinks), window_(window) {}
  int sinks_, window_;
};

}  // namespace kvx::kv
