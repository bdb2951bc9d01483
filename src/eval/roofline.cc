#include "eval/roofline.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "util/cpu_features.h"

#if defined(__x86_64__) || defined(__i386__)
#define KVX_ROOFLINE_X86 1
#include <immintrin.h>
#include "util/clock.h"
#else
#define KVX_ROOFLINE_X86 0
#endif

namespace kvx::eval {

namespace {

// Each probe is compiled with one of these strings and runs only when the CPU
// has every feature it names (util/cpu_features.h).
#define KVX_AVX512 "avx512f"
#define KVX_AVX2 "avx2"
#define KVX_AVX2_FMA "avx2,fma"
#define KVX_AVX512_VNNI "avx512f,avx512vnni"
#define KVX_AVX_VNNI "avx2,avxvnni"
#define KVX_PROBE(features) __attribute__((target(features)))
[[maybe_unused]] bool Runs(const char* features) { return util::MissingCpuFeatures(features).empty(); }

struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float[], AlignedFree>;

// On 2 MiB transparent huge pages, as the model loader stores the weights
// (ops/weight_pack.h): on 4 KiB pages the probe also pays the TLB walks that
// decode does not, read slower than decode streams, and decode showed above
// 100% of its bound.
Buffer Allocate(size_t n_floats) {
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t bytes = (n_floats * sizeof(float) + kHugePage - 1) / kHugePage * kHugePage;
  void* p = std::aligned_alloc(kHugePage, bytes);
  if (p != nullptr) (void)madvise(p, bytes, MADV_HUGEPAGE);
  return Buffer(static_cast<float*>(p));
}

// Reads [b, e) with independent accumulators so the adds never stall the
// loads. The widest loads the CPU has: one core of a 2-core EPYC reads ~40
// GB/s with 512-bit loads but only ~18 GB/s with the baseline SSE2 ones, so a
// narrow probe understates the bound and decode shows above 100% of it.
float SumRangeScalar(const float* x, size_t b, size_t e) {
  float acc[16] = {};
  size_t i = b;
  for (; i + 16 <= e; i += 16) {
    for (int j = 0; j < 16; ++j) acc[j] += x[i + j];
  }
  for (; i < e; ++i) acc[0] += x[i];
  float s = 0;
  for (float a : acc) s += a;
  return s;
}

#if KVX_ROOFLINE_X86
KVX_PROBE(KVX_AVX512) float SumRangeAvx512(const float* x, size_t b, size_t e) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = b;
  for (; i + 64 <= e; i += 64) {
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(x + i));
    a1 = _mm512_add_ps(a1, _mm512_loadu_ps(x + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_loadu_ps(x + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_loadu_ps(x + i + 48));
  }
  // Not _mm512_reduce_add_ps: with GCC 12 its extract intrinsics trip
  // -Wuninitialized (GCC PR105593).
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  float s = SumRangeScalar(x, i, e);
  for (float l : lanes) s += l;
  return s;
}

KVX_PROBE(KVX_AVX2) float SumRangeAvx2(const float* x, size_t b, size_t e) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = b;
  for (; i + 32 <= e; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(x + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(x + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(x + i + 24));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  float s = SumRangeScalar(x, i, e);
  for (float l : lanes) s += l;
  return s;
}
#endif

// a[i] = b[i] + s c[i] over [lo, hi), also with the widest vectors (mixing a
// wide read probe with a baseline-SSE triad made the triad 4x slower).
void TriadRangeScalar(float* a, const float* b, const float* c, float s, size_t lo, size_t hi) {
  for (size_t i = lo; i < hi; ++i) a[i] = b[i] + s * c[i];
}

#if KVX_ROOFLINE_X86
KVX_PROBE(KVX_AVX512) void TriadRangeAvx512(float* a, const float* b, const float* c, float s, size_t lo,
                                                         size_t hi) {
  const __m512 sv = _mm512_set1_ps(s);
  size_t i = lo;
  for (; i + 16 <= hi; i += 16) {
    _mm512_storeu_ps(a + i, _mm512_fmadd_ps(sv, _mm512_loadu_ps(c + i), _mm512_loadu_ps(b + i)));
  }
  TriadRangeScalar(a, b, c, s, i, hi);
}

KVX_PROBE(KVX_AVX2_FMA) void TriadRangeAvx2(float* a, const float* b, const float* c, float s, size_t lo,
                                                        size_t hi) {
  const __m256 sv = _mm256_set1_ps(s);
  size_t i = lo;
  for (; i + 8 <= hi; i += 8) {
    _mm256_storeu_ps(a + i, _mm256_fmadd_ps(sv, _mm256_loadu_ps(c + i), _mm256_loadu_ps(b + i)));
  }
  TriadRangeScalar(a, b, c, s, i, hi);
}
#endif

void TriadRange(float* a, const float* b, const float* c, float s, size_t lo, size_t hi) {
#if KVX_ROOFLINE_X86
  if (Runs(KVX_AVX512)) return TriadRangeAvx512(a, b, c, s, lo, hi);
  if (Runs(KVX_AVX2_FMA)) return TriadRangeAvx2(a, b, c, s, lo, hi);
#endif
  TriadRangeScalar(a, b, c, s, lo, hi);
}

float SumRange(const float* x, size_t b, size_t e) {
#if KVX_ROOFLINE_X86
  if (Runs(KVX_AVX512)) return SumRangeAvx512(x, b, e);
  if (Runs(KVX_AVX2)) return SumRangeAvx2(x, b, e);
#endif
  return SumRangeScalar(x, b, e);
}

// One pass of every thread summing its share of x[0, n): GB/s read.
double ReadPassGbps(ThreadPool* pool, const float* x, size_t n, float* sink) {
  std::vector<float> sums(pool->size(), 0);
  const double t0 = util::MonotonicSeconds();
  pool->ParallelFor(n, [&](size_t lo, size_t hi, int t) { sums[t] += SumRange(x, lo, hi); });
  const double secs = util::MonotonicSeconds() - t0;
  for (float v : sums) *sink += v;
  return n * sizeof(float) / secs / 1e9;
}

}  // namespace

BandwidthResult MeasureBandwidth(ThreadPool* pool, size_t bytes, int passes) {
  const size_t n = bytes / sizeof(float);
  Buffer a = Allocate(n), b = Allocate(n), c = Allocate(n);
  // First touch from the pool's threads, as the benchmark data would be.
  pool->ParallelFor(n, [&](size_t lo, size_t hi, int) {
    for (size_t i = lo; i < hi; ++i) {
      // Distinct contents per page: a hypervisor may merge identical pages,
      // and reading one shared page would measure the cache, not memory.
      a[i] = 0;
      b[i] = static_cast<float>(i % 4093);
      c[i] = static_cast<float>(i % 4091);
    }
  });
  BandwidthResult r;
  r.bytes = bytes;
  float sink = 0;
  for (int p = 0; p < passes; ++p) {
    r.read_gbps = std::max(r.read_gbps, ReadPassGbps(pool, b.get(), n, &sink));
    const float s = 0.5f + sink * 0.0f;
    const double t1 = util::MonotonicSeconds();
    pool->ParallelFor(n, [&](size_t lo, size_t hi, int) {
      TriadRange(a.get(), b.get(), c.get(), s, lo, hi);
    });
    const double t2 = util::MonotonicSeconds();
    r.triad_gbps = std::max(r.triad_gbps, 3.0 * bytes / (t2 - t1) / 1e9);
  }
  volatile float keep = a[n / 2] + sink;
  (void)keep;
  return r;
}

double MeasureStreamReadGbps(ThreadPool* pool, size_t bytes, int passes) {
  const size_t n = std::max<size_t>(bytes / sizeof(float), 1);
  Buffer x = Allocate(n);
  pool->ParallelFor(n, [&](size_t lo, size_t hi, int) {
    for (size_t i = lo; i < hi; ++i) x[i] = static_cast<float>(i % 4093);  // distinct pages, as above
  });
  float sink = 0;
  ReadPassGbps(pool, x.get(), n, &sink);  // the first pass finds the caches holding other data
  double best = 0;
  for (int p = 0; p < passes; ++p) best = std::max(best, ReadPassGbps(pool, x.get(), n, &sink));
  volatile float keep = sink;
  (void)keep;
  return best;
}

namespace {

// Runs fn(iters) once on every thread of the pool, three times, and returns
// the best rate in ops/s given the ops one call performs.
template <class R>
double BestRate(ThreadPool* pool, R (*fn)(long), long iters, double ops_per_call) {
  const int threads = pool->size();
  std::vector<R> sink(threads);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const double t0 = util::MonotonicSeconds();
    pool->ParallelFor(threads, [&](size_t lo, size_t hi, int) {
      for (size_t t = lo; t < hi; ++t) sink[t] = fn(iters);
    });
    const double secs = util::MonotonicSeconds() - t0;
    best = std::max(best, ops_per_call * threads / secs);
  }
  volatile R keep = sink[0];
  (void)keep;
  return best;
}

// kChains independent FMA chains of vector width W floats: each iteration is
// kChains FMAs of W lanes = 2 * kChains * W FLOPs. Explicit FMA intrinsics,
// since ISO C++ mode does not contract a*b+c into an FMA. The chain loop must
// be unrolled so the accumulators live in registers: otherwise each FMA
// round-trips its accumulator through the stack and the probe measures
// store-to-load forwarding instead (under a fifth of the real peak on an
// AVX-512 Zen core).
constexpr int kChains = 12;

#if KVX_ROOFLINE_X86
KVX_PROBE(KVX_AVX512) float FmaAvx512(long iters) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(1.0f + c);
  const __m512 m = _mm512_set1_ps(0.999999f), add = _mm512_set1_ps(1e-7f);
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], m, add);
  }
  float out[16], s = 0;
  for (int c = 0; c < kChains; ++c) {
    _mm512_storeu_ps(out, acc[c]);
    s += out[0];
  }
  return s;
}

KVX_PROBE(KVX_AVX2_FMA) float FmaAvx2(long iters) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(1.0f + c);
  const __m256 m = _mm256_set1_ps(0.999999f), add = _mm256_set1_ps(1e-7f);
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], m, add);
  }
  float out[8], s = 0;
  for (int c = 0; c < kChains; ++c) {
    _mm256_storeu_ps(out, acc[c]);
    s += out[0];
  }
  return s;
}

// SSE2 has no FMA: a multiply and an add count as the same 2 FLOPs.
float FmaSse(long iters) {
  __m128 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm_set1_ps(1.0f + c);
  const __m128 m = _mm_set1_ps(0.999999f), add = _mm_set1_ps(1e-7f);
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = _mm_add_ps(_mm_mul_ps(acc[c], m), add);
  }
  float out[4], s = 0;
  for (int c = 0; c < kChains; ++c) {
    _mm_storeu_ps(out, acc[c]);
    s += out[0];
  }
  return s;
}
#endif  // KVX_ROOFLINE_X86

// Portable fallback: scalar chains (a multiply and an add, 2 FLOPs).
float FmaScalar(long iters) {
  float acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = 1.0f + c;
  const float m = 0.999999f, add = 1e-7f;
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = acc[c] * m + add;
  }
  float s = 0;
  for (float a : acc) s += a;
  return s;
}

// Int8 dot-product chains. Every chain accumulates int32 lanes; each lane
// adds 4 products u8 * s8 per iteration (vpdpbusd, or pmaddubsw's pairs
// summed by pmaddwd), with u = 3, s = -2 so every product is
// kInt8ProbeProduct and the lane sums stay exact: |6 * 4 * iters| < 2^31 for
// iters <= kPeakProbeIters.
//
// The loop bodies are inline asm on named register variables: with
// intrinsics, gcc keeps accumulator arrays partly on the stack or copies them
// between registers every iteration, and hoists pmaddubsw/pmaddwd (whose
// inputs do not change) out of the loop, leaving only the adds. The asm
// operands tie each chain to its own register, so the loop is exactly the
// counted instructions plus the loop counter.
constexpr int kVnniChains = 12;  // vpdpbusd: latency ~5 cycles x 2 ports
constexpr int kAvx2Chains = 8;   // the products do not depend on the chain; only vpaddd does
constexpr uint8_t kU = 3;
constexpr int8_t kS = -2;
static_assert(kU * kS == kInt8ProbeProduct);

int64_t SumLanes(const int32_t* lanes, int n) {
  int64_t s = 0;
  for (int i = 0; i < n; ++i) s += lanes[i];
  return s;
}

#if KVX_ROOFLINE_X86
// X(i) for the chains; KVX_R*: all but chain 0 (for comma-separated lists).
#define KVX_R7(X) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define KVX_R11(X) KVX_R7(X) X(8) X(9) X(10) X(11)
#define KVX_X8(X) X(0) KVX_R7(X)
#define KVX_X12(X) X(0) KVX_R11(X)

// AVX-512 VNNI: vpdpbusd zmm, 16 lanes x 4 = 64 MACs per instruction.
KVX_PROBE(KVX_AVX512_VNNI) int64_t DotAvx512Vnni(long iters) {
#define KVX_DECL(i) __m512i a##i = _mm512_setzero_si512();
#define KVX_STEP(i) "vpdpbusd %[s], %[u], %[a" #i "]\n\t"
#define KVX_OUT(i) , [a##i] "+v"(a##i)
#define KVX_STORE(i) _mm512_storeu_si512(out[i], a##i);
  KVX_X12(KVX_DECL)
  const __m512i u = _mm512_set1_epi8(static_cast<char>(kU)), s = _mm512_set1_epi8(kS);
  for (long i = 0; i < iters; ++i) {
    asm(KVX_X12(KVX_STEP) : [a0] "+v"(a0) KVX_R11(KVX_OUT) : [u] "v"(u), [s] "v"(s));
  }
  int32_t out[kVnniChains][16];
  KVX_X12(KVX_STORE)
#undef KVX_DECL
#undef KVX_STEP
#undef KVX_OUT
#undef KVX_STORE
  return SumLanes(&out[0][0], kVnniChains * 16);
}

// AVX-VNNI (VEX-encoded vpdpbusd): ymm, 8 lanes x 4 = 32 MACs per instruction.
KVX_PROBE(KVX_AVX_VNNI) int64_t DotAvxVnni(long iters) {
#define KVX_DECL(i) __m256i a##i = _mm256_setzero_si256();
#define KVX_STEP(i) "%{vex%} vpdpbusd %[s], %[u], %[a" #i "]\n\t"
#define KVX_OUT(i) , [a##i] "+x"(a##i)
#define KVX_STORE(i) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[i]), a##i);
  KVX_X12(KVX_DECL)
  const __m256i u = _mm256_set1_epi8(static_cast<char>(kU)), s = _mm256_set1_epi8(kS);
  for (long i = 0; i < iters; ++i) {
    asm(KVX_X12(KVX_STEP) : [a0] "+x"(a0) KVX_R11(KVX_OUT) : [u] "x"(u), [s] "x"(s));
  }
  int32_t out[kVnniChains][8];
  KVX_X12(KVX_STORE)
#undef KVX_DECL
#undef KVX_STEP
#undef KVX_OUT
#undef KVX_STORE
  return SumLanes(&out[0][0], kVnniChains * 8);
}

// AVX2: vpmaddubsw (32 u8*s8 products summed in pairs to int16) + vpmaddwd
// by ones (pairs to int32) + vpaddd: 32 MACs per sequence, the way ops/'s
// AVX2 kernels (and llama.cpp's) compute int8 dots.
KVX_PROBE(KVX_AVX2) int64_t DotAvx2(long iters) {
#define KVX_DECL(i) __m256i a##i = _mm256_setzero_si256();
#define KVX_STEP(i)                  \
  "vpmaddubsw %[s], %[u], %[t]\n\t"  \
  "vpmaddwd %[ones], %[t], %[t]\n\t" \
  "vpaddd %[t], %[a" #i "], %[a" #i "]\n\t"
#define KVX_OUT(i) , [a##i] "+x"(a##i)
#define KVX_STORE(i) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[i]), a##i);
  KVX_X8(KVX_DECL)
  const __m256i u = _mm256_set1_epi8(static_cast<char>(kU)), s = _mm256_set1_epi8(kS),
                ones = _mm256_set1_epi16(1);
  for (long i = 0; i < iters; ++i) {
    __m256i t;
    asm(KVX_X8(KVX_STEP) : [t] "=&x"(t) KVX_X8(KVX_OUT) : [u] "x"(u), [s] "x"(s), [ones] "x"(ones));
  }
  int32_t out[kAvx2Chains][8];
  KVX_X8(KVX_STORE)
#undef KVX_DECL
#undef KVX_STEP
#undef KVX_OUT
#undef KVX_STORE
  return SumLanes(&out[0][0], kAvx2Chains * 8);
}
#undef KVX_X12
#undef KVX_X8
#undef KVX_R11
#undef KVX_R7
#endif  // KVX_ROOFLINE_X86

struct Int8Kernel {
  int64_t (*fn)(long) = nullptr;
  int64_t macs_per_iter = 0;
};

Int8Kernel Int8KernelFor(const std::string& isa) {
#if KVX_ROOFLINE_X86
  if (isa == "avx512vnni") return {DotAvx512Vnni, int64_t{kVnniChains} * 64};
  if (isa == "avxvnni") return {DotAvxVnni, int64_t{kVnniChains} * 32};
  if (isa == "avx2") return {DotAvx2, int64_t{kAvx2Chains} * 32};
#else
  (void)isa;
#endif
  return {};
}

}  // namespace

namespace {

// The FMA probe of the widest vectors this CPU runs.
struct FlopsProbe {
  float (*fn)(long) = FmaScalar;
  int width = 1;
  const char* isa = "scalar";
};
FlopsProbe ChooseFlopsProbe() {
#if KVX_ROOFLINE_X86
  if (Runs(KVX_AVX512)) return {FmaAvx512, 16, "avx512"};
  if (Runs(KVX_AVX2_FMA)) return {FmaAvx2, 8, "avx2"};
  return {FmaSse, 4, "sse2"};
#else
  return {};
#endif
}

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

PeakFlopsResult MeasurePeakFlops(ThreadPool* pool, long iters) {
  const FlopsProbe probe = ChooseFlopsProbe();
  const double flops = 2.0 * kChains * probe.width * static_cast<double>(iters);
  return {BestRate(pool, probe.fn, iters, flops) / 1e9, probe.isa};
}

PeakFlopsResult MeasurePeakFlopsThreadCpu(long iters, int reps) {
  const FlopsProbe probe = ChooseFlopsProbe();
  const double flops = 2.0 * kChains * probe.width * static_cast<double>(iters);
  double best = 0;
  float sink = 0;
  for (int rep = 0; rep < reps; ++rep) {
    const double t0 = ThreadCpuSeconds();
    sink += probe.fn(iters);
    best = std::max(best, flops / (ThreadCpuSeconds() - t0));
  }
  volatile float keep = sink;
  (void)keep;
  return {best / 1e9, probe.isa};
}

bool UsesInt8Dot(gguf::TensorType type) {
  using T = gguf::TensorType;
  return type == T::kQ8_0 || type == T::kQ4_0 || type == T::kQ4_K || type == T::kQ5_K || type == T::kQ6_K;
}

std::vector<std::string> Int8ProbeIsas() {
  std::vector<std::string> isas;
#if KVX_ROOFLINE_X86
  if (Runs(KVX_AVX512_VNNI)) isas.push_back("avx512vnni");
  if (Runs(KVX_AVX_VNNI)) isas.push_back("avxvnni");
  if (Runs(KVX_AVX2)) isas.push_back("avx2");
#endif
  return isas;
}

std::string Int8ProbeIsa() {
  const std::vector<std::string> isas = Int8ProbeIsas();
  return isas.empty() ? "none" : isas.front();
}

int64_t Int8ProbeMacsPerIter(const std::string& isa) { return Int8KernelFor(isa).macs_per_iter; }

int64_t RunInt8ProbeKernel(const std::string& isa, long iters) {
  const Int8Kernel k = Int8KernelFor(isa);
  return k.fn == nullptr ? 0 : k.fn(iters);
}

PeakInt8Result MeasurePeakInt8(ThreadPool* pool, long iters) {
  PeakInt8Result r;
  r.isa = Int8ProbeIsa();
  const Int8Kernel k = Int8KernelFor(r.isa);
  if (k.fn == nullptr) return r;
  const double ops = 2.0 * static_cast<double>(k.macs_per_iter) * static_cast<double>(iters);
  r.gops = BestRate(pool, k.fn, iters, ops) / 1e9;
  return r;
}

double MeasureDiskWriteGbps(const std::string& dir, size_t bytes) {
  std::string path = dir + "/kvx_disk_probe_XXXXXX";
  const int fd = ::mkstemp(path.data());
  if (fd < 0) return 0;
  std::vector<char> block(size_t{1} << 20, 1);
  const double t0 = util::MonotonicSeconds();
  size_t written = 0;
  while (written < bytes) {
    const ssize_t n = ::write(fd, block.data(), block.size());
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  ::fsync(fd);
  const double secs = util::MonotonicSeconds() - t0;
  ::close(fd);
  ::unlink(path.c_str());
  return written == 0 ? 0 : written / secs / 1e9;
}

}  // namespace kvx::eval
