#include "ops/matmul.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "ops/dequant.h"
#include "ops/quant_blocks.h"
#include "util/check.h"

namespace kvx::ops {
namespace {

using gguf::TensorType;

constexpr int kLanes = 16;        // independent float accumulators per dot product
constexpr int kChunk = kQK_K;     // elements decoded at a time (multiple of every block size)
constexpr int kTileTokens = 64;   // tokens sharing one decoded chunk
constexpr int kMicroTokens = 2;   // tokens per register-blocked dot kernel

// The accumulators are 4-float vectors (GCC/Clang vector extensions: plain
// element-wise float math, compiled to SSE/NEON or to scalar code where
// unavailable). Lane l of a token's accumulator sums w[i]*x[i] over
// i = l (mod kLanes), in increasing i, whatever the tile size: every output is
// computed by the same sequence of float operations in decode and prefill
// (batch-invariant) and for any thread count.
typedef float F32x4 __attribute__((vector_size(16)));
constexpr int kVecs = kLanes / 4;
struct Acc {
  F32x4 v[kVecs];
};

inline F32x4 LoadU(const float* p) {
  F32x4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// acc[t] += lane-wise w[i] * x[t][i] for i < len, for kT tokens at once, so
// each weight vector is loaded once per kT tokens.
template <int kT>
inline void DotAccumulate(const float* __restrict w, const float* const* __restrict x, int len,
                          Acc* __restrict acc_io) {
  F32x4 acc[kT][kVecs];
  for (int t = 0; t < kT; ++t) {
    for (int v = 0; v < kVecs; ++v) acc[t][v] = acc_io[t].v[v];
  }
  int i = 0;
  for (; i + kLanes <= len; i += kLanes) {
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) {
      const F32x4 wv = LoadU(w + i + 4 * v);
#pragma GCC unroll 4
      for (int t = 0; t < kT; ++t) acc[t][v] += wv * LoadU(x[t] + i + 4 * v);
    }
  }
  for (int t = 0; t < kT; ++t) {
    for (int v = 0; v < kVecs; ++v) acc_io[t].v[v] = acc[t][v];
  }
  // Tail (only for plain types with n_in % 16 != 0): element i goes to lane i - i0.
  for (int t = 0; t < kT; ++t) {
    for (int j = i; j < len; ++j) acc_io[t].v[(j - i) / 4][(j - i) % 4] += w[j] * x[t][j];
  }
}

// Pairwise reduction of the lanes in a fixed order: sums of vectors first
// (lanes l, l+4, l+8, l+12 combined as (v0+v2)+(v1+v3)), then the 4 lanes as
// (l0+l2)+(l1+l3).
inline float ReduceLanes(const Acc& a) {
  const F32x4 s = (a.v[0] + a.v[2]) + (a.v[1] + a.v[3]);
  return (s[0] + s[2]) + (s[1] + s[3]);
}

// Decodes elements [begin, begin+len) of a row into out (or, for F32, returns
// a pointer into the row itself). begin and len are multiples of the block size.
template <TensorType kType>
inline const float* DecodeChunk(const uint8_t* row, int64_t begin, int len, float* out) {
  if constexpr (kType == TensorType::kF32) {
    return reinterpret_cast<const float*>(row) + begin;
  } else if constexpr (kType == TensorType::kF16 || kType == TensorType::kBF16) {
    uint16_t h[kChunk];  // copy first: the row bytes need not be 2-aligned
    std::memcpy(h, row + 2 * begin, 2 * static_cast<size_t>(len));
    auto convert = [](uint16_t v) { return kType == TensorType::kF16 ? HalfToFloat(v) : BfloatToFloat(v); };
    int i = 0;
    for (; i + 16 <= len; i += 16) {  // fixed trip count: vectorizes at -O2
      for (int k = 0; k < 16; ++k) out[i + k] = convert(h[i + k]);
    }
    for (; i < len; ++i) out[i] = convert(h[i]);
  } else if constexpr (kType == TensorType::kQ8_0) {
    const uint8_t* p = row + (begin / kQK8_0) * kQ8_0Bytes;
    for (int b = 0; b < len / kQK8_0; ++b) DecodeBlockQ8_0(p + b * kQ8_0Bytes, out + b * kQK8_0);
  } else if constexpr (kType == TensorType::kQ4_0) {
    const uint8_t* p = row + (begin / kQK4_0) * kQ4_0Bytes;
    for (int b = 0; b < len / kQK4_0; ++b) DecodeBlockQ4_0(p + b * kQ4_0Bytes, out + b * kQK4_0);
  } else if constexpr (kType == TensorType::kQ4_K) {
    DecodeBlockQ4_K(row + (begin / kQK_K) * kQ4_KBytes, out);
  } else if constexpr (kType == TensorType::kQ5_K) {
    DecodeBlockQ5_K(row + (begin / kQK_K) * kQ5_KBytes, out);
  } else if constexpr (kType == TensorType::kQ6_K) {
    DecodeBlockQ6_K(row + (begin / kQK_K) * kQ6_KBytes, out);
  }
  return out;
}

// Computes y for output rows [row_begin, row_end) and all tokens. Tokens are
// processed in tiles (outer loop) so the tile's activations stay in cache
// while the weight rows stream through; within a row, each decoded chunk is
// used by every token of the tile.
template <TensorType kType>
void MatMulRows(const WeightView& w, const float* x, int64_t n_tokens, float* y,
                int64_t row_begin, int64_t row_end) {
  alignas(64) float chunk_buf[kChunk];
  Acc acc[kTileTokens];
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const int64_t n_in = w.n_in;
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kTileTokens) {
    const int nt = static_cast<int>(std::min<int64_t>(kTileTokens, n_tokens - t0));
    const float* xt = x + t0 * n_in;
    for (int64_t o = row_begin; o < row_end; ++o) {
      const uint8_t* row = base + static_cast<size_t>(o) * w.row_bytes;
      std::memset(acc, 0, sizeof(Acc) * nt);
      for (int64_t c = 0; c < n_in; c += kChunk) {
        const int len = static_cast<int>(std::min<int64_t>(kChunk, n_in - c));
        const float* wc = DecodeChunk<kType>(row, c, len, chunk_buf);
        const float* xs[kMicroTokens];
        int t = 0;
        for (; t + kMicroTokens <= nt; t += kMicroTokens) {
          for (int k = 0; k < kMicroTokens; ++k) xs[k] = xt + (t + k) * n_in + c;
          DotAccumulate<kMicroTokens>(wc, xs, len, acc + t);
        }
        for (; t < nt; ++t) {
          xs[0] = xt + t * n_in + c;
          DotAccumulate<1>(wc, xs, len, acc + t);
        }
      }
      for (int t = 0; t < nt; ++t) y[(t0 + t) * w.n_out + o] = ReduceLanes(acc[t]);
    }
  }
}

using RowsFn = void (*)(const WeightView&, const float*, int64_t, float*, int64_t, int64_t);

RowsFn SelectRowsFn(TensorType type) {
  switch (type) {
    case TensorType::kF32: return &MatMulRows<TensorType::kF32>;
    case TensorType::kF16: return &MatMulRows<TensorType::kF16>;
    case TensorType::kBF16: return &MatMulRows<TensorType::kBF16>;
    case TensorType::kQ8_0: return &MatMulRows<TensorType::kQ8_0>;
    case TensorType::kQ4_0: return &MatMulRows<TensorType::kQ4_0>;
    case TensorType::kQ4_K: return &MatMulRows<TensorType::kQ4_K>;
    case TensorType::kQ5_K: return &MatMulRows<TensorType::kQ5_K>;
    case TensorType::kQ6_K: return &MatMulRows<TensorType::kQ6_K>;
    default: return nullptr;
  }
}

}  // namespace

void MatMul(const WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool* pool) {
  const BlockGeometry g = GetBlockGeometry(w.type);
  KVX_CHECK_MSG(g.block_size != 0, "MatMul: unsupported weight type");
  KVX_CHECK(w.n_in > 0 && w.n_in % g.block_size == 0);
  KVX_CHECK(w.row_bytes >= RowBytesOf(w.type, w.n_in));
  if (w.n_out <= 0 || n_tokens <= 0) return;
  const RowsFn fn = SelectRowsFn(w.type);
  if (pool == nullptr || pool->size() <= 1 || w.n_out < 2) {
    fn(w, x, n_tokens, y, 0, w.n_out);
    return;
  }
  // Threads split output rows: each y value is produced by one thread with the
  // same operation order as the single-threaded path.
  pool->ParallelFor(static_cast<size_t>(w.n_out), [&](size_t begin, size_t end, int) {
    fn(w, x, n_tokens, y, static_cast<int64_t>(begin), static_cast<int64_t>(end));
  });
}

void MatMulReference(const WeightView& w, const float* x, int64_t n_tokens, float* y) {
  std::vector<float> row(static_cast<size_t>(w.n_in));
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  for (int64_t o = 0; o < w.n_out; ++o) {
    DequantizeRow(w.type, base + static_cast<size_t>(o) * w.row_bytes, row.data(), w.n_in);
    for (int64_t t = 0; t < n_tokens; ++t) {
      double sum = 0;
      const float* xt = x + t * w.n_in;
      for (int64_t i = 0; i < w.n_in; ++i) sum += static_cast<double>(row[i]) * xt[i];
      y[t * w.n_out + o] = static_cast<float>(sum);
    }
  }
}

}  // namespace kvx::ops
