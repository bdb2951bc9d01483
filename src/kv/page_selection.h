// Quest page selection (Tang et al., 2024, "Quest: Query-Aware Sparsity for
// Efficient Long-Context LLM Inference"): at decode, each kv head reads only
// the pages whose upper bound on q.k is highest, instead of all of them. No
// entry is evicted: the memory held is the same, the bytes read per token
// fall with the number of pages selected.
//
// Bound. Each page keeps the per-channel min mn[c] and max mx[c] of its keys
// as stored (PageTable bounds, maintained by SequenceKV for every codec: the
// keys are decoded after they are encoded, so the bound holds for what
// attention will really read). For a query q and any key k of the page,
//     q . k = sum_c q[c] k[c] <= sum_c max(q[c] mn[c], q[c] mx[c]) = U(page),
// since q[c] k[c] is linear in k[c] in [mn[c], mx[c]].
// GQA: the G query heads of a group share their pages (a page is read once
// per group, attention.h), so a kv head's page score is the max over its
// query heads' bounds (METHODS.md B11's "max" reduction: a page any query
// head may need is kept).
//
// Selection (per kv head, per decode query): the first `sink_pages` pages
// and the last `recent_pages` pages are always read (the attention sink and
// the page being written), and so is a sealed codec's uncompressed tail
// (its f16 staging and residual pages, kPageFull) without counting against
// the budget; the other pages are ranked by U, ties broken by the lower
// page index, and the best fill the budget. Prompts (more than one
// query per sequence in a call) and the first `dense_layers` layers attend
// densely, as the reference does (q_len > 1 or layer_id < 2).
//
// Thread-safety: pure functions over const inputs.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "kv/page_table.h"
#include "util/status.h"

namespace kvx::kv {

struct PageSelection {
  bool enabled = false;
  // Pages read per kv head and decode step, forced pages included: `pages`
  // when > 0, else budget_tokens / page_tokens (at least 1).
  int pages = 0;
  int budget_tokens = 1024;
  int sink_pages = 1;
  int recent_pages = 1;
  int dense_layers = 2;

  int PagesFor(int page_tokens) const { return pages > 0 ? pages : std::max(1, budget_tokens / page_tokens); }
  bool operator==(const PageSelection&) const = default;
  std::string ToString() const;
};

// Whether `sel` can run on keys stored as described: Quest's bound needs the
// post-RoPE keys attention dots with (not prerope=1), and a budget that
// covers the pages it always reads. The one check behind both the policy's
// refusal when the manager is made and SequenceKV::SetPageSelection's guard.
Status CheckPageSelection(const PageSelection& sel, bool pre_rope_keys, int page_tokens);

// U(page) for the `n_rows` queries q (rows of D floats, in the keys' basis),
// max over the rows. -inf for a page with empty bounds. The scalar
// reference of PageUpperBounds.
float PageUpperBound(const float* bounds, int D, const float* q, int n_rows);

// out[i] = U(page i) for n_pages consecutive pages' bounds (bounds + i * 2D,
// the layout of PageTable's bounds), max over the n_rows query rows. Vectorized when the CPU allows (AVX2/FMA, D % 8 == 0): with
// max(q mn, q mx) = max(q, 0) mx + min(q, 0) mn, two FMAs per 8 channels,
// summed in lanes; so equal to PageUpperBound up to rounding (exactly equal
// when every product and sum is exact). The selection was scalar and ran
// before the attention items: at 8k context on smollm2-135m it took longer
// than reading the pages it saved (kvx bench decode at 0.54x f16's tok/s).
void PageUpperBounds(const float* bounds, int n_pages, int D, const float* q, int n_rows, float* out);

// How many pages SelectPages picks from table `t` (the visit count, known
// before the scores): all of them when the budget covers them, else the
// budget (at least the forced pages) plus the uncompressed tail beyond the
// recent pages.
int SelectedPageCount(const PageTable& t, const PageSelection& sel, int page_tokens);

// Pages of table `t` one decode query of the group reads, ascending
// (SelectedPageCount of them). Reads all pages (0..n-1) when the budget
// covers them. No allocation once `out` and the thread's scratch have grown.
// REQUIRES: t.bounds_dim() == D.
void SelectPages(const PageTable& t, const PageSelection& sel, int page_tokens, const float* q, int n_rows, int D,
                 std::vector<int>* out);

}  // namespace kvx::kv
