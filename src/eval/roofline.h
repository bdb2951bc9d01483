// Roofline probes: what this machine can do at best, measured in the same run
// as the benchmark they bound.
//
// - Memory bandwidth: a STREAM-like probe over arrays far larger than the
//   caches. `read` sums an array (what decode does to weights and KV pages);
//   `triad` is STREAM's a = b + s*c (reads two arrays, writes one). Each is
//   the best of several passes, all threads streaming disjoint ranges.
// - Peak FLOP/s: independent FMA chains in registers with the widest vectors
//   the CPU supports (AVX-512, AVX2+FMA, else SSE2), on every thread. The
//   bound of float matmuls (F32/F16/BF16 weights) and attention.
// - Peak int8 OP/s: independent int8 dot-product chains in registers with the
//   widest instruction the CPU supports at run time (AVX-512 VNNI vpdpbusd on
//   512 bits, else AVX-VNNI vpdpbusd on 256 bits, else the AVX2 sequence
//   vpmaddubsw + vpmaddwd + vpaddd), on every thread. The bound of matmuls on
//   quantized weights, which ops/ computes with int8 activations. An int8
//   multiply-accumulate counts as 2 ops, like an FMA's 2 FLOPs.
//
// Both compute probes pick their instruction set with a run-time CPU check
// (the build stays baseline x86-64); on other CPUs the FMA probe runs plain
// scalar float code and the int8 probe reports 0 / "none".
//
// Thread-safety: the probes use the given pool; run one at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gguf/tensor_type.h"
#include "util/thread_pool.h"

namespace kvx::eval {

struct BandwidthResult {
  double read_gbps = 0;   // 1e9 bytes/s
  double triad_gbps = 0;
  size_t bytes = 0;       // array size used
};

// `bytes` per array (default 256 MiB: well past any L3).
BandwidthResult MeasureBandwidth(ThreadPool* pool, size_t bytes = size_t{256} << 20, int passes = 5);

// Read bandwidth of streaming the same `bytes` again and again, as decode
// re-reads the weights and the KV for every token: the best of `passes`
// after one warm-up pass. Caches that keep part of the stream between passes
// make this faster than MeasureBandwidth's 256 MiB reading, and the bound of
// a token that reads `bytes` is this rate: on a 2-vCPU Zen 5 VM, re-reading
// 145 MiB ran ~10% faster than 256 MiB, and decode showed up to 112% of the
// 256 MiB bound.
double MeasureStreamReadGbps(ThreadPool* pool, size_t bytes, int passes = 10);

// Iterations of every chain per thread and repetition (tens of milliseconds
// per repetition on a current core; the best of 3 repetitions is kept);
// tests pass fewer.
inline constexpr long kPeakProbeIters = 20'000'000;

struct PeakFlopsResult {
  double gflops = 0;       // f32 multiply-adds count as 2 FLOPs
  std::string isa;         // "avx512", "avx2", "sse2" ("scalar" off x86)
};

PeakFlopsResult MeasurePeakFlops(ThreadPool* pool, long iters = kPeakProbeIters);

// The same probe on the calling thread alone, timed in that thread's CPU
// time (best of `reps`): the peak that a one-thread kernel benchmark timed
// in CPU time divides by (kv_bench's attention kernels), which the time the
// thread spends descheduled on a loaded machine does not lower.
PeakFlopsResult MeasurePeakFlopsThreadCpu(long iters = kPeakProbeIters / 10, int reps = 5);

struct PeakInt8Result {
  double gops = 0;         // int8 multiply-accumulates count as 2 ops; 0 when isa == "none"
  std::string isa;         // "avx512vnni", "avxvnni", "avx2", "none"
};

PeakInt8Result MeasurePeakInt8(ThreadPool* pool, long iters = kPeakProbeIters);

// Which peak bounds a matmul on weights of `type`: ops/ computes Q8_0, Q4_0,
// Q4_K, Q5_K and Q6_K weights with int8-quantized activations and integer
// dot products (true: the int8 peak), the float types with FMAs (false: the
// FLOP/s peak). Mirrors ops::internal::IsIntPathType (roofline_test checks).
bool UsesInt8Dot(gguf::TensorType type);

// The int8 probe's instruction sets this CPU supports, best first (empty
// when none), and the one MeasurePeakInt8 uses (the first, or "none").
std::vector<std::string> Int8ProbeIsas();
std::string Int8ProbeIsa();

// Test hooks for the int8 probe's kernels. Int8ProbeMacsPerIter: the int8
// multiply-accumulates one iteration of the kernel for `isa` performs (what
// MeasurePeakInt8 counts; 0 for "none" or an unknown name).
// RunInt8ProbeKernel: runs that kernel for `iters` iterations on the calling
// thread and returns the sum of all its int32 accumulator lanes; every
// multiply-accumulate adds kInt8ProbeProduct, so the result is exactly
// kInt8ProbeProduct * Int8ProbeMacsPerIter(isa) * iters when every counted
// operation ran. REQUIRES: the CPU supports `isa`; iters <= kPeakProbeIters.
inline constexpr int kInt8ProbeProduct = -6;  // unsigned 3 times signed -2
int64_t Int8ProbeMacsPerIter(const std::string& isa);
int64_t RunInt8ProbeKernel(const std::string& isa, long iters);

// Sequential write bandwidth to a file in `dir` (written, fsync'd, removed):
// the speed at which a sequence's KV could be offloaded to local disk.
// Returns 0 when the directory is not writable.
double MeasureDiskWriteGbps(const std::string& dir, size_t bytes = size_t{64} << 20);

}  // namespace kvx::eval
