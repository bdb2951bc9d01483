#include "engine/prefix_groups.h"

#include <algorithm>
#include <numeric>

namespace kvx::engine {
namespace {

int CommonPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return static_cast<int>(i);
}

}  // namespace

std::vector<PrefixGroup> GroupByPrefix(const std::vector<std::vector<int32_t>>& prompts, int block_tokens) {
  std::vector<int> order(prompts.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return prompts[a] < prompts[b]; });
  // The usable shared prefix of two prompts: whole blocks, and short of the
  // shorter prompt's end (its last token must be computed for its logits).
  auto usable = [&](int a, int b) {
    const int lcp = std::min({CommonPrefix(prompts[a], prompts[b]), static_cast<int>(prompts[a].size()) - 1,
                              static_cast<int>(prompts[b].size()) - 1});
    return lcp <= 0 ? 0 : lcp / block_tokens * block_tokens;
  };
  // In sorted order, the common prefix of a run is the smallest adjacent one.
  std::vector<PrefixGroup> groups;
  for (size_t i = 0; i < order.size();) {
    PrefixGroup g;
    g.members.push_back(order[i]);
    int shared = 0;
    size_t j = i + 1;
    for (; j < order.size(); ++j) {
      const int s = usable(order[j - 1], order[j]);
      if (s == 0) break;
      shared = g.members.size() == 1 ? s : std::min(shared, s);
      g.members.push_back(order[j]);
    }
    g.prefix_tokens = g.members.size() > 1 ? shared : 0;
    groups.push_back(std::move(g));
    i = j;
  }
  return groups;
}

}  // namespace kvx::engine
