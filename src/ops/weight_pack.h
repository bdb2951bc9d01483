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
// Thread-safety: PackedWeight is immutable after Pack; the functions are pure.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>

#include "ops/matmul.h"

namespace kvx::ops {

// Whether w can be repacked (Q8_0 in GGUF rows of the right shape).
bool CanRepack(const WeightView& w);

// Whether repacking pays on this machine: the active SIMD target has
// kernels for the packed layout (AVX3_DL). Other targets compute packed
// matrices through the scalar reference, correctly but slowly.
bool RepackingPays();

// An owned, repacked copy of a weight matrix.
class PackedWeight {
 public:
  // REQUIRES: CanRepack(w).
  static PackedWeight Pack(const WeightView& w);
  const WeightView& view() const { return view_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> buffer_;
  WeightView view_{};
};

// Row r of w in its GGUF encoding (RowBytesOf(type, n_in) bytes), whatever
// w's layout: for embedding lookups and reference paths.
void CopyRowAsStored(const WeightView& w, int64_t r, uint8_t* out);

// Row r of w dequantized to n_in floats, whatever w's layout.
void DequantizeWeightRow(const WeightView& w, int64_t r, float* out);

}  // namespace kvx::ops
