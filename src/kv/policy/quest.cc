#include "kv/policy/quest.h"

#include <string>

#include "kv/kv_spec.h"
#include "kv/policy/params.h"

namespace kvx::kv {

Result<std::unique_ptr<KVPolicy>> QuestPolicy::Create(PolicyParamReader& r) {
  PageSelection s;
  s.enabled = true;
  constexpr int kMax = 1 << 24;
  r.Int("budget", &s.budget_tokens, 1, kMax)
      .Int("pages", &s.pages, 1, kMax)
      .Int("sink_pages", &s.sink_pages, 0, kMax)
      .Int("recent_pages", &s.recent_pages, 1, kMax)
      .Int("dense_layers", &s.dense_layers, 0, kMax);
  if (s.recent_pages < 1) {
    return InvalidArgument("policy quest: recent_pages must be at least 1 (the page being written is always read)");
  }
  return std::unique_ptr<KVPolicy>(new QuestPolicy(s));
}

PolicyParams QuestPolicy::Parameters() const {
  const PageSelection& s = selection_;
  return {{"budget", std::to_string(s.budget_tokens)}, {"pages", std::to_string(s.pages)},
          {"sink_pages", std::to_string(s.sink_pages)}, {"recent_pages", std::to_string(s.recent_pages)},
          {"dense_layers", std::to_string(s.dense_layers)}};
}

double QuestPolicy::KeptBytesPerToken(const ResolvedKVSpec& resolved, int tokens, double bytes_per_token) const {
  (void)tokens;
  const KVLayout& L = resolved.layout;
  return bytes_per_token + 2.0 * L.head_dim * sizeof(float) * L.n_layers * L.n_kv_heads / L.page_tokens;
}

Status QuestPolicy::CheckSpec(const ResolvedKVSpec& resolved) const {
  if (Status st = CheckPageSelection(selection_, resolved.spec.codec.pre_rope, resolved.layout.page_tokens); !st.ok()) {
    return InvalidArgument("policy quest: " + st.message());
  }
  return Status::Ok();
}

Status QuestPolicy::OnStepCommitted(KVManager& manager, SeqId seq) {
  SequenceKV& kv = manager.kv(seq);
  if (kv.page_selection() == selection_) return Status::Ok();
  return kv.SetPageSelection(selection_);
}

namespace {
const PolicyRegistrar kRegistered("quest", QuestPolicy::Create);
}  // namespace

}  // namespace kvx::kv
