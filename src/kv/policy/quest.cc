#include "kv/policy/quest.h"

#include <string>

#include "kv/kv_spec.h"
#include "kv/policy/params.h"

namespace kvx::kv {

Result<std::unique_ptr<KVPolicy>> QuestPolicy::Create(const PolicyParams& params) {
  PageSelection s;
  s.enabled = true;
  constexpr int kMax = 1 << 24;
  PolicyParamReader r("quest", params);
  r.Int("budget", &s.budget_tokens, 1, kMax)
      .Int("pages", &s.pages, 1, kMax)
      .Int("sink_pages", &s.sink_pages, 0, kMax)
      .Int("recent_pages", &s.recent_pages, 1, kMax)
      .Int("dense_layers", &s.dense_layers, 0, kMax);
  KVX_RETURN_IF_ERROR(r.Finish());
  if (s.recent_pages < 1) {
    return InvalidArgument("policy quest: recent_pages must be at least 1 (the page being written is always read)");
  }
  return std::unique_ptr<KVPolicy>(new QuestPolicy(s));
}

Status QuestPolicy::CheckSpec(const KVSpec& spec, const KVLayout& layout) const {
  if (spec.codec.pre_rope) {
    return InvalidArgument("policy quest: Quest page selection needs post-RoPE keys: the stored pre-RoPE keys are "
                           "not what attention dots with; drop prerope=1 or the quest policy");
  }
  if (selection_.PagesFor(layout.page_tokens) < selection_.sink_pages + selection_.recent_pages) {
    return InvalidArgument("policy quest: selection " + selection_.ToString() + " reads fewer pages than it forces " +
                           "(sink_pages + recent_pages); raise the budget");
  }
  return Status::Ok();
}

Status QuestPolicy::OnStepCommitted(KVManager& manager, SeqId seq) {
  SequenceKV& kv = manager.kv(seq);
  if (kv.page_selection() == selection_) return Status::Ok();
  return kv.SetPageSelection(selection_);
}

}  // namespace kvx::kv
