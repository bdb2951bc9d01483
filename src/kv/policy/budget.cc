#include "kv/policy/budget.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kvx::kv {

std::vector<int> ProportionalShares(const std::vector<double>& weights, int64_t total, const std::vector<int>& cap) {
  const size_t n = weights.size();
  std::vector<int> out(n, 0);
  std::vector<uint8_t> open(n, 1);
  int64_t left = std::min<int64_t>(total, std::accumulate(cap.begin(), cap.end(), int64_t{0}));
  // Water-filling: give shares to the uncapped, cap those that overflow, repeat.
  while (left > 0) {
    double wsum = 0.0;
    int n_open = 0;
    for (size_t i = 0; i < n; ++i) {
      if (open[i]) wsum += weights[i], ++n_open;
    }
    if (n_open == 0) break;
    std::vector<double> want(n, 0.0);
    bool capped = false;
    for (size_t i = 0; i < n; ++i) {
      if (!open[i]) continue;
      want[i] = wsum > 0.0 ? left * weights[i] / wsum : static_cast<double>(left) / n_open;
      if (out[i] + want[i] >= cap[i]) {
        left -= cap[i] - out[i];
        out[i] = cap[i];
        open[i] = 0;
        capped = true;
      }
    }
    if (capped) continue;
    // No cap hit: floor, then the remainder to the largest fractions.
    std::vector<std::pair<double, size_t>> frac;
    int64_t given = 0;
    for (size_t i = 0; i < n; ++i) {
      if (!open[i]) continue;
      const int64_t f = static_cast<int64_t>(std::floor(want[i]));
      out[i] += static_cast<int>(f);
      given += f;
      frac.emplace_back(want[i] - f, i);
    }
    std::sort(frac.begin(), frac.end(), [](auto& a, auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
    int64_t rest = left - given;
    for (size_t k = 0; rest > 0 && k < frac.size(); ++k) {
      if (out[frac[k].second] < cap[frac[k].second]) ++out[frac[k].second], --rest;
    }
    left = rest;
    if (rest > 0) {  // the remainder hit caps: close the capped ones and go on
      for (size_t i = 0; i < n; ++i) {
        if (out[i] >= cap[i]) open[i] = 0;
      }
    }
  }
  return out;
}

std::vector<int> PyramidBudgets(int n_layers, int capacity, int n, int w, double beta) {
  const int L = n_layers;
  if (n <= capacity) return std::vector<int>(L, n);
  const double scored = capacity - w;  // C - w
  if (L == 1 || n < 2 * scored) return std::vector<int>(L, capacity);
  double mn = scored / beta, mx = 2 * scored - mn;
  if (mx >= n - w) {
    mx = n - w;
    mn = 2 * scored - mx;
  }
  const double step = (mx - mn) / (L - 1);
  std::vector<double> weights(L);
  for (int l = 0; l < L; ++l) weights[l] = mx - l * step;
  std::vector<int> cap(L, n - w);
  std::vector<int> out = ProportionalShares(weights, static_cast<int64_t>(L) * (capacity - w), cap);
  for (int& b : out) b += w;
  return out;
}

std::vector<int> PreferenceBudgets(const std::vector<double>& preference, int capacity, int n, int w) {
  const int L = static_cast<int>(preference.size());
  if (n <= capacity) return std::vector<int>(L, n);
  std::vector<int> cap(L, n - w);
  std::vector<int> out = ProportionalShares(preference, static_cast<int64_t>(L) * (capacity - w), cap);
  for (int& b : out) b += w;
  return out;
}

std::vector<std::vector<uint8_t>> SelectKept(const std::vector<std::vector<float>>& scores,
                                             const std::vector<std::vector<int32_t>>& positions,
                                             const std::vector<int>& keep, bool adaptive, double alpha) {
  const size_t H = scores.size();
  std::vector<std::vector<uint8_t>> kept(H);
  auto better = [](float sa, int32_t pa, float sb, int32_t pb) { return sa != sb ? sa > sb : pa > pb; };
  // Each head's candidates ranked best first.
  std::vector<std::vector<int>> order(H);
  for (size_t h = 0; h < H; ++h) {
    kept[h].assign(scores[h].size(), 0);
    order[h].resize(scores[h].size());
    std::iota(order[h].begin(), order[h].end(), 0);
    std::sort(order[h].begin(), order[h].end(), [&](int a, int b) {
      return better(scores[h][a], positions[h][a], scores[h][b], positions[h][b]);
    });
  }
  if (!adaptive) {
    for (size_t h = 0; h < H; ++h) {
      const size_t k = std::min<size_t>(std::max(keep[h], 0), order[h].size());
      for (size_t i = 0; i < k; ++i) kept[h][order[h][i]] = 1;
    }
    return kept;
  }
  // Ada-KV: the safeguard floor per head, then the global best of the rest.
  int64_t total = 0;
  struct Cand {
    float s;
    int32_t p;
    int h, i;
  };
  std::vector<Cand> rest;
  for (size_t h = 0; h < H; ++h) {
    total += std::max(keep[h], 0);
    const size_t floor_h = std::min<size_t>(static_cast<size_t>(std::floor(alpha * std::max(keep[h], 0))), order[h].size());
    for (size_t i = 0; i < order[h].size(); ++i) {
      const int c = order[h][i];
      if (i < floor_h) {
        kept[h][c] = 1;
        --total;
      } else {
        rest.push_back({scores[h][c], positions[h][c], static_cast<int>(h), c});
      }
    }
  }
  std::sort(rest.begin(), rest.end(), [&](const Cand& a, const Cand& b) {
    if (a.s != b.s || a.p != b.p) return better(a.s, a.p, b.s, b.p);
    return a.h < b.h;
  });
  for (size_t i = 0; i < rest.size() && static_cast<int64_t>(i) < total; ++i) kept[rest[i].h][rest[i].i] = 1;
  return kept;
}

}  // namespace kvx::kv
