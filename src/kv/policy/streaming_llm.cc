#include "kv/policy/streaming_llm.h"

#include <vector>

#include "kv/codec/codec_id.h"

namespace kvx::kv {

Result<std::unique_ptr<KVPolicy>> StreamingLLMPolicy::Create(const PolicyParams& params) {
  int sinks = 4, window = 1020;
  for (const auto& [key, value] : params) {
    int* out = key == "sinks" ? &sinks : key == "window" ? &window : nullptr;
    if (out == nullptr) {
      return InvalidArgument("policy streamingllm has no parameter '" + key + "'; it takes sinks and window");
    }
    size_t used = 0;
    long v = -1;
    try {
      v = std::stol(value, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != value.size() || v < 0 || v > (1 << 24)) {
      return InvalidArgument("policy streamingllm: " + key + "=" + value + " must be a token count in 0.." +
                             std::to_string(1 << 24));
    }
    *out = static_cast<int>(v);
  }
  if (window < 1) return InvalidArgument("policy streamingllm: window must be at least 1 token");
  return std::unique_ptr<KVPolicy>(new StreamingLLMPolicy(sinks, window));
}

Status StreamingLLMPolicy::OnStepCommitted(KVManager& manager, SeqId seq) {
  SequenceKV& kv = manager.kv(seq);
  const KVLayout& L = kv.layout();
  const int keep = sinks_ + window_;
  bool removed = false;
  std::vector<int> drop;
  for (int l = 0; l < L.n_layers; ++l) {
    for (int h = 0; h < L.n_kv_heads; ++h) {
      const int live = kv.LiveEntries(l, h);
      if (live <= keep) continue;
      // Live entries in chain order: the first `sinks` stay, then `live - keep` go.
      const PageTable& t = kv.table(l, h);
      int to_drop = live - keep, seen = 0;
      drop.clear();
      for (int s = 0; s < t.length() && to_drop > 0; ++s) {
        const int32_t pos = PagePositions(kv.pool().PageData(t.pages()[s / L.page_tokens]))[s % L.page_tokens];
        if (pos == kDeadPosition) continue;
        if (seen++ < sinks_) continue;
        drop.push_back(s);
        --to_drop;
      }
      KVX_RETURN_IF_ERROR(kv.RemoveEntries(l, h, drop));
      removed = true;
    }
  }
  if (removed) manager.MarkEntriesRemoved(seq);
  return Status::Ok();
}

}  // namespace kvx::kv
