// Decode attention over the paged KV cache: one query token, 8 kv heads,
// 32 query heads (GQA 4), head_dim 64, context 1k/4k/8k tokens, f32 vs f16
// pages, single thread. Reports KV bytes read per second.
#include <benchmark/benchmark.h>

#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "kv/attention.h"
#include "kv/sequence_kv.h"

namespace kvx::kv {
namespace {

void BM_DecodeAttention(benchmark::State& state, CodecId codec) {
  const int n_ctx = static_cast<int>(state.range(0));
  const int kv_heads = 8, n_heads = 32, dim = 64;
  const KVLayout layout{1, kv_heads, dim, 16};
  auto pool = BlockPool::Create({.budget_bytes = BudgetForContext(layout, codec, n_ctx),
                                 .page_bytes = PageBytes(layout, codec)});
  if (!pool.ok()) {
    state.SkipWithError(pool.status().ToString().c_str());
    return;
  }
  SequenceKV kv(pool->get(), layout, codec);
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
    if (!kv.Append(0, n, pos.data(), k.data(), v.data()).ok()) {
      state.SkipWithError("append failed");
      return;
    }
  }
  std::vector<float> q(static_cast<size_t>(n_heads) * dim), out(q.size());
  for (auto& x : q) x = nd(rng);
  const int32_t q_pos = n_ctx;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  for (auto _ : state) {
    Attention(kv, 0, q.data(), &q_pos, 1, n_heads, scale, out.data(), nullptr);
    benchmark::DoNotOptimize(out.data());
  }
  // Each query head reads its kv head's pages once.
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * n_heads / kv_heads *
                          static_cast<int64_t>(kv.BytesInUse()));
  state.counters["kv_bytes"] = static_cast<double>(kv.BytesInUse());
}

BENCHMARK_CAPTURE(BM_DecodeAttention, f32, CodecId::kF32)->Arg(1024)->Arg(4096)->Arg(8192)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_DecodeAttention, f16, CodecId::kF16)->Arg(1024)->Arg(4096)->Arg(8192)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvx::kv
