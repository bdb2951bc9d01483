// The score-based eviction methods by name (each a Scorer in its own file
// plus METHODS.md defaults, run by ScoredEvictionPolicy):
//   h2o           accumulated attention (column sums), recent half kept
//   scissorhands  fewest low-attention hits over a history window
//   tova          the last query's attention, averaged over the layer's heads
//   snapkv        observation-window votes, pooled
//   pyramidkv     snapkv with PyramidKV's layer budgets
//   cake          window mean + gamma * variance, CAKE's layer budgets
//   adakv         Ada-KV head budgets over base=snapkv|h2o|tova|... (any scorer)
//   knorm         lowest key L2 norm kept (Devoto et al. 2024; kvpress KnormPress)
//   random        seeded random scores: the floor
// (and through their fates mikv, demote_fate.h, and kvmerger, merge_fate.h).
//
// A scorer registers itself in its own file:
//   const ScorerRegistrar kRegistered(SnapKVMethod());
// which makes it a policy of the same name and a base= choice of adakv.
//
// Thread-safety: registration runs at static initialization; lookups after.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kv/policy/policy.h"
#include "kv/policy/scored_eviction.h"

namespace kvx::kv {

// A scorer by method name, with the method's default shared parameters.
struct ScorerMethod {
  std::string name;
  ScoredEvictionPolicy::ScorerFactory make;
  EvictionConfig defaults;
};

// Every registered scorer method, by name (adakv's base= choices).
std::vector<ScorerMethod> ScorerMethods();
// The registered scorer `name`; InvalidArgument listing them otherwise.
Result<ScorerMethod> FindScorerMethod(std::string_view name);

// The factory of the policy `policy` that runs scorer `scorer` over the
// scorer's defaults changed by `adjust` (a variant: pyramidkv is snapkv
// with layers=pyramid, mikv and kvmerger are h2o with a fate). The scorer is
// looked up at creation, so a variant may register before its scorer.
PolicyFactory ScoredPolicyFactory(std::string policy, std::string scorer,
                                  std::function<void(EvictionConfig&)> adjust = nullptr);

// Registers the scorer and its policy of the same name.
struct ScorerRegistrar {
  explicit ScorerRegistrar(ScorerMethod method);
};

}  // namespace kvx::kv
