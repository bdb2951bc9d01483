// Quest page selection (kv/page_selection.h): decode attention over a whole
// smollm2-135m-shaped cache (30 layers, 3 kv heads, 9 query heads, head_dim
// 64, 8k tokens of f16: ~180 MiB, streamed from DRAM) reading the top
// `budget` tokens' pages of each kv head, against the same cache read whole
// (budget 0). Every layer is selected (dense_layers=0) so the bytes read
// scale with the budget alone. Counters: kv_bytes (memory held, the same for
// every budget), read_bytes (pages read + bounds scanned per decode token).
#include <benchmark/benchmark.h>

#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "kv/attention.h"
#include "kv/kv_spec.h"
#include "kv/page_selection.h"
#include "kv/sequence_kv.h"

namespace kvx::kv {
namespace {

void BM_QuestDecodeAllLayers(benchmark::State& state, const char* spec_text) {
  const int budget = static_cast<int>(state.range(0)), threads = static_cast<int>(state.range(1));
  const int n_ctx = 8192, layers = 30, kv_heads = 3, n_heads = 9, dim = 64;
  const KVSpec spec = *ParseKVSpec(spec_text);
  const KVLayout layout{layers, kv_heads, dim, spec.page_tokens};
  const uint64_t bytes = BudgetForContext(layout, spec.codec, n_ctx);
  auto pool = BlockPool::Create(
      {.budget_bytes = bytes, .page_bytes = PageBytes(layout, spec.codec), .extent_bytes = ExtentBytesFor(layout, bytes, 1)});
  if (!pool.ok()) {
    state.SkipWithError(pool.status().ToString().c_str());
    return;
  }
  SequenceKV kv(pool->get(), layout, spec.codec);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  const int chunk = 256;
  std::vector<float> k(static_cast<size_t>(chunk) * kv_heads * dim), v(k.size());
  std::vector<int32_t> pos(chunk);
  for (int start = 0; start < n_ctx; start += chunk) {
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    std::iota(pos.begin(), pos.end(), start);
    for (int l = 0; l < layers; ++l) {
      if (!kv.Append(l, chunk, pos.data(), k.data(), v.data()).ok()) return state.SkipWithError("append failed");
    }
  }
  PageSelection sel;
  sel.enabled = budget > 0;
  sel.budget_tokens = std::max(budget, 1);
  sel.dense_layers = 0;
  if (!kv.SetPageSelection(sel).ok()) return state.SkipWithError("selection rejected");
  std::vector<float> q(static_cast<size_t>(n_heads) * dim), out(q.size());
  for (auto& x : q) x = nd(rng);
  const int32_t q_pos = n_ctx;
  std::unique_ptr<ThreadPool> tp = threads > 1 ? std::make_unique<ThreadPool>(threads) : nullptr;
  for (auto _ : state) {
    for (int l = 0; l < layers; ++l) Attention(kv, l, q.data(), &q_pos, 1, n_heads, 0.125f, out.data(), tp.get());
    benchmark::DoNotOptimize(out.data());
  }
  // Bytes one decode token reads: the selected pages, plus every page's bounds when selecting.
  const size_t page = pool->get()->PageBytesOf(kv.table(0, 0).pages()[0]);
  const int n_pages = kv.table(0, 0).num_pages();
  const int read_pages = sel.enabled ? std::min(n_pages, sel.PagesFor(layout.page_tokens)) : n_pages;
  const double read = static_cast<double>(layers) * kv_heads *
                      (static_cast<double>(read_pages) * page + (sel.enabled ? n_pages * 2.0 * dim * sizeof(float) : 0));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * read));
  state.counters["kv_bytes"] = static_cast<double>(kv.BytesInUse());
  state.counters["read_bytes"] = read;
}

BENCHMARK_CAPTURE(BM_QuestDecodeAllLayers, f16, "codec=f16")
    ->ArgsProduct({{0, 4096, 2048, 1024, 512, 256}, {1, 2}})
    ->ArgNames({"budget", "threads"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace kvx::kv
