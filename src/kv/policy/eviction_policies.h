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
// Thread-safety: registration runs once, inside PolicyRegistry::Global().
#pragma once

#include <memory>
#include <string>
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

ScorerMethod H2OMethod();
ScorerMethod ScissorhandsMethod();
ScorerMethod TovaMethod();
ScorerMethod SnapKVMethod();
ScorerMethod CakeMethod();
ScorerMethod KeyNormMethod();
ScorerMethod RandomMethod();

// Every scorer method (adakv's base= choices).
std::vector<ScorerMethod> ScorerMethods();

// Registers every policy above.
void RegisterEvictionPolicies(PolicyRegistry& registry);

}  // namespace kvx::kv
