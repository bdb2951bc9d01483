#include "kv/policy/scorer.h"

#include <algorithm>

namespace kvx::kv {

Result<GroupReduce> ParseGroupReduce(std::string_view text) {
  if (text == "mean") return GroupReduce::kMean;
  if (text == "max") return GroupReduce::kMax;
  if (text == "min") return GroupReduce::kMin;
  if (text == "sum") return GroupReduce::kSum;
  return InvalidArgument("GQA reduce '" + std::string(text) + "' is not one of mean, max, min, sum");
}

std::string_view GroupReduceName(GroupReduce reduce) {
  switch (reduce) {
    case GroupReduce::kMax: return "max";
    case GroupReduce::kMin: return "min";
    case GroupReduce::kSum: return "sum";
    default: return "mean";
  }
}

void Pool1D(std::vector<float>* scores, int kernel, bool max_pool) {
  if (kernel <= 1 || scores->size() < 2) return;
  const int n = static_cast<int>(scores->size()), r = kernel / 2;
  const std::vector<float> in = *scores;
  for (int i = 0; i < n; ++i) {
    const int a = std::max(0, i - r), b = std::min(n - 1, i + r);
    float acc = max_pool ? in[a] : 0.0f;
    for (int j = a; j <= b; ++j) acc = max_pool ? std::max(acc, in[j]) : acc + in[j];
    (*scores)[i] = max_pool ? acc : acc / static_cast<float>(b - a + 1);
  }
}

}  // namespace kvx::kv
