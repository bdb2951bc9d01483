#include "kv/policy/quest.h"

#include "kv/policy/param_parse.h"

namespace kvx::kv {

Result<std::unique_ptr<KVPolicy>> QuestPolicy::Create(const PolicyParams& params) {
  PageSelection s;
  s.enabled = true;
  constexpr int kMax = 1 << 24;
  for (const auto& [key, value] : params) {
    int* out = key == "budget"         ? &s.budget_tokens
               : key == "pages"        ? &s.pages
               : key == "sink_pages"   ? &s.sink_pages
               : key == "recent_pages" ? &s.recent_pages
               : key == "dense_layers" ? &s.dense_layers
                                       : nullptr;
    if (out == nullptr) {
      return InvalidArgument("policy quest has no parameter '" + key +
                             "'; it takes budget, pages, sink_pages, recent_pages and dense_layers");
    }
    const int lo = key == "budget" || key == "pages" ? 1 : 0;
    KVX_ASSIGN_OR_RETURN(*out, ParseIntParam("quest", key, value, lo, kMax));
  }
  if (s.recent_pages < 1) {
    return InvalidArgument("policy quest: recent_pages must be at least 1 (the page being written is always read)");
  }
  return std::unique_ptr<KVPolicy>(new QuestPolicy(s));
}

Status QuestPolicy::OnStepCommitted(KVManager& manager, SeqId seq) {
  SequenceKV& kv = manager.kv(seq);
  if (kv.page_selection() == selection_) return Status::Ok();
  return kv.SetPageSelection(selection_);
}

}  // namespace kvx::kv
