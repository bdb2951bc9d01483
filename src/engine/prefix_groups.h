// Prefix groups for offline batches (BatchLLM's global prefix sharing):
// sort the prompts so that prompts with a common prefix are neighbours, and
// find the runs that share at least one full KV block. `kvx batch` computes
// each run's common prefix once (a warm-up request the prefix cache keeps)
// before it submits the run's prompts, which then start from the cached
// pages instead of each computing the prefix while the others do too.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

namespace kvx::engine {

struct PrefixGroup {
  std::vector<int> members;  // indices into the prompts, in submission order
  int prefix_tokens = 0;     // shared by all members, whole blocks (0: none)
};

// Groups `prompts` (token ids) by shared prefix: the members of a group are
// consecutive in lexicographic order and share `prefix_tokens` tokens, a
// multiple of `block_tokens` that leaves every member at least one token of
// its own to compute (a group of one, or prompts sharing less than a block,
// have prefix_tokens 0). Groups come in lexicographic order; every prompt is
// in exactly one group. REQUIRES: block_tokens >= 1.
std::vector<PrefixGroup> GroupByPrefix(const std::vector<std::vector<int32_t>>& prompts, int block_tokens);

}  // namespace kvx::engine
