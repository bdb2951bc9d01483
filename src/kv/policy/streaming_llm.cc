#include "kv/policy/streaming_llm.h"

#include <vector>

#include "kv/codec/codec_id.h"
#include "kv/policy/params.h"
#include "kv/policy/sinks_window.h"

namespace kvx::kv {

Result<std::unique_ptr<KVPolicy>> StreamingLLMPolicy::Create(PolicyParamReader& r) {
  int sinks = 4, window = 1020;
  std::string positions = "original";
  r.Int("sinks", &sinks, 0, 1 << 24).Int("window", &window, 1, 1 << 24).Choice("positions", &positions, {"original", "repack"});
  return std::unique_ptr<KVPolicy>(new StreamingLLMPolicy(sinks, window, positions == "repack"));
}

PolicyParams StreamingLLMPolicy::Parameters() const {
  return {{"sinks", std::to_string(sinks_)}, {"window", std::to_string(window_)},
          {"positions", repack_ ? "repack" : "original"}};
}

namespace {
const PolicyRegistrar kRegistered("streamingllm", StreamingLLMPolicy::Create);
}  // namespace

Status StreamingLLMPolicy::OnStepCommitted(KVManager& manager, SeqId seq) {
  KVX_ASSIGN_OR_RETURN(const bool removed, TrimToSinksAndWindow(manager, seq, sinks_, window_));
  if (repack_ && removed) {
    SequenceKV& kv = manager.kv(seq);
    const KVLayout& L = kv.layout();
    // Renumber each head's live entries to n-k .. n-1 in chain order.
    const int32_t n = manager.length(seq);
    std::vector<int> slots;
    std::vector<int32_t> pos;
    for (int l = 0; l < L.n_layers; ++l) {
      for (int h = 0; h < L.n_kv_heads; ++h) {
        const PageTable& t = kv.table(l, h);
        slots.clear();
        for (int s = 0; s < t.length(); ++s) {
          if (PagePositions(kv.pool().PageData(t.pages()[s / L.page_tokens]))[s % L.page_tokens] != kDeadPosition) {
            slots.push_back(s);
          }
        }
        pos.resize(slots.size());
        for (size_t i = 0; i < slots.size(); ++i) pos[i] = n - static_cast<int32_t>(slots.size() - i);
        KVX_RETURN_IF_ERROR(kv.SetPositions(l, h, slots, pos));
      }
    }
  }
  return Status::Ok();
}

Status StreamingLLMPolicy::CheckSpec(const ResolvedKVSpec& resolved) const {
  if (repack_ && !resolved.spec.codec.pre_rope) {
    return InvalidArgument("policy streamingllm: positions=repack renumbers the cached keys' positions, which needs "
                           "keys cached before RoPE; add prerope=1 to the codec (e.g. codec=f16,prerope=1;"
                           "policy=streamingllm,positions=repack) or use positions=original");
  }
  return Status::Ok();
}

}  // namespace kvx::kv
