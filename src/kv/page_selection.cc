#include "kv/page_selection.h"

#include <algorithm>
#include <limits>
#include <numeric>

namespace kvx::kv {

std::string PageSelection::ToString() const {
  return "quest(" + (pages > 0 ? "pages=" + std::to_string(pages) : "budget=" + std::to_string(budget_tokens)) +
         ",sink_pages=" + std::to_string(sink_pages) + ",recent_pages=" + std::to_string(recent_pages) +
         ",dense_layers=" + std::to_string(dense_layers) + ")";
}

float PageUpperBound(const float* bounds, int D, const float* q, int n_rows) {
  const float* mn = bounds;
  const float* mx = bounds + D;
  if (mn[0] > mx[0]) return -std::numeric_limits<float>::infinity();  // empty
  float best = -std::numeric_limits<float>::infinity();
  for (int r = 0; r < n_rows; ++r) {
    const float* qr = q + static_cast<size_t>(r) * D;
    float u = 0.0f;
    for (int c = 0; c < D; ++c) u += std::max(qr[c] * mn[c], qr[c] * mx[c]);
    best = std::max(best, u);
  }
  return best;
}

void SelectPages(const PageTable& t, const PageSelection& sel, int page_tokens, const float* q, int n_rows, int D,
                 std::vector<int>* out) {
  const int n = t.num_pages();
  const int budget = sel.PagesFor(page_tokens);
  out->clear();
  if (budget >= n) {
    out->resize(n);
    std::iota(out->begin(), out->end(), 0);
    return;
  }
  // Forced pages first: [0, sinks) and [n - recent, n).
  const int sinks = std::min(sel.sink_pages, n), recent_from = std::max(sinks, n - sel.recent_pages);
  thread_local std::vector<std::pair<float, int>> ranked;
  ranked.clear();
  for (int p = sinks; p < recent_from; ++p) ranked.emplace_back(PageUpperBound(t.bounds(p), D, q, n_rows), p);
  const int forced = sinks + (n - recent_from);
  const int take = std::clamp(budget - forced, 0, static_cast<int>(ranked.size()));
  // Highest bound first, ties by the lower page index (deterministic).
  auto better = [](const std::pair<float, int>& a, const std::pair<float, int>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  std::partial_sort(ranked.begin(), ranked.begin() + take, ranked.end(), better);
  for (int p = 0; p < sinks; ++p) out->push_back(p);
  for (int i = 0; i < take; ++i) out->push_back(ranked[i].second);
  for (int p = recent_from; p < n; ++p) out->push_back(p);
  std::sort(out->begin(), out->end());
}

}  // namespace kvx::kv
