// Weight repacking for decode: Q8_0 matrices rearranged at load time so that
// a decoded token reads each matrix as one aligned, sequential stream.
//
// Why: decode streams every weight once per token, so its speed is the
// bandwidth the matvec achieves. In the GGUF layout a Q8_0 row is a run of
// 34-byte blocks (f16 scale + 32 quants); the AVX-512 kernel reads 4 rows at
// once, i.e. 4 interleaved streams of unaligned 32-byte loads. On a 2-core
// Zen 5 VM that reached ~60% of the read bandwidth; the same arithmetic over
// the layout below reaches ~90% (scratch measurement; `ops_bench`
// DecodeSweep/q8_0 compares both, see docs/benchmarks.md).
//
// Layout kRowGroups4 (n_out % 4 == 0, n_in % 64 == 0), one buffer:
//   quants [n_out/4][n_in/64][4 rows][64] uint8  = w + 128 (the kernels'
//          canonical unsigned chunk, ops/matmul_internal.h), 64-byte aligned;
//   scales [n_out/4][n_in/64][4 rows][2] f16 bits (the two 32-blocks' d),
//          right after the quants.
// Exactly as many bytes as the GGUF rows; the arithmetic is the same as on
// the GGUF layout, so results are bit-identical (tests check it).
//
// Thread-safety: PackedWeights is immutable after PackAll; the functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "ops/matmul.h"

namespace kvx::ops {

// Whether w can be repacked (Q8_0 in GGUF rows of the right shape).
bool CanRepack(const WeightView& w);

// Whether repacking pays on this machine: the active SIMD target has
// kernels for the packed layout (AVX3_DL). Other targets compute packed
// matrices through the scalar reference, correctly but slowly.
bool RepackingPays();

// Repacked copies of a set of weight matrices, in one buffer that asks the
// kernel for transparent huge pages (madvise MADV_HUGEPAGE; Linux's default
// "madvise" mode grants them only on request). Decode streams every matrix
// once per token; with 4 KiB pages that stream crosses a TLB entry, and the
// hardware prefetchers stop, every 4 KiB. Measured on the 2-core Zen 5 VM,
// alternating the two builds: `ops_bench DecodeSweep/q8_0_repacked/thr1`
// faster in 9 of 10 pairs (median +3%), `kvx bench --depths 0` (2 threads)
// median +2% over 8 pairs, within that machine's noise. Where huge pages are
// unavailable the buffer is ordinary memory. (The KV pool keeps 4 KiB pages:
// huge pages made no difference to attention from DRAM in kv_bench, and
// they would coarsen how finely freed KV memory returns to the system.)
class PackedWeights {
 public:
  PackedWeights() = default;
  ~PackedWeights();
  PackedWeights(PackedWeights&& o) noexcept;
  PackedWeights& operator=(PackedWeights&& o) noexcept;
  PackedWeights(const PackedWeights&) = delete;
  PackedWeights& operator=(const PackedWeights&) = delete;

  // Repacks every view in `views` for which CanRepack holds and points it at
  // its copy; views that share data (a tied embedding and output head) share
  // one copy. The others are left as they are. Then calls done(data, bytes)
  // once per distinct source matrix repacked (its GGUF rows, which the
  // caller may now release).
  using SourceDone = std::function<void(const void* data, size_t bytes)>;
  static PackedWeights PackAll(std::span<WeightView* const> views, const SourceDone& done = {});

  // Matrices repacked, and the bytes of their copies (each rounded up to 64).
  int count() const { return count_; }
  size_t bytes() const { return bytes_; }

 private:
  uint8_t* base_ = nullptr;  // mapping of mapped_ bytes (munmap'ed by the destructor)
  size_t mapped_ = 0;
  size_t bytes_ = 0;
  int count_ = 0;
};

// Row r of w in its GGUF encoding (RowBytesOf(type, n_in) bytes), whatever
// w's layout: for embedding lookups and reference paths.
void CopyRowAsStored(const WeightView& w, int64_t r, uint8_t* out);

// Row r of w dequantized to n_in floats, whatever w's layout.
void DequantizeWeightRow(const WeightView& w, int64_t r, float* out);

}  // namespace kvx::ops
