// Internal to ops/: the data formats shared by the MatMul kernels of every
// SIMD target, and the scalar reference implementations that define their
// results. Not part of the public API (include ops/matmul.h instead).
//
// Two paths:
//
// * Float path (F32/F16/BF16 weights, float activations). Each output
//   (row r, token t) is a dot product kept in 16 float lanes: lane l
//   accumulates w[k]*x[k] for k = l (mod 16) with fused multiply-adds, in
//   increasing k; the lanes are then summed by a fixed tree (ReduceLanes).
//
// * Integer path (Q8_0/Q4_0/Q4_K/Q5_K/Q6_K weights). Activations are
//   quantized once per MatMul to int8 in blocks of 32 (QuantizedActs), and
//   the weights are read as "canonical chunks" of 64 elements: 64 unsigned
//   8-bit quants u and 16 float lane scales s (lane l covers elements
//   4l..4l+3, so lanes map 1:1 onto the int32 lanes of vpdpbusd/pmaddubsw).
//   Per chunk and lane, the integer dot
//       i_l = sum_{e<4} u[4l+e] * a[4l+e]  +  (bias_l << shift)
//   is exact (int32), where bias_l = -(sum of the lane's 4 activation quants)
//   undoes the unsigned offset 2^shift of the weight quants (Q8_0 stores
//   w+128, Q4_0 q = w+8, Q6_K q = w+32): i_l is exactly the signed dot of the
//   lane's 4 weights with its 4 activations, whatever instruction computes
//   it. Then
//       acc_l = fma(float(i_l), s_l * da_l, acc_l)
//   in chunk order; for k-quants with a min (Q4_K/Q5_K), after the 4 chunks
//   of each 256-superblock, lanes j < 8 also get
//       acc_j = fma(-m_j, sa_j, acc_j)
//   with m_j = dmin*min_j and sa_j = da_j * sum(a quants of sub-block j).
//   The lanes are summed by ReduceLanes.
//
// * Interleaved Q8_0 (WeightLayout::kInterleaved16, ops/weight_pack.h).
//   Per 32-block b of the row, the exact integer dot of its weights with
//   the activation quants,
//       isum_b = sum_{j<32} (w_j + 128) * a_j  +  block_bias_b,
//   block_bias_b = -128 * (sum of the block's 32 activation quants), then
//       acc = fma(float(isum_b), d_w,b * d_a,b, acc)
//   in block order from acc = 0, and y = acc: one float chain per output,
//   no lanes (a SIMD kernel holds 16 rows in the 16 lanes instead). This is
//   the form of llama.cpp's reference q8_0 x q8_0 dot, and it costs one
//   conversion, one multiply and one fma per 8 vpdpbusd instead of one each
//   per vpdpbusd, which is what lets the prefill GEMM approach the int8
//   peak. (The canonical-chunk contract above still serves the other types
//   and Q8_0 in GGUF rows; moving those onto per-block sums is future work,
//   so a Q8_0 matrix gives slightly different, equally accurate, results
//   repacked and not.)
//
// Every target performs exactly these float operations in this order, so
// results are bit-identical across SIMD targets, thread counts and batch
// sizes (a token computed alone or inside a prefill batch). Accuracy of the
// integer path against the float path: see ops/matmul.h.
//
// Thread-safety: pure functions on caller-owned buffers.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "gguf/tensor_type.h"
#include "ops/matmul.h"

namespace kvx::ops::internal {

inline constexpr int kChunk = 64;         // elements per integer-path chunk
inline constexpr int kChunkLanes = 16;    // lanes per chunk (4 elements each)
inline constexpr int kActBlock = 32;      // activation quantization block
inline constexpr int kFloatLanes = 16;    // float-path lanes

inline int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Grow-only 64-byte aligned scratch memory (use one per thread).
class ScratchBuffer {
 public:
  ScratchBuffer() = default;
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  ~ScratchBuffer() { std::free(p_); }
  void* Get(size_t bytes) {
    if (bytes > cap_) {
      std::free(p_);
      cap_ = static_cast<size_t>(RoundUp(static_cast<int64_t>(bytes), 4096));
      p_ = std::aligned_alloc(64, cap_);
      if (p_ == nullptr) std::abort();
    }
    return p_;
  }

 private:
  void* p_ = nullptr;
  size_t cap_ = 0;
};

// Int8 activations for n_tokens rows of k elements, padded to k_pad (a
// multiple of 64) with zeros. All planes are 64-byte aligned per row.
struct QuantizedActs {
  int64_t n_tokens = 0;
  int64_t k = 0;
  int64_t k_pad = 0;
  int8_t* q = nullptr;      // [n_tokens][k_pad]        a ~= d * q
  float* d = nullptr;       // [n_tokens][k_pad / 4]    per-lane block scale
  int32_t* bias = nullptr;  // [n_tokens][k_pad / 4]    per-lane -(sum of its 4 q)
  float* sa = nullptr;      // [n_tokens][k_pad / 32]   d * sum(q) per 32-block
  int32_t* block_bias = nullptr;  // [n_tokens][k_pad / 32]   -128 * sum(q) per 32-block
  // Whether d and bias are written: the per-lane kernels (GGUF rows) read
  // them; a call whose every matrix is kInterleaved16 skips them (590 KB of
  // writes per pass over a 512-token prompt of width 576).
  bool lane_planes = true;
  float* ds = nullptr;            // [n_tokens][k_pad / 32]   d per 32-block (the per-block kernels' compact
                                  //                          copy of `d`: a prompt's d plane did not fit in L2)

  const int8_t* QRow(int64_t t) const { return q + t * k_pad; }
  const float* DRow(int64_t t) const { return d + t * (k_pad / 4); }
  const int32_t* BiasRow(int64_t t) const { return bias + t * (k_pad / 4); }
  const float* SaRow(int64_t t) const { return sa + t * (k_pad / 32); }
  const int32_t* BlockBiasRow(int64_t t) const { return block_bias + t * (k_pad / 32); }
  const float* DsRow(int64_t t) const { return ds + t * (k_pad / 32); }
  int64_t SaStride() const { return k_pad / 32; }
};

// Bytes needed by QuantizedActs for (n_tokens, k), and carving the planes
// out of a 64-byte aligned buffer of that size.
size_t QuantizedActsBytes(int64_t n_tokens, int64_t k);
QuantizedActs LayoutQuantizedActs(void* buffer, int64_t n_tokens, int64_t k);

// Quantizes tokens [t0, t1) of x (row stride k) into a. Per 32-block:
// amax = max|x|, d = amax / 127, q = round_to_nearest_even(x * (127 / amax))
// (q = 0, d = 0 for an all-zero block). Padding is zero.
void QuantizeActsScalar(const float* x, int64_t t0, int64_t t1, QuantizedActs* a);

// Integer-path properties of a weight type.
struct IntTypeInfo {
  int bias_shift;       // -1: no activation-sum bias
  bool has_min;         // Q4_K/Q5_K: per-superblock min term
  int chunks_per_super; // 1 (blocks of 32, chunk = two blocks) or 4 (256-superblocks)
};
constexpr bool IsIntPathType(gguf::TensorType t) {
  using T = gguf::TensorType;
  return t == T::kQ8_0 || t == T::kQ4_0 || t == T::kQ4_K || t == T::kQ5_K || t == T::kQ6_K;
}
constexpr IntTypeInfo GetIntTypeInfo(gguf::TensorType t) {
  using T = gguf::TensorType;
  switch (t) {
    case T::kQ8_0: return {7, false, 1};  // u = w + 128
    case T::kQ4_0: return {3, false, 1};  // u = w + 8
    case T::kQ6_K: return {5, false, 4};  // u = w + 32
    case T::kQ4_K:
    case T::kQ5_K: return {-1, true, 4};
    default: return {-1, false, 0};
  }
}

// Canonical chunk c (elements [64c, 64c+64)) of a weight row of n_in
// elements: u[64], s[16]; for has_min types and c % 4 == 0 also m[16]
// (lanes 0..7 = dmin*min_j of the superblock, 8..15 = 0). A chunk that
// extends past n_in (odd number of 32-blocks) is zero-filled there.
void DecodeChunkScalar(gguf::TensorType type, const uint8_t* row, int64_t n_in, int64_t c, uint8_t* u, float* s,
                       float* m);

// The fixed lane-summation tree: (l, l+8) -> (l, l+4) -> (l, l+2) -> (0, 1).
inline float ReduceLanes(const float* v) {
  float s8[8], s4[4];
  for (int i = 0; i < 8; ++i) s8[i] = v[i] + v[i + 8];
  for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// Geometry of the WeightLayout::kInterleaved16 layout (ops/weight_pack.h):
// per group of 16 rows and 64-element chunk c, one 1088-byte unit of
//   quants [2 blocks][8 steps][16 rows][4] uint8 = w + 128 (step s of block
//          h holds elements 32h+4s..32h+4s+3 of each row: one vpdpbusd
//          operand for the 16 rows), then
//   scales [2 blocks][16 rows] f16 bits;
// units in (group, chunk) order, so a matrix is one sequential stream.
struct Interleaved16 {
  static constexpr int kRows = 16;
  static constexpr int kSteps = 8;                        // 4-element steps per 32-block
  static constexpr int kQuantBytes = 2 * kSteps * kRows * 4;  // 1024
  static constexpr int kUnitBytes = kQuantBytes + 2 * kRows * 2;  // 1088 = 17 lines
  int64_t n_chunks = 0;  // n_in / kChunk
  const uint8_t* base = nullptr;
  const uint8_t* Unit(int64_t group, int64_t c) const { return base + (group * n_chunks + c) * kUnitBytes; }
  static const uint16_t* Scales(const uint8_t* unit) { return reinterpret_cast<const uint16_t*>(unit + kQuantBytes); }
};
inline Interleaved16 Interleaved16Of(const WeightView& w) {
  return {w.n_in / kChunk, static_cast<const uint8_t*>(w.data)};
}

// Scalar reference kernels. Rows [r0, r1) of w, all tokens; y is [t][n_out].
// Any layout (other than kRows, rows are first copied back to GGUF form);
// kInterleaved16 by its own contract above.
void MatMulRowsFloatScalar(const WeightView& w, const float* x, int64_t n_tokens, float* y, int64_t r0, int64_t r1);
void MatMulRowsIntScalar(const WeightView& w, const QuantizedActs& a, float* y, int64_t r0, int64_t r1);

// The same, dispatched to the best SIMD target of this CPU (matmul_simd.cc).
// Whether the AVX2 target's kernels may use AVX-VNNI (simd_target.cc: on
// when the CPU has it, unless a test or benchmark forced plain "AVX2").
bool AvxVnniEnabled();

// The feature the AVX2 target's VNNI kernels add to the target's string
// (matmul_avx2-inl.h); simd_target.cc checks the same string.
#define KVX_AVX2_VNNI_FEATURES "avxvnni"

// Each compiled Highway target (its bit) with the target string its kernels
// are compiled with (HWY_TARGET_STR of that pass; "" for the baseline), best
// first: what simd_target.cc verifies against CPUID before dispatching.
struct CompiledTarget {
  int64_t bit;
  const char* features;
};
std::vector<CompiledTarget> CompiledTargets();

void QuantizeActsBest(const float* x, int64_t t0, int64_t t1, QuantizedActs* a);
void MatMulRowsFloatBest(const WeightView& w, const float* x, int64_t n_tokens, float* y, int64_t r0, int64_t r1);
void MatMulRowsIntBest(const WeightView& w, const QuantizedActs& a, float* y, int64_t r0, int64_t r1);

}  // namespace kvx::ops::internal
