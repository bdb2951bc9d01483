// Microbenchmarks of the ops/ kernels and the thread pool.
//
//   MatMul/<type>/<n_out>x<n_in>/tok<T>/thr<N>   one projection of SmolLM2-135M
//       (hidden 576, FFN 1536): decode (1 token) and prefill (64, 512 tokens),
//       1 and 2 threads. Counters: GFLOPS, bytes_per_second = weight bytes.
//   DecodeSweep/<type>/thr<N>   every matrix of the SmolLM2-135M stack once, as
//       one decoded token does (30 layers: QKV, O, gate+up, down; then the
//       49152x576 output head), with distinct weight buffers (~145 MB for
//       q8_0), so the weights stream from DRAM: bytes_per_second is the
//       kernels' effective weight bandwidth, to compare with MemRead.
//   PrefillGemm/<type>/thr<N>   the same layer stack for 512 tokens (GFLOPS).
//   StepGemm/<type>/rows<M>/thr<N>   the same stack for the M rows of one
//       batched engine step (M sequences decoding one token each; M = 1..64):
//       the small-M GEMMs of kvx bench --seqs. The weights stream from DRAM
//       once per step. pct_peak = GFLOPS against the int8 (quantized types)
//       or FMA (float types) peak that eval/roofline.h measures in this run
//       with as many threads; pct_peak_cpu (1 thread, quantized types) the
//       same in the thread's CPU time against one thread's int8 peak timed
//       in CPU time (what to judge the kernels by on a loaded machine).
//   StepAccount/q8_0_repacked/rows<M>   where a 2-thread step of M rows (the
//       stack and the head for every row) loses time against half its
//       1-thread CPU time: serial parts, 2-thread work inflation, and the
//       pool loops' late starts, claims, imbalance and joins (BM_StepAccount).
//   .../q8_0_repacked/...       the same with the Q8_0 matrices repacked as the
//       model loader stores them on AVX3_DL and AVX2 machines (ops/weight_pack.h).
//   MemRead / MemTriad          STREAM-like probes over 256 MiB arrays.
//   PeakFma                     f32 FMA peak of the active SIMD target.
//   ThreadPool/*                dispatch latency of empty parallel loops.
//   QuantizeActs, Dequantize, Quantize, RmsNorm, Rope, Softmax, SwiGLU.
//
// K-quants need n_in % 256 == 0, so for them the 576-wide inputs are skipped
// (llama.cpp also stores those tensors in a 32-block type).
// Kernels run on the best SIMD target of the CPU, or on the one named by the
// KVX_BENCH_TARGET environment variable (AVX3_DL, AVX2_VNNI, AVX2, SCALAR...); the
// context line "simd_target" says which.
#include <benchmark/benchmark.h>

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "eval/roofline.h"
#include "ops/dequant.h"
#include "ops/matmul.h"
#include "ops/matmul_internal.h"
#include "ops/nn.h"
#include "ops/quant_blocks.h"
#include "ops/quantize.h"
#include "ops/simd_target.h"
#include "ops/weight_pack.h"
#include "util/thread_pool.h"

namespace kvx::ops {
namespace {

using gguf::TensorType;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// CPU time of the calling thread (what it ran, not what it waited or was
// descheduled).
int64_t ThreadCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// The time this process's threads spent runnable but waiting for a CPU
// (/proc/self/task/*/schedstat, second field), summed: what a loaded machine's
// scheduler took from them. 0 where the kernel does not keep it.
int64_t RunDelayNs() {
  int64_t sum = 0;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream f(task.path() / "schedstat");
    int64_t cpu = 0, delay = 0;
    if (f >> cpu >> delay) sum += delay;
  }
  return sum;
}

std::vector<float> Gaussian(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

// A quantized n_out x n_in matrix. Large matrices repeat a 64-row quantized
// block (quantizing 100M+ weights with the k-quant search would take long);
// the bytes are still distinct memory.
std::vector<uint8_t> QuantizedMatrix(TensorType t, int64_t n_in, int64_t n_out, uint32_t seed = 1) {
  const int64_t base_rows = std::min<int64_t>(n_out, 64);
  const auto w = Gaussian(n_in * base_rows, seed);
  const size_t rb = RowBytesOf(t, n_in);
  std::vector<uint8_t> bytes(rb * n_out);
  for (int64_t o = 0; o < base_rows; ++o) QuantizeRow(t, w.data() + o * n_in, bytes.data() + o * rb, n_in);
  for (int64_t o = base_rows; o < n_out; ++o) std::memcpy(bytes.data() + o * rb, bytes.data() + (o % base_rows) * rb, rb);
  return bytes;
}

ThreadPool* Pool(int threads) {
  static ThreadPool pool2(2);
  return threads > 1 ? &pool2 : nullptr;
}

// KVX_BENCH_TARGET=AVX2 (etc.) restricts the kernels to that SIMD target.
void AddContext() {
  static bool done = false;
  if (!done) {
    if (const char* t = std::getenv("KVX_BENCH_TARGET"); t != nullptr && !ForceSimdTarget(t)) {
      std::fprintf(stderr, "KVX_BENCH_TARGET=%s is not available here\n", t);
      std::exit(1);
    }
    benchmark::AddCustomContext("simd_target", ActiveSimdTarget());
    done = true;
  }
}

// ---- single projections ----------------------------------------------------

void BM_MatMul(benchmark::State& state, TensorType t, int64_t n_out, int64_t n_in, int64_t n_tokens, int threads) {
  AddContext();
  const auto bytes = QuantizedMatrix(t, n_in, n_out);
  const WeightView w{t, bytes.data(), n_in, n_out, RowBytesOf(t, n_in)};
  const auto x = Gaussian(n_in * n_tokens, 2);
  std::vector<float> y(n_out * n_tokens);
  for (auto _ : state) {
    MatMul(w, x.data(), n_tokens, y.data(), Pool(threads));
    benchmark::DoNotOptimize(y.data());
  }
  const double flops = 2.0 * n_in * n_out * n_tokens;
  state.counters["GFLOPS"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes.size()));
}

// ---- the SmolLM2-135M stack ------------------------------------------------

struct Stack {
  static constexpr int kLayers = 30, kEmbd = 576, kFF = 1536, kQ = 576, kKV = 192, kVocab = 49152;
  struct Layer {
    WeightView q, k, v, o, gate, up, down;
  };
  TensorType type;
  bool repacked;  // Q8_0 matrices repacked as the model loader does (ops/weight_pack.h)
  std::vector<Layer> layers;
  WeightView head{};
  size_t bytes = 0;
  double matmul_flops_per_token = 0;  // excluding the head

  Stack(TensorType t, bool repack) : type(t), repacked(repack), layers(kLayers) {
    // K-quant rows of 576 are not possible: those matrices fall back to q8_0
    // (like llama.cpp's mixes), the FFN ones keep the type.
    const TensorType t576 = GetBlockGeometry(t).block_size > 32 ? TensorType::kQ8_0 : t;
    uint32_t seed = 1;
    for (Layer& l : layers) {
      l.q = Matrix(t576, kEmbd, kQ, seed++);
      l.k = Matrix(t576, kEmbd, kKV, seed++);
      l.v = Matrix(t576, kEmbd, kKV, seed++);
      l.o = Matrix(t576, kQ, kEmbd, seed++);
      l.gate = Matrix(t576, kEmbd, kFF, seed++);
      l.up = Matrix(t576, kEmbd, kFF, seed++);
      l.down = Matrix(t, kFF, kEmbd, seed++);
    }
    head = Matrix(t576, kEmbd, kVocab, seed);
    if (repacked) {
      // Repacked as the model loader does, into one buffer; only the copies stay in memory.
      std::vector<WeightView*> views = {&head};
      for (Layer& l : layers) {
        for (WeightView* m : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) views.push_back(m);
      }
      packed_ = PackedWeights::PackAll(views, [&](const void* data, size_t) {
        for (std::vector<uint8_t>& m : storage_) {
          if (m.data() == data) std::vector<uint8_t>().swap(m);
        }
      });
    }
    matmul_flops_per_token = 2.0 * kLayers * (kEmbd * (kQ + 2 * kKV) + kQ * kEmbd + 3.0 * kEmbd * kFF);
  }
  // The matmuls of a step by kind, for StepAccount: each kind's wall time
  // (its calls from entry to return) and its pool loops (ThreadPool::LoopStats).
  enum Kind { kQkv, kO, kGateUp, kDown, kHead, kKinds };
  struct KindTimes {
    int64_t wall_ns = 0;
    ThreadPool::LoopStats loops;
  };
  // One forward pass of n tokens through the matmuls (no attention/norms),
  // then the head for the last head_rows tokens. With `times` (and a pool),
  // each call is timed into times[its kind].
  void Run(int64_t n, int64_t head_rows, ThreadPool* pool, std::vector<float>* buf,
           KindTimes* times = nullptr) const {
    buf->resize(static_cast<size_t>(n) * (kEmbd + kQ + 2 * kKV + 2 * kFF) + static_cast<size_t>(head_rows) * kVocab);
    float* x = buf->data();
    float* q = x + n * kEmbd;
    float* k = q + n * kQ;
    float* v = k + n * kKV;
    float* g = v + n * kKV;
    float* u = g + n * kFF;
    float* logits = u + n * kFF;
    auto timed = [&](Kind kind, auto&& call) {
      if (times == nullptr || pool == nullptr) return call();
      pool->set_loop_stats(&times[kind].loops);
      const int64_t t0 = NowNs();
      call();
      times[kind].wall_ns += NowNs() - t0;
      pool->set_loop_stats(nullptr);
    };
    for (const Layer& l : layers) {
      const MatMulOutput qkv[] = {{l.q, q}, {l.k, k}, {l.v, v}};
      timed(kQkv, [&] { MatMulMulti(qkv, x, n, pool); });
      timed(kO, [&] { MatMul(l.o, q, n, x, pool); });
      const MatMulOutput gu[] = {{l.gate, g}, {l.up, u}};
      timed(kGateUp, [&] { MatMulMulti(gu, x, n, pool); });
      timed(kDown, [&] { MatMul(l.down, g, n, x, pool); });
    }
    if (head_rows > 0) timed(kHead, [&] { MatMul(head, x + (n - head_rows) * kEmbd, head_rows, logits, pool); });
  }

 private:
  WeightView Matrix(TensorType t, int64_t n_in, int64_t n_out, uint32_t seed) {
    std::vector<uint8_t>& m = storage_.emplace_back(QuantizedMatrix(t, n_in, n_out, seed));
    bytes += m.size();
    return WeightView{t, m.data(), n_in, n_out, RowBytesOf(t, n_in)};
  }
  std::deque<std::vector<uint8_t>> storage_;
  PackedWeights packed_;
};

const Stack& GetStack(TensorType t, bool repack) {
  static std::unique_ptr<Stack> cache;  // one stack alive at a time (they are large)
  if (cache == nullptr || cache->type != t || cache->repacked != repack) {
    cache.reset();
    cache = std::make_unique<Stack>(t, repack);
  }
  return *cache;
}

void BM_DecodeSweep(benchmark::State& state, TensorType t, bool repack, int threads) {
  AddContext();
  const Stack& s = GetStack(t, repack);
  std::vector<float> buf;
  s.Run(1, 1, Pool(threads), &buf);
  std::fill(buf.begin(), buf.end(), 0.01f);
  for (auto _ : state) {
    s.Run(1, 1, Pool(threads), &buf);
    benchmark::DoNotOptimize(buf.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * s.bytes));
  state.counters["tok/s"] = benchmark::Counter(1, benchmark::Counter::kIsIterationInvariantRate);
}

// The peak that bounds a matmul on `t`, measured once per thread count in
// this run (G ops/s; a multiply-add counts 2).
double MatmulPeakGops(TensorType t, int threads) {
  static std::map<std::pair<bool, int>, double> peaks;
  const bool int8 = eval::UsesInt8Dot(t);
  auto [it, fresh] = peaks.try_emplace({int8, threads}, 0.0);
  if (fresh) {
    ThreadPool* pool = Pool(threads);  // nullptr for one thread: the kernels' caller alone
    ThreadPool one(1);                 // the probes need a pool
    if (pool == nullptr) pool = &one;
    it->second = int8 ? eval::MeasurePeakInt8(pool).gops : eval::MeasurePeakFlops(pool).gflops;
  }
  return it->second;
}

// One thread's int8 peak in its own CPU time (G ops/s; best of 5 runs of the
// probe eval/roofline.h times in wall time), measured once: what a 1-thread
// kernel timed in CPU time divides by, which a thread descheduled on a loaded
// machine does not lower. 0 without an int8 dot product.
double ThreadCpuInt8PeakGops() {
  static const double peak = [] {
    const std::string isa = eval::Int8ProbeIsa();
    const int64_t macs = eval::Int8ProbeMacsPerIter(isa);
    if (macs == 0) return 0.0;
    constexpr long kIters = eval::kPeakProbeIters / 10;
    double best = 0;
    for (int rep = 0; rep < 5; ++rep) {
      const int64_t c0 = ThreadCpuNs();
      benchmark::DoNotOptimize(eval::RunInt8ProbeKernel(isa, kIters));
      best = std::max(best, 2.0 * static_cast<double>(macs) * kIters / static_cast<double>(ThreadCpuNs() - c0));
    }
    return best;
  }();
  return peak;
}

void BM_StackGemm(benchmark::State& state, TensorType t, bool repack, int threads, int64_t n) {
  AddContext();
  const Stack& s = GetStack(t, repack);
  std::vector<float> buf;
  s.Run(n, 0, Pool(threads), &buf);
  const auto x = Gaussian(n * Stack::kEmbd, 3);
  const int64_t cpu0 = ThreadCpuNs();
  for (auto _ : state) {
    std::copy(x.begin(), x.end(), buf.begin());  // keep the activations finite
    s.Run(n, 0, Pool(threads), &buf);
    benchmark::DoNotOptimize(buf.data());
  }
  const double cpu_ns = static_cast<double>(ThreadCpuNs() - cpu0);
  // pct_peak_cpu: one thread's ops per second of its CPU time against one
  // thread's int8 peak in CPU time (the figure to judge kernels by on a
  // shared machine, where the wall-clock pct_peak also measures the load).
  if (threads == 1 && eval::UsesInt8Dot(t) && ThreadCpuInt8PeakGops() > 0 && cpu_ns > 0) {
    const double ops = s.matmul_flops_per_token * static_cast<double>(n) * static_cast<double>(state.iterations());
    state.counters["pct_peak_cpu"] = benchmark::Counter(100 * ops / cpu_ns / ThreadCpuInt8PeakGops());
  }
  state.counters["GFLOPS"] =
      benchmark::Counter(s.matmul_flops_per_token * n * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
  const double peak = MatmulPeakGops(t, threads);
  if (peak > 0) {
    state.counters["pct_peak"] = benchmark::Counter(100 * s.matmul_flops_per_token * n * 1e-9 / peak,
                                                    benchmark::Counter::kIsIterationInvariantRate);
  }
}

// Where a 2-thread step's time goes beyond its kernels' work. Each
// iteration runs the step (the layer stack and the head for every row, as an
// engine step computes every sequence's logits) once on the calling thread
// alone, timed in thread CPU time (T1: the kernels' work and the activation
// quantization), and once on the 2-thread pool, timed in wall time (W2), with
// the pool's loops accounted (ThreadPool::LoopStats). With P = 2 threads,
//   W2 - T1/P = serial + work_2thr + (late + claims + imbalance + join) / P,
// every part in ms of the step's wall time:
//   serial     (P-1)/P of the caller's time outside the loops, when the other
//              thread waits: activation quantization and call setup (the
//              MatMul calls' time minus their loops');
//   work_2thr  (serial + thread time in chunks - T1) / P: what the same work
//              costs more on two threads (shared memory bandwidth, caches;
//              on a loaded machine also a thread descheduled inside a chunk);
//   late       threads waiting for their first chunk (wake-up), / P;
//   claims     between a thread's chunks, / P;
//   imbalance  threads done before the last one, / P;
//   join       the last chunk's end to the caller's return, / P.
// lost_<kind>: serial + idle time of one kind of matmul (no work_2thr), in ms.
// On a loaded machine a descheduled thread shows up in these parts (mostly
// late: the worker was not running when a loop began): sched_wait is the time
// the threads were runnable but waiting for a CPU during the 2-thread step
// (/proc schedstat), / P, and thr2_caller_cpu against thr2_wall says how much
// of the caller's time it did not run. thr1_wall, the 1-thread step's wall
// time under the same load, is what the second thread is to beat there.
void BM_StepAccount(benchmark::State& state, int64_t n) {
  AddContext();
  const Stack& s = GetStack(TensorType::kQ8_0, true);
  ThreadPool* pool = Pool(2);
  constexpr int kP = 2;
  std::vector<float> buf;
  const auto x = Gaussian(n * Stack::kEmbd, 3);
  Stack::KindTimes kinds[Stack::kKinds] = {};
  s.Run(n, n, pool, &buf);
  int64_t thr1_cpu = 0, thr1_wall = 0, thr2_wall = 0, thr2_caller_cpu = 0, thr2_run_delay = 0;
  for (auto _ : state) {
    std::copy(x.begin(), x.end(), buf.begin());  // keep the activations finite
    int64_t c0 = ThreadCpuNs();
    const int64_t w1 = NowNs();
    s.Run(n, n, nullptr, &buf);
    thr1_wall += NowNs() - w1;
    thr1_cpu += ThreadCpuNs() - c0;
    std::copy(x.begin(), x.end(), buf.begin());
    const int64_t d0 = RunDelayNs();
    c0 = ThreadCpuNs();
    const int64_t w0 = NowNs();
    s.Run(n, n, pool, &buf, kinds);
    thr2_wall += NowNs() - w0;
    thr2_caller_cpu += ThreadCpuNs() - c0;
    thr2_run_delay += RunDelayNs() - d0;
    benchmark::DoNotOptimize(buf.data());
  }
  ThreadPool::LoopStats all;
  for (const Stack::KindTimes& k : kinds) all.Add(k.loops);
  const int64_t serial = thr2_wall - all.wall_ns;  // the caller alone: in the calls and between them
  auto ms = [&](double total_ns) {  // per step
    return benchmark::Counter(total_ns * 1e-6, benchmark::Counter::kAvgIterations);
  };
  state.counters["thr1_cpu"] = ms(thr1_cpu);
  state.counters["thr1_wall"] = ms(thr1_wall);
  state.counters["thr2_wall"] = ms(thr2_wall);
  state.counters["thr2_caller_cpu"] = ms(thr2_caller_cpu);
  state.counters["pct_ideal"] = benchmark::Counter(100.0 * thr1_cpu / kP / std::max<int64_t>(thr2_wall, 1));
  state.counters["loops"] = benchmark::Counter(static_cast<double>(all.loops), benchmark::Counter::kAvgIterations);
  state.counters["serial"] = ms(serial * (kP - 1.0) / kP);
  state.counters["work_2thr"] = ms((serial + all.busy_ns - thr1_cpu) / double{kP});
  state.counters["late"] = ms(all.late_ns / double{kP});
  state.counters["claims"] = ms(all.claims_ns / double{kP});
  state.counters["imbalance"] = ms(all.imbalance_ns / double{kP});
  state.counters["join"] = ms(all.join_ns / double{kP});
  state.counters["sched_wait"] = ms(thr2_run_delay / double{kP});
  const char* names[Stack::kKinds] = {"qkv", "o", "gateup", "down", "head"};
  for (int k = 0; k < Stack::kKinds; ++k) {
    const Stack::KindTimes& t = kinds[k];
    const double idle = kP * t.loops.wall_ns - t.loops.busy_ns;
    state.counters[std::string("lost_") + names[k]] = ms((t.wall_ns - t.loops.wall_ns) * (kP - 1.0) / kP + idle / kP);
  }
}

// ---- machine probes ----------------------------------------------------------

__attribute__((target("avx2"))) float SumRange(const float* a, size_t b, size_t e) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  size_t i = b;
  for (; i + 32 <= e; i += 32) {
    for (int j = 0; j < 4; ++j) acc[j] = _mm256_add_ps(acc[j], _mm256_loadu_ps(a + i + 8 * j));
  }
  float tmp[8];
  _mm256_storeu_ps(tmp, _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  float s = 0;
  for (float f : tmp) s += f;
  for (; i < e; ++i) s += a[i];
  return s;
}

void BM_MemRead(benchmark::State& state, int threads) {
  const size_t n = (size_t{256} << 20) / sizeof(float);
  std::vector<float> a(n, 1.0f);
  std::vector<float> sums(2);
  for (auto _ : state) {
    auto body = [&](size_t b, size_t e, int t) { sums[t] += SumRange(a.data(), b, e); };
    if (threads > 1) {
      Pool(threads)->ParallelFor(n, body);
    } else {
      body(0, n, 0);
    }
    benchmark::DoNotOptimize(sums.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * sizeof(float)));
}

void BM_MemTriad(benchmark::State& state, int threads) {
  const size_t n = (size_t{256} << 20) / sizeof(float);
  std::vector<float> a(n, 0.0f), b(n, 1.0f), c(n, 2.0f);
  for (auto _ : state) {
    auto body = [&](size_t lo, size_t hi, int) {
      for (size_t i = lo; i < hi; ++i) a[i] = b[i] + 0.5f * c[i];
    };
    if (threads > 1) {
      Pool(threads)->ParallelFor(n, body);
    } else {
      body(0, n, 0);
    }
    benchmark::DoNotOptimize(a.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 3 * n * sizeof(float)));
}

__attribute__((target("avx512f"))) float FmaChains(int64_t iters) {
  __m512 acc[12];
  for (int c = 0; c < 12; ++c) acc[c] = _mm512_set1_ps(0.001f * c);
  const __m512 m = _mm512_set1_ps(0.9999f), add = _mm512_set1_ps(1e-4f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < 12; ++c) acc[c] = _mm512_fmadd_ps(acc[c], m, add);
  }
  __m512 s = acc[0];
  for (int c = 1; c < 12; ++c) s = _mm512_add_ps(s, acc[c]);
  // Not _mm512_reduce_add_ps: with GCC 12 its extract intrinsics trip
  // -Wuninitialized (GCC PR105593).
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  float sum = 0.0f;
  for (float x : lanes) sum += x;
  return sum;
}

void BM_PeakFma(benchmark::State& state, int threads) {
  if (!__builtin_cpu_supports("avx512f")) {
    state.SkipWithError("needs AVX-512");
    return;
  }
  const int64_t iters = 1 << 20;
  std::vector<float> sink(2);
  for (auto _ : state) {
    if (threads > 1) {
      Pool(threads)->ParallelFor(2, [&](size_t b, size_t, int) { sink[b] = FmaChains(iters); });
    } else {
      sink[0] = FmaChains(iters);
    }
    benchmark::DoNotOptimize(sink.data());
  }
  state.counters["GFLOPS"] =
      benchmark::Counter(2.0 * 12 * 16 * iters * threads * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// ---- thread pool ---------------------------------------------------------------

void BM_ThreadPoolStatic(benchmark::State& state) {
  ThreadPool& pool = *Pool(2);
  std::vector<int64_t> out(64);
  for (auto _ : state) {
    pool.ParallelFor(64, [&](size_t b, size_t e, int) {
      for (size_t i = b; i < e; ++i) out[i] += 1;
    });
  }
  benchmark::DoNotOptimize(out.data());
}
BENCHMARK(BM_ThreadPoolStatic)->UseRealTime();

// 64 indices in claims of `grain` (grain 1: attention's one item per claim).
void BM_ThreadPoolDynamic(benchmark::State& state) {
  ThreadPool& pool = *Pool(2);
  const size_t grain = static_cast<size_t>(state.range(0));
  std::vector<int64_t> out(64);
  for (auto _ : state) {
    pool.ParallelForDynamic(64, grain, [&](size_t b, size_t e, int) {
      for (size_t i = b; i < e; ++i) out[i] += 1;
    });
  }
  benchmark::DoNotOptimize(out.data());
}
BENCHMARK(BM_ThreadPoolDynamic)->ArgName("grain")->Arg(1)->Arg(8)->UseRealTime();

// ---- small kernels ----------------------------------------------------------------

void BM_QuantizeActs(benchmark::State& state) {
  AddContext();
  const int64_t k = 1536, n = state.range(0);
  const auto x = Gaussian(k * n, 3);
  internal::ScratchBuffer buf;
  auto a = internal::LayoutQuantizedActs(buf.Get(internal::QuantizedActsBytes(n, k)), n, k);
  for (auto _ : state) {
    internal::QuantizeActsBest(x.data(), 0, n, &a);
    benchmark::DoNotOptimize(a.q);
  }
  state.SetItemsProcessed(state.iterations() * n * k);
}
BENCHMARK(BM_QuantizeActs)->Arg(1)->Arg(64);

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
  AddContext();
  const auto x = Gaussian(576, 4), w = Gaussian(576, 5);
  std::vector<float> y(576);
  for (auto _ : state) {
    RmsNorm(x.data(), w.data(), 576, 1e-5f, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * 576);
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
  AddContext();
  const auto src = Gaussian(state.range(0), 7);
  auto x = src;
  for (auto _ : state) {
    x = src;
    Softmax(x.data(), static_cast<int64_t>(x.size()));
    benchmark::DoNotOptimize(x.data());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_Softmax)->Arg(1024)->Arg(8192);

void BM_SwiGLU(benchmark::State& state) {
  AddContext();
  const int64_t n = state.range(0);
  const auto g = Gaussian(n, 8), u = Gaussian(n, 9);
  std::vector<float> out(n);
  for (auto _ : state) {
    SwiGLU(g.data(), u.data(), n, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_SwiGLU)->Arg(1536)->Arg(1536 * 64);

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
      for (int64_t n_tokens : {1, 64, 512}) {
        for (int threads : {1, 2}) {
          const std::string bm = "MatMul/" + name + "/" + std::to_string(s.n_out) + "x" + std::to_string(s.n_in) +
                                 "/tok" + std::to_string(n_tokens) + "/thr" + std::to_string(threads);
          benchmark::RegisterBenchmark(bm.c_str(), BM_MatMul, t, s.n_out, s.n_in, n_tokens, threads)
              ->Unit(benchmark::kMicrosecond)
              ->UseRealTime();
        }
      }
    }
    // Q8_0 also repacked, as the model loader stores it when the AVX3_DL kernels run.
    for (bool repack : {false, true}) {
      if (repack && t != TensorType::kQ8_0) continue;
      const std::string sweep = name + (repack ? "_repacked" : "");
      for (int threads : {1, 2}) {
        const std::string thr = "/thr" + std::to_string(threads);
        benchmark::RegisterBenchmark(("DecodeSweep/" + sweep + thr).c_str(), BM_DecodeSweep, t, repack, threads)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
        benchmark::RegisterBenchmark(("PrefillGemm/" + sweep + thr).c_str(), BM_StackGemm, t, repack, threads, 512)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
        // The batched step's rows, for the types the models use (the
        // smollm2 shape in q8_0, repacked; the recall model in f16).
        if (!repack && t != TensorType::kF16) continue;
        for (int64_t rows : {1, 2, 4, 8, 16, 32, 64}) {
          const std::string bm = "StepGemm/" + sweep + "/rows" + std::to_string(rows) + thr;
          benchmark::RegisterBenchmark(bm.c_str(), BM_StackGemm, t, repack, threads, rows)
              ->Unit(benchmark::kMillisecond)
              ->UseRealTime();
          if (repack && threads == 2) {
            benchmark::RegisterBenchmark(("StepAccount/" + sweep + "/rows" + std::to_string(rows)).c_str(),
                                         BM_StepAccount, rows)
                ->Unit(benchmark::kMillisecond)
                ->UseRealTime();
          }
        }
      }
    }
    benchmark::RegisterBenchmark(("Dequantize/" + name).c_str(), BM_Dequantize, t);
    benchmark::RegisterBenchmark(("Quantize/" + name).c_str(), BM_Quantize, t);
  }
  for (int threads : {1, 2}) {
    const std::string thr = "/thr" + std::to_string(threads);
    benchmark::RegisterBenchmark(("MemRead" + thr).c_str(), BM_MemRead, threads)->UseRealTime();
    benchmark::RegisterBenchmark(("MemTriad" + thr).c_str(), BM_MemTriad, threads)->UseRealTime();
    benchmark::RegisterBenchmark(("PeakFma" + thr).c_str(), BM_PeakFma, threads)->UseRealTime();
  }
  return 0;
}
const int kRegistered = RegisterAll();

}  // namespace
}  // namespace kvx::ops
