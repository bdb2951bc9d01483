#include "eval/roofline.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include <immintrin.h>

namespace kvx::eval {

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float[], AlignedFree>;

Buffer Allocate(size_t n_floats) {
  void* p = std::aligned_alloc(64, (n_floats * sizeof(float) + 63) / 64 * 64);
  return Buffer(static_cast<float*>(p));
}

// Reads [b, e) with 8 independent accumulators so the adds never stall the
// loads; the compiler vectorises this for the baseline ISA, which is enough
// to saturate memory.
float SumRange(const float* x, size_t b, size_t e) {
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

}  // namespace

BandwidthResult MeasureBandwidth(ThreadPool* pool, size_t bytes, int passes) {
  const size_t n = bytes / sizeof(float);
  Buffer a = Allocate(n), b = Allocate(n), c = Allocate(n);
  // First touch from the pool's threads, as the benchmark data would be.
  pool->ParallelFor(n, [&](size_t lo, size_t hi, int) {
    for (size_t i = lo; i < hi; ++i) {
      a[i] = 0;
      b[i] = 1.0f;
      c[i] = 2.0f;
    }
  });
  BandwidthResult r;
  r.bytes = bytes;
  std::vector<float> sink(pool->size(), 0);
  for (int p = 0; p < passes; ++p) {
    const double t0 = Now();
    pool->ParallelFor(n, [&](size_t lo, size_t hi, int t) { sink[t] += SumRange(b.get(), lo, hi); });
    const double t1 = Now();
    r.read_gbps = std::max(r.read_gbps, bytes / (t1 - t0) / 1e9);
    const float s = 0.5f + sink[0] * 0.0f;
    pool->ParallelFor(n, [&](size_t lo, size_t hi, int) {
      for (size_t i = lo; i < hi; ++i) a[i] = b[i] + s * c[i];
    });
    const double t2 = Now();
    r.triad_gbps = std::max(r.triad_gbps, 3.0 * bytes / (t2 - t1) / 1e9);
  }
  volatile float keep = a[n / 2] + sink[0];
  (void)keep;
  return r;
}

namespace {

// kChains independent FMA chains of vector width W floats: each iteration is
// kChains FMAs of W lanes = 2 * kChains * W FLOPs. Explicit FMA intrinsics,
// since ISO C++ mode does not contract a*b+c into an FMA.
constexpr int kChains = 12;
constexpr long kIters = 20'000'000;

__attribute__((target("avx512f"))) float FmaAvx512(long iters) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(1.0f + c);
  const __m512 m = _mm512_set1_ps(0.999999f), add = _mm512_set1_ps(1e-7f);
  for (long i = 0; i < iters; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], m, add);
  }
  float out[16], s = 0;
  for (int c = 0; c < kChains; ++c) {
    _mm512_storeu_ps(out, acc[c]);
    s += out[0];
  }
  return s;
}

__attribute__((target("avx2,fma"))) float FmaAvx2(long iters) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(1.0f + c);
  const __m256 m = _mm256_set1_ps(0.999999f), add = _mm256_set1_ps(1e-7f);
  for (long i = 0; i < iters; ++i) {
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
    for (int c = 0; c < kChains; ++c) acc[c] = _mm_add_ps(_mm_mul_ps(acc[c], m), add);
  }
  return _mm_cvtss_f32(acc[0]);
}

}  // namespace

PeakFlopsResult MeasurePeakFlops(ThreadPool* pool) {
  PeakFlopsResult r;
  int width = 4;
  float (*fn)(long) = FmaSse;
  r.isa = "sse2";
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) {
    fn = FmaAvx512;
    width = 16;
    r.isa = "avx512";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    fn = FmaAvx2;
    width = 8;
    r.isa = "avx2";
  }
  const int threads = pool->size();
  std::vector<float> sink(threads);
  for (int rep = 0; rep < 3; ++rep) {
    const double t0 = Now();
    pool->ParallelFor(threads, [&](size_t lo, size_t hi, int) {
      for (size_t t = lo; t < hi; ++t) sink[t] = fn(kIters);
    });
    const double secs = Now() - t0;
    const double flops = 2.0 * kChains * width * static_cast<double>(kIters) * threads;
    r.gflops = std::max(r.gflops, flops / secs / 1e9);
  }
  volatile float keep = sink[0];
  (void)keep;
  return r;
}

double MeasureDiskWriteGbps(const std::string& dir, size_t bytes) {
  std::string path = dir + "/kvx_disk_probe_XXXXXX";
  const int fd = ::mkstemp(path.data());
  if (fd < 0) return 0;
  std::vector<char> block(size_t{1} << 20, 1);
  const double t0 = Now();
  size_t written = 0;
  while (written < bytes) {
    const ssize_t n = ::write(fd, block.data(), block.size());
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  ::fsync(fd);
  const double secs = Now() - t0;
  ::close(fd);
  ::unlink(path.c_str());
  return written == 0 ? 0 : written / secs / 1e9;
}

}  // namespace kvx::eval
