// Weight repacking: Q8_0 matrices rearranged at load time for the AVX-512
// VNNI and AVX2 kernels, so that decode reads each matrix as one aligned
// sequential stream and the prefill GEMM keeps 16 rows in each vector (two
// halves of 8 on AVX2).
//
// Why: decode streams every weight once per token, so its speed is the
// bandwidth the matvec achieves. In the GGUF layout a Q8_0 row is a run of
// 34-byte blocks (f16 scale + 32 quants); reading several rows at once means
// several interleaved streams of unaligned 32-byte loads (~60% of the read
// bandwidth on a 2-core Zen 5 VM, against ~90% for one aligned stream). And
// the prefill GEMM, with rows in the vector lanes, sums each 32-block in
// int32 with 8 vpdpbusd and spends just 3 float operations on it, where
// GGUF rows cost 3 float operations per vpdpbusd (ops/matmul_internal.h).
//
// Layout kInterleaved16 (n_out % 16 == 0, n_in % 64 == 0), one buffer of
// 1088-byte units, one per (16-row group, 64-element chunk), in that order:
//   quants [2 blocks][8 steps][16 rows][4] uint8 = w + 128 (a step is 4
//          consecutive elements of each of the 16 rows: one vpdpbusd operand);
//   scales [2 blocks][16 rows] f16 bits (the blocks' d).
// Exactly as many bytes as the GGUF rows (34 per 32 elements); units are
// 64-byte aligned when the buffer is (1088 = 17 lines).
//
// Thread-safety: PackedWeights is immutable after PackAll; the functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "ops/matmul.h"

namespace kvx::ops {

// Whether w can be repacked (Q8_0 in GGUF rows, n_out % 16 == 0, n_in % 64 == 0).
bool CanRepack(const WeightView& w);

// Whether repacking pays on this machine: the active SIMD target has
// kernels for the packed layout (AVX3_DL, AVX2). The scalar baseline
// computes packed matrices through its reference, correctly but slowly.
// On AVX2 (ops_bench, smollm2-135m stack, Zen 5 VM forced to AVX2, 2
// threads): DecodeSweep 22-26 -> 55 GB/s, PrefillGemm 157 -> 245 GFLOP/s.
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
