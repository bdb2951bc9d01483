// Roofline probes: what this machine can do at best, measured in the same run
// as the benchmark they bound.
//
// - Memory bandwidth: a STREAM-like probe over arrays far larger than the
//   caches. `read` sums an array (what decode does to weights and KV pages);
//   `triad` is STREAM's a = b + s*c (reads two arrays, writes one). Each is
//   the best of several passes, all threads streaming disjoint ranges.
// - Peak FLOP/s: independent FMA chains in registers with the widest vectors
//   the CPU supports (AVX-512, AVX2+FMA, else SSE2), on every thread.
//
// Thread-safety: the probes use the given pool; run one at a time.
#pragma once

#include <cstddef>
#include <string>

#include "util/thread_pool.h"

namespace kvx::eval {

struct BandwidthResult {
  double read_gbps = 0;   // 1e9 bytes/s
  double triad_gbps = 0;
  size_t bytes = 0;       // array size used
};

// `bytes` per array (default 256 MiB: well past any L3).
BandwidthResult MeasureBandwidth(ThreadPool* pool, size_t bytes = size_t{256} << 20, int passes = 5);

struct PeakFlopsResult {
  double gflops = 0;       // f32 multiply-adds count as 2 FLOPs
  std::string isa;         // "avx512", "avx2", "sse2"
};

PeakFlopsResult MeasurePeakFlops(ThreadPool* pool);

// Sequential write bandwidth to a file in `dir` (written, fsync'd, removed):
// the speed at which a sequence's KV could be offloaded to local disk.
// Returns 0 when the directory is not writable.
double MeasureDiskWriteGbps(const std::string& dir, size_t bytes = size_t{64} << 20);

}  // namespace kvx::eval
