// Matrix multiplication of a GGUF weight matrix with float activations:
// the projections of the forward pass (Q/K/V/O, FFN, output head).
//
// Layout: the weight matrix has n_out rows of n_in elements, each row stored
// in the tensor's GGUF encoding (row_bytes apart). Activations are token-major
// x[t*n_in + i], outputs y[t*n_out + o] = sum_i W[o][i] * x[t][i].
//
// This is the scalar ("plain but not naive") path that later SIMD kernels are
// tested against:
//   * each weight row is decoded in chunks of 256 elements (one k-quant super
//     block, eight 32-element blocks) into an L1-resident float buffer, and
//     each decoded chunk is reused for a tile of up to 64 tokens, so prefill
//     decodes a row once per tile rather than once per token;
//   * dot products accumulate in 16 independent float lanes (4-wide vectors,
//     so the error grows like n/16 rather than n), reduced pairwise at the
//     end; a small register-blocked kernel handles 2 tokens per weight load;
//   * threads split output rows only, and a token's lanes see the same
//     sequence of float operations whatever the tile or batch: results are
//     bit-identical for 1 and N threads, and for a token computed alone
//     (decode) or inside a batch (prefill).
//
// Thread-safety: MatMul may be called concurrently on distinct outputs; the
// pool, if given, must not be used by another caller at the same time.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gguf/tensor_type.h"
#include "util/thread_pool.h"

namespace kvx::ops {

// A read-only view of a weight matrix: n_out rows of n_in elements.
struct WeightView {
  gguf::TensorType type;
  const void* data;
  int64_t n_in;
  int64_t n_out;
  size_t row_bytes;  // distance between rows (>= RowBytesOf(type, n_in))
};

// y[t*n_out + o] = dot(W row o, x + t*n_in) for t < n_tokens.
// pool may be nullptr (single thread).
// REQUIRES: supported type, n_in % block_size == 0, y does not alias x.
void MatMul(const WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool* pool);

// Reference: dequantizes each row with DequantizeRow and accumulates the dot
// products in double. Slow; for tests and for validating faster kernels.
void MatMulReference(const WeightView& w, const float* x, int64_t n_tokens, float* y);

}  // namespace kvx::ops
