// Matrix multiplication of a GGUF weight matrix with float activations:
// the projections of the forward pass (Q/K/V/O, FFN, output head).
//
// Layout: the weight matrix has n_out rows of n_in elements, each row stored
// in the tensor's GGUF encoding (row_bytes apart). Activations are token-major
// x[t*n_in + i], outputs y[t*n_out + o] = sum_i W[o][i] * x[t][i].
//
// Kernels (matmul_internal.h has the exact arithmetic, matmul_simd.cc the
// SIMD code, matmul_scalar.cc the scalar reference):
//   * F32/F16/BF16 weights: float activations, fused multiply-adds in 16
//     lanes per output, summed by a fixed tree. Error vs the exact dot
//     product: ~n/16 float roundings (tests: <= 2e-6 * sum|w*x|).
//   * Q8_0/Q4_0/Q4_K/Q5_K/Q6_K weights: the activations are quantized once
//     per call to int8 in blocks of 32 (scale amax/127, round to nearest
//     even), like llama.cpp's q8_0/q8_K activations, and the block dot
//     products are exact integer sums (AVX-512 VNNI vpdpbusd, AVX2
//     pmaddubsw). The only extra error is the activation rounding: for every
//     output, |y - y_exact| <= sum over 32-blocks b of (d_b / 2) * sum_{i in b}
//     |w_i|, d_b = max_{i in b}|x_i| / 127 (relative ~0.2-0.4% of the
//     output's magnitude sum|w*x| for Gaussian data), plus float rounding.
//   * Results are bit-identical for any thread count, for a token computed
//     alone (decode) or in a batch (prefill), and across SIMD targets
//     (AVX3_DL, AVX2, scalar) of the same build.
//   * Runtime dispatch picks the best target of the CPU (ops/simd_target.h).
//
// Blocking: threads split output rows; each thread runs register-blocked
// micro-kernels (4 rows x 4 tokens of 16-lane accumulators) over token tiles
// that stay in L2; quantized weights are decoded once per tile into an L1
// panel (prefill) or straight into registers (decode). Q8_0 matrices the
// model loader repacked (WeightLayout::kInterleaved16, ops/weight_pack.h)
// are read as one aligned stream of 16-row groups, by kernels that hold 16
// rows per vector and sum each 32-block in int32 (matmul_internal.h): the
// same error bound, results that differ from the GGUF layout's in the last
// bits, and still bit-identical across targets, threads and batch sizes.
//
// Thread-safety: MatMul may be called concurrently on distinct outputs; the
// pool, if given, must not be used by another caller at the same time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "gguf/tensor_type.h"
#include "util/thread_pool.h"

namespace kvx::ops {

// How a weight matrix's bytes are arranged.
enum class WeightLayout : uint8_t {
  kRows,        // GGUF rows as in the file, row_bytes apart
  kInterleaved16,  // Q8_0 repacked: 16-row groups interleaved for VNNI (ops/weight_pack.h)
};

// A read-only view of a weight matrix: n_out rows of n_in elements.
struct WeightView {
  gguf::TensorType type;
  const void* data;
  int64_t n_in;
  int64_t n_out;
  size_t row_bytes;  // kRows: distance between rows (>= RowBytesOf(type, n_in));
                     // other layouts: RowBytesOf(type, n_in), bytes per row as stored
  WeightLayout layout = WeightLayout::kRows;
};

// y[t*n_out + o] = dot(W row o, x + t*n_in) for t < n_tokens.
// pool may be nullptr (single thread).
// REQUIRES: supported type, n_in % block_size == 0, y does not alias x.
void MatMul(const WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool* pool);

// One weight matrix and its output buffer, for MatMulMulti.
struct MatMulOutput {
  WeightView w;
  float* y;  // [n_tokens][w.n_out]
};

// Several matrices applied to the same activations (Q/K/V, or FFN gate/up):
// the activations are quantized once and all rows are split between the
// threads in one parallel loop. Results equal separate MatMul calls.
// REQUIRES: all w.n_in equal; as MatMul for each.
void MatMulMulti(std::span<const MatMulOutput> outputs, const float* x, int64_t n_tokens, ThreadPool* pool);

// Reference: dequantizes each row with DequantizeRow and accumulates the dot
// products in double. Slow; for tests and for validating faster kernels.
void MatMulReference(const WeightView& w, const float* x, int64_t n_tokens, float* y);

}  // namespace kvx::ops
