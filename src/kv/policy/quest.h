// Quest (Tang et al., 2024): query-aware page selection at decode. The policy
// evicts nothing; it turns on SequenceKV's page bounds and page selection
// (kv/page_selection.h) for every sequence it sees, after the sequence's
// first committed step (the prompt attends densely anyway; the bounds of the
// pages written so far are computed then, later pages as they are written).
// From then on each kv head of each layer from `dense_layers` on reads only
// its top pages by the Quest upper bound per decode token: same memory,
// fewer bytes read.
//
// Parameters (--kv policy group, e.g. "policy=quest,budget=1024"):
//   budget        tokens read per kv head and decode step (pages = budget /
//                 page tokens, at least 1)                  default 1024
//   pages         pages read instead of budget (> 0 overrides it)
//   sink_pages    first pages always read (the attention sink) default 1
//   recent_pages  last pages always read (the page written)  default 1
//   dense_layers  first layers attended densely              default 2
// Composes with any codec without prerope=1 (which it rejects at the first
// step) and with eviction policies (bounds stay valid as entries leave).
#pragma once

#include <memory>

#include "kv/page_selection.h"
#include "kv/policy/policy.h"

namespace kvx::kv {

class QuestPolicy : public KVPolicy {
 public:
  static Result<std::unique_ptr<KVPolicy>> Create(PolicyParamReader& params);
  PolicyParams Parameters() const override;
  // Evicts nothing; adds the page bounds (a min and a max key a page and
  // kv head, f32) that live beside the pool.
  double KeptBytesPerToken(const ResolvedKVSpec& resolved, int tokens, double bytes_per_token) const override;
  std::string_view name() const override { return "quest"; }
  Status OnStepCommitted(KVManager& manager, SeqId seq) override;
  // What SetPageSelection would refuse at the first step, refused when the
  // spec is resolved instead (pre-RoPE keys, a budget under the forced pages).
  Status CheckSpec(const ResolvedKVSpec& resolved) const override;
  const PageSelection& selection() const { return selection_; }
  // It observes nothing; the selection it turns on after a step reads the
  // pages' bounds, computed from the pages when turned on.
  std::optional<int> prompt_window() const override { return 0; }

 private:
  explicit QuestPolicy(const PageSelection& s) : selection_(s) {}
  PageSelection selection_;
};

}  // namespace kvx::kv
