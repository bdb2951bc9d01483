#include "kv/page_selection.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "kv/codec/simd_x86.h"

namespace kvx::kv {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A page with empty bounds (no live key was ever in it) bounds nothing.
bool EmptyBounds(const float* bounds, int D) { return bounds[0] > bounds[D]; }

#ifdef KVX_KV_HAVE_X86_SIMD
// simd_x86.h's features (checked by simd::UseSimd); its attribute macro ends
// with that header.
#define KVX_BOUNDS_AVX2 __attribute__((target(KVX_KV_AVX2_FEATURES)))

// max over R rows of sum_c qpos[r][c] mx[c] + qneg[r][c] mn[c]: the page's
// mn and mx are loaded once for the R rows (the bounds are what streams from
// memory), two accumulators per row so the FMAs of a row overlap.
template <int R>
KVX_BOUNDS_AVX2 float MaxBoundOfRowsAvx2(const float* mn, const float* mx, const float* qpos, const float* qneg, int D) {
  __m256 a[R], b[R];
  for (int r = 0; r < R; ++r) a[r] = b[r] = _mm256_setzero_ps();
  for (int c = 0; c < D; c += 8) {
    const __m256 lo = _mm256_loadu_ps(mn + c), hi = _mm256_loadu_ps(mx + c);
    _Pragma("GCC unroll 4")
    for (int r = 0; r < R; ++r) {
      a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(qpos + static_cast<size_t>(r) * D + c), hi, a[r]);
      b[r] = _mm256_fmadd_ps(_mm256_loadu_ps(qneg + static_cast<size_t>(r) * D + c), lo, b[r]);
    }
  }
  float best = kNegInf;
  for (int r = 0; r < R; ++r) best = std::max(best, simd::HorizontalSum(_mm256_add_ps(a[r], b[r])));
  return best;
}

// PageUpperBounds on AVX2/FMA, the queries split by sign (qpos, qneg: [n_rows][D]).
KVX_BOUNDS_AVX2 void PageUpperBoundsAvx2(const float* bounds, int n_pages, int D, const float* qpos, const float* qneg,
                                         int n_rows, float* out) {
  for (int i = 0; i < n_pages; ++i) {
    const float* mn = bounds + static_cast<size_t>(i) * 2 * D;
    const float* mx = mn + D;
    if (EmptyBounds(mn, D)) {
      out[i] = kNegInf;
      continue;
    }
    float best = kNegInf;
    for (int r0 = 0; r0 < n_rows; r0 += 4) {
      const float* qp = qpos + static_cast<size_t>(r0) * D;
      const float* qn = qneg + static_cast<size_t>(r0) * D;
      float u;
      switch (std::min(4, n_rows - r0)) {
        case 1: u = MaxBoundOfRowsAvx2<1>(mn, mx, qp, qn, D); break;
        case 2: u = MaxBoundOfRowsAvx2<2>(mn, mx, qp, qn, D); break;
        case 3: u = MaxBoundOfRowsAvx2<3>(mn, mx, qp, qn, D); break;
        default: u = MaxBoundOfRowsAvx2<4>(mn, mx, qp, qn, D); break;
      }
      best = std::max(best, u);
    }
    out[i] = best;
  }
}
#undef KVX_BOUNDS_AVX2
#endif

}  // namespace

Status CheckPageSelection(const PageSelection& sel, bool pre_rope_keys, int page_tokens) {
  if (!sel.enabled) return Status::Ok();
  if (pre_rope_keys) {
    return InvalidArgument("Quest page selection needs post-RoPE keys: the stored pre-RoPE keys are not what "
                           "attention dots with; drop prerope=1 or the quest policy");
  }
  if (sel.PagesFor(page_tokens) < sel.sink_pages + sel.recent_pages) {
    return InvalidArgument("Quest selection " + sel.ToString() + " reads fewer pages than it forces " +
                           "(sink_pages + recent_pages); raise the budget");
  }
  return Status::Ok();
}

std::string PageSelection::ToString() const {
  return "quest(" + (pages > 0 ? "pages=" + std::to_string(pages) : "budget=" + std::to_string(budget_tokens)) +
         ",sink_pages=" + std::to_string(sink_pages) + ",recent_pages=" + std::to_string(recent_pages) +
         ",dense_layers=" + std::to_string(dense_layers) + ")";
}

float PageUpperBound(const float* bounds, int D, const float* q, int n_rows) {
  const float* mn = bounds;
  const float* mx = bounds + D;
  if (EmptyBounds(bounds, D)) return kNegInf;
  float best = kNegInf;
  for (int r = 0; r < n_rows; ++r) {
    const float* qr = q + static_cast<size_t>(r) * D;
    float u = 0.0f;
    for (int c = 0; c < D; ++c) u += std::max(qr[c] * mn[c], qr[c] * mx[c]);
    best = std::max(best, u);
  }
  return best;
}

void PageUpperBounds(const float* bounds, int n_pages, int D, const float* q, int n_rows, float* out) {
#ifdef KVX_KV_HAVE_X86_SIMD
  if (simd::UseSimd(D)) {
    // q[c] k[c] <= max(q mn, q mx) = max(q, 0) mx[c] + min(q, 0) mn[c] (one term is 0).
    thread_local std::vector<float> split;
    const size_t n = static_cast<size_t>(n_rows) * D;
    split.resize(2 * n);
    for (size_t i = 0; i < n; ++i) {
      split[i] = std::max(q[i], 0.0f);
      split[n + i] = std::min(q[i], 0.0f);
    }
    return PageUpperBoundsAvx2(bounds, n_pages, D, split.data(), split.data() + n, n_rows, out);
  }
#endif
  for (int i = 0; i < n_pages; ++i) out[i] = PageUpperBound(bounds + static_cast<size_t>(i) * 2 * D, D, q, n_rows);
}

namespace {

// The pages always read: [0, sinks) and [recent_from, n), the last
// `recent_pages` and, before them, the uncompressed tail (the f16 staging
// and residual pages of a sealed codec, kPageFull): Quest ranks the
// compressed pages only, so its budget never caps what the codec keeps
// exact. `take`: the ranked pages the budget reads, which the sinks and
// recent pages count against but the rest of the tail does not.
struct Forced {
  int sinks, recent_from, take;
};
Forced ForcedPages(const PageTable& t, const PageSelection& sel, int page_tokens) {
  const int n = t.num_pages();
  Forced f;
  f.sinks = std::min(sel.sink_pages, n);
  const int recent = std::max(f.sinks, n - sel.recent_pages);
  f.recent_from = recent;
  while (f.recent_from > f.sinks && t.format(f.recent_from - 1) == kPageFull) --f.recent_from;
  f.take = std::clamp(sel.PagesFor(page_tokens) - f.sinks - (n - recent), 0, f.recent_from - f.sinks);
  return f;
}

}  // namespace

int SelectedPageCount(const PageTable& t, const PageSelection& sel, int page_tokens) {
  const int n = t.num_pages();
  if (sel.PagesFor(page_tokens) >= n) return n;
  const Forced f = ForcedPages(t, sel, page_tokens);
  return f.sinks + f.take + (n - f.recent_from);
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
  // Forced pages first: [0, sinks) and [recent_from, n) (ForcedPages).
  const Forced f = ForcedPages(t, sel, page_tokens);
  const int sinks = f.sinks, recent_from = f.recent_from, take = f.take;
  const int n_ranked = recent_from - sinks;
  thread_local std::vector<float> scores;
  thread_local std::vector<std::pair<float, int>> ranked;
  scores.resize(n_ranked);
  if (n_ranked > 0) PageUpperBounds(t.bounds(sinks), n_ranked, D, q, n_rows, scores.data());
  ranked.resize(n_ranked);
  for (int i = 0; i < n_ranked; ++i) ranked[i] = {scores[i], sinks + i};
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
