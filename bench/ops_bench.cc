// Microbenchmarks of the ops/ kernels: MatMul per weight type on the shapes of
// a small llama-family model (hidden 576, FFN 1536: SmolLM-135M), for decode
// (1 token) and prefill (64 tokens), single-threaded and with a 2-thread pool;
// plus dequantization and the small nn kernels.
//
// Shapes are n_out x n_in. K-quants need n_in % 256 == 0, so for them the
// 576-wide inputs are skipped (llama.cpp also stores those tensors in a
// 32-block type) and the FFN-down shape 576x1536 is measured instead.
#include <benchmark/benchmark.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ops/dequant.h"
#include "ops/matmul.h"
#include "ops/nn.h"
#include "ops/quant_blocks.h"
#include "ops/quantize.h"
#include "util/thread_pool.h"

namespace kvx::ops {
namespace {

using gguf::TensorType;

std::vector<float> Gaussian(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<uint8_t> QuantizedMatrix(TensorType t, int64_t n_in, int64_t n_out) {
  const auto w = Gaussian(n_in * n_out, 1);
  const size_t rb = RowBytesOf(t, n_in);
  std::vector<uint8_t> bytes(rb * n_out);
  for (int64_t o = 0; o < n_out; ++o) QuantizeRow(t, w.data() + o * n_in, bytes.data() + o * rb, n_in);
  return bytes;
}

ThreadPool* Pool2() {
  static ThreadPool pool(2);
  return &pool;
}

void BM_MatMul(benchmark::State& state, TensorType t, int64_t n_out, int64_t n_in, int64_t n_tokens, int threads) {
  const auto bytes = QuantizedMatrix(t, n_in, n_out);
  const WeightView w{t, bytes.data(), n_in, n_out, RowBytesOf(t, n_in)};
  const auto x = Gaussian(n_in * n_tokens, 2);
  std::vector<float> y(n_out * n_tokens);
  ThreadPool* pool = threads > 1 ? Pool2() : nullptr;
  for (auto _ : state) {
    MatMul(w, x.data(), n_tokens, y.data(), pool);
    benchmark::DoNotOptimize(y.data());
  }
  const double flops = 2.0 * n_in * n_out * n_tokens;
  state.counters["GFLOPS"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes.size()));
}

void BM_Dequantize(benchmark::State& state, TensorType t) {
  const int64_t n = 4096;
  const auto bytes = QuantizedMatrix(t, n, 1);
  std::vector<float> y(n);
  for (auto _ : state) {
    DequantizeRow(t, bytes.data(), y.data(), n);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_Quantize(benchmark::State& state, TensorType t) {
  const int64_t n = 4096;
  const auto x = Gaussian(n, 3);
  std::vector<uint8_t> q(RowBytesOf(t, n));
  for (auto _ : state) {
    QuantizeRow(t, x.data(), q.data(), n);
    benchmark::DoNotOptimize(q.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void BM_RmsNorm(benchmark::State& state) {
  const auto x = Gaussian(576, 4), w = Gaussian(576, 5);
  std::vector<float> y(576);
  for (auto _ : state) {
    RmsNorm(x.data(), w.data(), 576, 1e-5f, y.data());
    benchmark::DoNotOptimize(y.data());
  }
}
BENCHMARK(BM_RmsNorm);

void BM_Rope(benchmark::State& state) {
  auto x = Gaussian(9 * 64, 6);
  RopeParams p{64, 10000.0f};
  int32_t pos = 0;
  for (auto _ : state) {
    Rope(x.data(), 9, 64, pos++ & 4095, p);
    benchmark::DoNotOptimize(x.data());
  }
}
BENCHMARK(BM_Rope);

void BM_Softmax(benchmark::State& state) {
  const auto src = Gaussian(state.range(0), 7);
  auto x = src;
  for (auto _ : state) {
    x = src;
    Softmax(x.data(), static_cast<int64_t>(x.size()));
    benchmark::DoNotOptimize(x.data());
  }
}
BENCHMARK(BM_Softmax)->Arg(1024)->Arg(8192);

int RegisterAll() {
  const TensorType types[] = {TensorType::kF32,  TensorType::kF16,  TensorType::kBF16, TensorType::kQ8_0,
                              TensorType::kQ4_0, TensorType::kQ4_K, TensorType::kQ5_K, TensorType::kQ6_K};
  struct Shape {
    int64_t n_out, n_in;
  };
  const Shape shapes[] = {{576, 576}, {1536, 576}, {576, 1536}};
  for (TensorType t : types) {
    const std::string name = TensorTypeName(t);
    for (const Shape& s : shapes) {
      if (s.n_in % GetBlockGeometry(t).block_size != 0) continue;
      for (int64_t n_tokens : {1, 64}) {
        for (int threads : {1, 2}) {
          const std::string bm = "MatMul/" + name + "/" + std::to_string(s.n_out) + "x" + std::to_string(s.n_in) +
                                 "/tok" + std::to_string(n_tokens) + "/thr" + std::to_string(threads);
          benchmark::RegisterBenchmark(bm.c_str(), BM_MatMul, t, s.n_out, s.n_in, n_tokens, threads)
              ->Unit(benchmark::kMicrosecond)
              ->UseRealTime();
        }
      }
    }
    benchmark::RegisterBenchmark(("Dequantize/" + name).c_str(), BM_Dequantize, t);
    benchmark::RegisterBenchmark(("Quantize/" + name).c_str(), BM_Quantize, t);
  }
  return 0;
}
const int kRegistered = RegisterAll();

}  // namespace
}  // namespace kvx::ops
