// Decode attention over the paged KV cache, one query token, for each page
// codec on 1 and 2 threads: BM_DecodeAttention (one layer, in cache, contexts
// 1k/4k/8k) and BM_DecodeAttentionAllLayers (a whole smollm2-135m-shaped
// cache, from DRAM). bytes_per_second counts the KV bytes read (each page is
// read once per GQA group). BM_F16DecodeKernel: the fused f16 kernel alone,
// for comparison with the whole attention. BM_PrefillAttention: a prompt's
// causal attention over itself (every query token at once, as a prefill batch).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "eval/roofline.h"
#include "kv/attention.h"
#include "kv/codec/f16_codec.h"
#include "kv/kv_spec.h"
#include "kv/sequence_kv.h"

namespace kvx::kv {
namespace {

// An empty cache of `layout` for `n_tokens` tokens with RoPE over head_dim
// (nullptr, and the benchmark skipped, when the pool cannot be made).
struct BenchCache {
  std::unique_ptr<BlockPool> pool;
  std::unique_ptr<SequenceKV> kv;
};
BenchCache MakeCache(benchmark::State& state, const KVSpec& spec, const KVLayout& layout, int n_tokens) {
  const uint64_t budget = BudgetForContext(layout, spec.codec, n_tokens);
  auto pool = BlockPool::Create({.budget_bytes = budget,
                                 .page_bytes = PageBytes(layout, spec.codec),
                                 .extent_bytes = ExtentBytesFor(layout, budget, 1)});
  if (!pool.ok()) {
    state.SkipWithError(pool.status().ToString().c_str());
    return {};
  }
  BenchCache c{std::move(pool).value(), nullptr};
  c.kv = std::make_unique<SequenceKV>(c.pool.get(), layout, spec.codec);
  ops::RopeParams rope{};
  rope.n_dims = layout.head_dim;
  c.kv->set_rope(rope);
  return c;
}

// One decode step's attention over every layer of an n_ctx-token cache:
// `layers` layers of `kv_heads` kv heads and `n_heads` query heads, head_dim
// 64, filled in 256-token chunks layer after layer as a forward pass appends.
// keep > 0: then every table keeps `keep` key channels (every other one
// first, as ThinK's mask is scattered) in all but its last 32 entries
// (SequenceKV::PruneKeyChannels: pruned pages, kv/pruned_keys.h).
void RunDecodeAttention(benchmark::State& state, const char* spec_text, int layers, int kv_heads, int n_heads,
                        int keep = 0) {
  const int n_ctx = static_cast<int>(state.range(0));
  const int threads = static_cast<int>(state.range(1));
  const KVSpec spec = *ParseKVSpec(spec_text);
  const int dim = 64;
  const KVLayout layout{layers, kv_heads, dim, spec.page_tokens};
  // Pruning writes each pruned page before it frees the page it replaces.
  BenchCache cache = MakeCache(state, spec, layout, keep > 0 ? 2 * n_ctx : n_ctx);
  if (cache.kv == nullptr) return;
  SequenceKV& kv = *cache.kv;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  const int chunk = 256;
  std::vector<float> k(static_cast<size_t>(chunk) * kv_heads * dim), v(k.size());
  std::vector<int32_t> pos(chunk);
  for (int start = 0; start < n_ctx; start += chunk) {
    const int n = std::min(chunk, n_ctx - start);
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    std::iota(pos.begin(), pos.end(), start);
    for (int l = 0; l < layers; ++l) {
      if (!kv.Append(l, n, pos.data(), k.data(), v.data()).ok()) {
        state.SkipWithError("append failed");
        return;
      }
    }
  }
  if (keep > 0) {
    std::vector<int> kept;
    for (int c = 0; c < dim && static_cast<int>(kept.size()) < keep; c += 2) kept.push_back(c);
    for (int c = 1; c < dim && static_cast<int>(kept.size()) < keep; c += 2) kept.push_back(c);
    std::sort(kept.begin(), kept.end());
    for (int l = 0; l < layers; ++l) {
      for (int h = 0; h < kv_heads; ++h) {
        const Status st = kv.PruneKeyChannels(l, h, kept, /*recent=*/32);
        if (!st.ok()) {
          state.SkipWithError(st.ToString().c_str());
          return;
        }
      }
    }
  }
  std::vector<float> q(static_cast<size_t>(n_heads) * dim), out(q.size());
  for (auto& x : q) x = nd(rng);
  const int32_t q_pos = n_ctx;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  std::unique_ptr<ThreadPool> tp = threads > 1 ? std::make_unique<ThreadPool>(threads) : nullptr;
  for (auto _ : state) {
    for (int l = 0; l < layers; ++l) Attention(kv, l, q.data(), &q_pos, 1, n_heads, scale, out.data(), tp.get());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(kv.BytesInUse()));
  state.counters["kv_bytes"] = static_cast<double>(kv.BytesInUse());
}

// One layer, 8 kv heads, 32 query heads: the cache (17 MB of f16 at 8k) is
// served from the last-level cache, so this measures the kernels.
void BM_DecodeAttention(benchmark::State& state, const char* spec_text) {
  RunDecodeAttention(state, spec_text, 1, 8, 32);
}

#define KVX_DECODE_BENCH(name, spec)                                                               \
  BENCHMARK_CAPTURE(BM_DecodeAttention, name, spec)                                               \
      ->ArgsProduct({{1024, 4096, 8192}, {1, 2}})                                                  \
      ->ArgNames({"ctx", "threads"})                                                               \
      ->Unit(benchmark::kMicrosecond)                                                              \
      ->UseRealTime()

KVX_DECODE_BENCH(f32, "codec=f32");
KVX_DECODE_BENCH(f16, "codec=f16");
KVX_DECODE_BENCH(int8, "codec=int8");
KVX_DECODE_BENCH(int4, "codec=int4");
KVX_DECODE_BENCH(int4_g64_rot, "codec=int4,group=64,rotate=hadamard");
KVX_DECODE_BENCH(kivi4_p128, "codec=kivi4,page=128,group=64");
KVX_DECODE_BENCH(kivi2_p128, "codec=kivi2,page=128,group=64");
KVX_DECODE_BENCH(f16_prerope, "codec=f16,prerope=1");
// kivi2's defaults: pre-RoPE keys in the Hadamard basis (kv/prerope_scores.h).
KVX_DECODE_BENCH(kivi2_default, "codec=kivi2");

// The whole cache of a smollm2-135m-shaped model (30 layers, 3 kv heads, 9
// query heads, head_dim 64): 8k tokens of f16 are ~180 MiB, far beyond the
// last-level cache, so this measures attention streaming from DRAM, as decode
// does, rather than from cache as BM_DecodeAttention does.
void BM_DecodeAttentionAllLayers(benchmark::State& state, const char* spec_text) {
  RunDecodeAttention(state, spec_text, 30, 3, 9);
}

#define KVX_DECODE_ALL_LAYERS_BENCH(name, spec)                                                    \
  BENCHMARK_CAPTURE(BM_DecodeAttentionAllLayers, name, spec)                                      \
      ->ArgsProduct({{512, 8192}, {1, 2}})                                                              \
      ->ArgNames({"ctx", "threads"})                                                               \
      ->Unit(benchmark::kMillisecond)                                                              \
      ->UseRealTime()

KVX_DECODE_ALL_LAYERS_BENCH(f16, "codec=f16");
KVX_DECODE_ALL_LAYERS_BENCH(f16_p64, "codec=f16,page=64");
KVX_DECODE_ALL_LAYERS_BENCH(int8, "codec=int8");
KVX_DECODE_ALL_LAYERS_BENCH(kivi4_p128, "codec=kivi4,page=128,group=64");

// The same cache with ThinK's pruned pages: 32 of 64 key channels kept
// (policy=think,lambda=0.5) and 20 (lambda=0.7, 24 stored rows: not a
// multiple of 16), in all but the last 32 entries of every table.
void BM_DecodeAttentionAllLayersPruned(benchmark::State& state, int keep) {
  RunDecodeAttention(state, "codec=f16", 30, 3, 9, keep);
}
BENCHMARK_CAPTURE(BM_DecodeAttentionAllLayersPruned, f16_keep32, 32)
    ->ArgsProduct({{512, 8192}, {1, 2}})
    ->ArgNames({"ctx", "threads"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_DecodeAttentionAllLayersPruned, f16_keep20, 20)
    ->ArgsProduct({{512, 8192}, {1, 2}})
    ->ArgNames({"ctx", "threads"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// A run of n_pages full f16 pages of one (layer, kv head), 16 entries of
// head_dim 64 each, consecutive in a BlockPool as a table's pages are, with
// positions 0, 1, ... and normal keys and values (seeded); empty (and the
// benchmark skipped) when the pool cannot be made.
struct F16Run {
  std::unique_ptr<BlockPool> pool;
  std::vector<const uint8_t*> pages;
  CodecParams params;
  size_t page_bytes = 0;
};
F16Run MakeF16Run(benchmark::State& state, int n_pages, uint32_t seed) {
  F16Run run;
  const KVLayout layout{1, 1, 64, 16};
  const int d = layout.head_dim, T = layout.page_tokens;
  run.params.page_tokens = T;
  run.params.head_dim = d;
  run.page_bytes = PageBytes(layout, CodecId::kF16);
  auto made = BlockPool::Create({.budget_bytes = run.page_bytes * n_pages, .page_bytes = run.page_bytes});
  if (!made.ok()) {
    state.SkipWithError(made.status().ToString().c_str());
    return {};
  }
  run.pool = std::move(made).value();
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> k(d), v(d);
  for (PageId prev = kNoPage; static_cast<int>(run.pages.size()) < n_pages;) {
    const Result<PageId> id = run.pool->AllocateAfter(0, prev);
    if (!id.ok()) {
      state.SkipWithError(id.status().ToString().c_str());
      return {};
    }
    prev = *id;
    uint8_t* page = run.pool->PageData(prev);
    for (int j = 0; j < T; ++j) {
      PagePositions(page)[j] = static_cast<int32_t>(run.pages.size()) * T + j;
      for (int c = 0; c < d; ++c) {
        k[c] = nd(rng);
        v[c] = nd(rng);
      }
      F16Codec::EncodeRow(run.params, page + PageDataOffset(T), j, k.data(), v.data());
    }
    run.pages.push_back(page);
  }
  if (!F16Codec::HasAttendRun(run.params)) {
    state.SkipWithError("the fused kernel does not run on this CPU");
    return {};
  }
  return run;
}

// The fused f16 decode kernel alone (F16Codec::AttendRun, one smollm2 GQA
// group of 3 query rows, head_dim 64) over one run of full 16-entry pages,
// consecutive in a BlockPool as a table's pages are, prefetched two pages
// ahead as in attention; each benchmark thread has its own pool
// and running state. 64 pages stay in L2; 46080 pages are the bytes of the
// 8k cache of BM_DecodeAttentionAllLayers. Set against that benchmark at the
// same bytes, the difference is what attention spends outside the kernel
// (page tables, work items, merges, thread sync, the pages' placement).
void BM_F16DecodeKernel(benchmark::State& state) {
  const int n_pages = static_cast<int>(state.range(0)) / state.threads();
  const F16Run run = MakeF16Run(state, n_pages, 1 + state.thread_index());
  if (run.pool == nullptr) return;
  const int rows = 3, d = run.params.head_dim, T = run.params.page_tokens;
  std::mt19937 rng(100 + state.thread_index());
  std::normal_distribution<float> nd;
  std::vector<float> q(static_cast<size_t>(rows) * d), acc(q.size());
  for (float& x : q) x = 0.125f * nd(rng);
  const int32_t qpos[rows] = {n_pages * T, n_pages * T, n_pages * T};  // sees every entry
  for (auto _ : state) {
    float mx[rows], sum[rows] = {};
    std::fill(mx, mx + rows, -INFINITY);
    std::fill(acc.begin(), acc.end(), 0.0f);
    F16Codec::AttendRun(run.params, run.pages.data(), n_pages, T, run.page_bytes, q.data(), qpos, rows, mx, sum,
                        acc.data(), nullptr, 0);
    benchmark::DoNotOptimize(acc.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * n_pages * static_cast<int64_t>(run.page_bytes));
}
BENCHMARK(BM_F16DecodeKernel)
    ->Arg(64)
    ->Arg(46080)
    ->ArgName("pages")
    ->Threads(1)
    ->Threads(2)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// ---- The attention kernels against the FMA peak (one thread, CPU time). ----
//
// Timed in the benchmark thread's CPU time (no UseRealTime: on a shared
// machine the wall clock also counts the time the thread waits for a core),
// with pct_peak against one thread's FMA peak measured the same way in this
// process (eval::MeasurePeakFlopsThreadCpu; KernelVsPeak/fma_peak is that
// probe). GFLOPS counts 4 head_dim flops (a score's and a value's
// multiply-adds) per (row, visible key): work a kernel spends on masked
// entries is not counted.
//   KernelVsPeak/decode/keys:K    one decode GQA group (smollm2: 3 query rows
//       of one token, head_dim 64) over the K keys of one (layer, kv head),
//       F16Codec::AttendRun over K / 16 pages (1024 keys: 260 KB, 4096: 1 MB,
//       both from L2 after the first pass): the kernel of a batched step at
//       depth K, per (sequence, layer, kv head).
//   KernelVsPeak/prompt/tokens:512   the causal attention of a 512-token
//       prompt for one kv head with the prompt kernel: its 512 x 3 rows
//       (query i's three heads, consecutive) in blocks of kMaxQueryRows, each
//       over the pages up to its last row, as attention.cc's row blocks.
double OneThreadFmaPeakGflops() {
  static const double peak = eval::MeasurePeakFlopsThreadCpu().gflops;
  return peak;
}

void SetKernelCounters(benchmark::State& state, double flops_per_iteration) {
  state.counters["GFLOPS"] = benchmark::Counter(flops_per_iteration * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["pct_peak"] = benchmark::Counter(100 * flops_per_iteration * 1e-9 / OneThreadFmaPeakGflops(),
                                                  benchmark::Counter::kIsIterationInvariantRate);
}

void BM_KernelVsPeakFma(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(OneThreadFmaPeakGflops());
  state.counters["GFLOPS"] = OneThreadFmaPeakGflops();
  state.counters["pct_peak"] = 100;
}
BENCHMARK(BM_KernelVsPeakFma)->Name("KernelVsPeak/fma_peak");

void BM_KernelVsPeakDecode(benchmark::State& state) {
  const int keys = static_cast<int>(state.range(0));
  const F16Run run = MakeF16Run(state, keys / 16, 1);
  if (run.pool == nullptr) return;
  const int rows = 3, d = run.params.head_dim, n_pages = static_cast<int>(run.pages.size());
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  std::vector<float> q(static_cast<size_t>(rows) * d), acc(q.size());
  for (float& x : q) x = 0.125f * nd(rng);
  const int32_t qpos[rows] = {keys, keys, keys};
  for (auto _ : state) {
    float mx[rows], sum[rows] = {};
    std::fill(mx, mx + rows, -INFINITY);
    std::fill(acc.begin(), acc.end(), 0.0f);
    F16Codec::AttendRun(run.params, run.pages.data(), n_pages, run.params.page_tokens, run.page_bytes, q.data(),
                        qpos, rows, mx, sum, acc.data(), nullptr, 0);
    benchmark::DoNotOptimize(acc.data());
  }
  SetKernelCounters(state, 4.0 * d * rows * keys);
}
BENCHMARK(BM_KernelVsPeakDecode)->Name("KernelVsPeak/decode")->ArgName("keys")->Arg(1024)->Arg(4096)->Unit(benchmark::kMicrosecond);

void BM_KernelVsPeakPrompt(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0)), G = 3;
  const F16Run run = MakeF16Run(state, (n + 15) / 16, 3);
  if (run.pool == nullptr) return;
  const int d = run.params.head_dim, T = run.params.page_tokens, rows = n * G;
  std::mt19937 rng(4);
  std::normal_distribution<float> nd;
  std::vector<float> q(static_cast<size_t>(rows) * d), acc(q.size());
  for (float& x : q) x = 0.125f * nd(rng);
  double flops = 0;
  for (int r = 0; r < rows; ++r) flops += 4.0 * d * (r / G + 1);
  for (auto _ : state) {
    for (int r0 = 0; r0 < rows; r0 += kMaxQueryRows) {
      const int nr = std::min(kMaxQueryRows, rows - r0);
      int32_t qpos[kMaxQueryRows];
      for (int r = 0; r < nr; ++r) qpos[r] = (r0 + r) / G;
      float mx[kMaxQueryRows], sum[kMaxQueryRows] = {};
      std::fill(mx, mx + nr, -INFINITY);
      float* a = acc.data() + static_cast<size_t>(r0) * d;
      std::fill(a, a + static_cast<size_t>(nr) * d, 0.0f);
      F16Codec::AttendRun(run.params, run.pages.data(), qpos[nr - 1] / T + 1, T, run.page_bytes,
                          q.data() + static_cast<size_t>(r0) * d, qpos, nr, mx, sum, a, nullptr, 0);
    }
    benchmark::DoNotOptimize(acc.data());
  }
  SetKernelCounters(state, flops);
}
BENCHMARK(BM_KernelVsPeakPrompt)->Name("KernelVsPeak/prompt")->ArgName("tokens")->Arg(512)->Unit(benchmark::kMicrosecond);

// A prefill batch's attention: n tokens appended to an empty cache of one
// smollm2-135m-shaped layer (3 kv heads, 9 query heads, head_dim 64), then
// every token attends to itself and those before it. GFLOPS counts the
// causal score and value products (4 d flops per visible query-key pair).
void BM_PrefillAttention(benchmark::State& state, const char* spec_text) {
  const int n = static_cast<int>(state.range(0));
  const int threads = static_cast<int>(state.range(1));
  const int kv_heads = 3, n_heads = 9, dim = 64;
  const KVSpec spec = *ParseKVSpec(spec_text);
  const KVLayout layout{1, kv_heads, dim, spec.page_tokens};
  BenchCache cache = MakeCache(state, spec, layout, n);
  if (cache.kv == nullptr) return;
  SequenceKV& kv = *cache.kv;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<float> k(static_cast<size_t>(n) * kv_heads * dim), v(k.size()), q(static_cast<size_t>(n) * n_heads * dim);
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  for (auto& x : q) x = nd(rng);
  std::vector<int32_t> pos(n);
  std::iota(pos.begin(), pos.end(), 0);
  if (!kv.Append(0, n, pos.data(), k.data(), v.data()).ok()) {
    state.SkipWithError("append failed");
    return;
  }
  std::vector<float> out(q.size());
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  std::unique_ptr<ThreadPool> tp = threads > 1 ? std::make_unique<ThreadPool>(threads) : nullptr;
  for (auto _ : state) {
    Attention(kv, 0, q.data(), pos.data(), n, n_heads, scale, out.data(), tp.get());
    benchmark::DoNotOptimize(out.data());
  }
  const double pairs = 0.5 * n * (n + 1.0) * n_heads;
  state.counters["GFLOPS"] = benchmark::Counter(pairs * 4 * dim * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

#define KVX_PREFILL_BENCH(name, spec)                                                              \
  BENCHMARK_CAPTURE(BM_PrefillAttention, name, spec)                                              \
      ->ArgsProduct({{512, 2048}, {1, 2}})                                                         \
      ->ArgNames({"tokens", "threads"})                                                            \
      ->Unit(benchmark::kMicrosecond)                                                              \
      ->UseRealTime()

KVX_PREFILL_BENCH(f16, "codec=f16");
KVX_PREFILL_BENCH(kivi4_p128, "codec=kivi4,page=128,group=64");

}  // namespace
}  // namespace kvx::kv
