// Scalar reference implementations of the MatMul kernels (matmul_internal.h
// defines what they compute). They are the baseline every SIMD kernel is
// tested against, and the kernels used on CPUs without a SIMD target.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/matmul_internal.h"
#include "ops/quant_blocks.h"
#include "ops/weight_pack.h"
#include "util/check.h"

namespace kvx::ops::internal {
namespace {

using gguf::TensorType;

template <class T>
T* Carve(uint8_t*& p, int64_t count) {
  T* out = reinterpret_cast<T*>(p);
  p += RoundUp(static_cast<int64_t>(sizeof(T)) * count, 64);
  return out;
}

// Float row element k as float (F32/F16/BF16).
inline float FloatWeight(TensorType t, const uint8_t* row, int64_t k) {
  if (t == TensorType::kF32) {
    float f;
    std::memcpy(&f, row + 4 * k, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, row + 2 * k, 2);
  return t == TensorType::kF16 ? HalfToFloat(h) : BfloatToFloat(h);
}

}  // namespace

size_t QuantizedActsBytes(int64_t n_tokens, int64_t k) {
  const int64_t k_pad = RoundUp(k, kChunk);
  const int64_t per_plane[] = {k_pad, 4 * (k_pad / 4), 4 * (k_pad / 4), 4 * (k_pad / 32), 4 * (k_pad / 32),
                               4 * (k_pad / 32)};
  size_t total = 0;
  for (int64_t b : per_plane) total += static_cast<size_t>(RoundUp(b * n_tokens, 64));
  return total;
}

QuantizedActs LayoutQuantizedActs(void* buffer, int64_t n_tokens, int64_t k) {
  QuantizedActs a;
  a.n_tokens = n_tokens;
  a.k = k;
  a.k_pad = RoundUp(k, kChunk);
  uint8_t* p = static_cast<uint8_t*>(buffer);
  a.q = Carve<int8_t>(p, n_tokens * a.k_pad);
  a.d = Carve<float>(p, n_tokens * (a.k_pad / 4));
  a.bias = Carve<int32_t>(p, n_tokens * (a.k_pad / 4));
  a.sa = Carve<float>(p, n_tokens * (a.k_pad / 32));
  a.block_bias = Carve<int32_t>(p, n_tokens * (a.k_pad / 32));
  a.ds = Carve<float>(p, n_tokens * (a.k_pad / 32));
  return a;
}

void QuantizeActsScalar(const float* x, int64_t t0, int64_t t1, QuantizedActs* a) {
  const int64_t k = a->k, nb = a->k_pad / kActBlock;
  for (int64_t t = t0; t < t1; ++t) {
    const float* xt = x + t * k;
    int8_t* q = a->q + t * a->k_pad;
    float* d = a->d + t * (a->k_pad / 4);
    int32_t* bias = a->bias + t * (a->k_pad / 4);
    float* sa = a->sa + t * (a->k_pad / 32);
    int32_t* block_bias = a->block_bias + t * (a->k_pad / 32);
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t i0 = b * kActBlock;
      float amax = 0.0f;
      for (int64_t i = i0; i < std::min(i0 + kActBlock, k); ++i) amax = std::max(amax, std::fabs(xt[i]));
      const float db = amax / 127.0f;
      const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
      int32_t lane_sum[8] = {};
      for (int64_t i = i0; i < i0 + kActBlock; ++i) {
        const int v = i < k ? static_cast<int>(std::nearbyint(xt[i] * id)) : 0;
        q[i] = static_cast<int8_t>(v);
        lane_sum[(i - i0) / 4] += v;
      }
      int32_t sum = 0;
      for (int l = 0; l < 8; ++l) {
        if (a->lane_planes) {
          d[8 * b + l] = db;
          bias[8 * b + l] = -lane_sum[l];
        }
        sum += lane_sum[l];
      }
      sa[b] = db * static_cast<float>(sum);
      block_bias[b] = -128 * sum;
      a->ds[t * (a->k_pad / 32) + b] = db;
    }
  }
}

void DecodeChunkScalar(TensorType type, const uint8_t* row, int64_t n_in, int64_t c, uint8_t* u, float* s, float* m) {
  std::memset(u, 0, kChunk);
  std::fill(s, s + kChunkLanes, 0.0f);
  switch (type) {
    case TensorType::kQ8_0:
    case TensorType::kQ4_0: {
      const bool q8 = type == TensorType::kQ8_0;
      const int bytes = q8 ? kQ8_0Bytes : kQ4_0Bytes;
      for (int h = 0; h < 2; ++h) {
        const int64_t b = 2 * c + h;
        if (b * 32 >= n_in) break;  // past the end: zero weights
        const uint8_t* blk = row + b * bytes;
        const float d = LoadF16(blk);
        for (int j = 0; j < 32; ++j) {
          uint8_t v;
          if (q8) {
            v = static_cast<uint8_t>(blk[2 + j] ^ 0x80);  // w + 128
          } else {
            v = j < 16 ? (blk[2 + j] & 0xF) : (blk[2 + j - 16] >> 4);  // w + 8
          }
          u[32 * h + j] = v;
        }
        for (int l = 0; l < 8; ++l) s[8 * h + l] = d;
      }
      return;
    }
    case TensorType::kQ4_K:
    case TensorType::kQ5_K: {
      const bool q5 = type == TensorType::kQ5_K;
      const int64_t sb = c / 4;
      const int g = static_cast<int>(c % 4);  // 64-element group within the superblock
      const uint8_t* blk = row + sb * (q5 ? kQ5_KBytes : kQ4_KBytes);
      const float d = LoadF16(blk), dmin = LoadF16(blk + 2);
      const uint8_t* scales = blk + 4;
      const uint8_t* qh = blk + 4 + kKScaleBytes;
      const uint8_t* qs = blk + 4 + kKScaleBytes + (q5 ? 32 : 0);
      for (int l = 0; l < 32; ++l) {
        uint8_t lo = qs[32 * g + l] & 0xF, hi = qs[32 * g + l] >> 4;
        if (q5) {
          lo |= ((qh[l] >> (2 * g)) & 1) << 4;
          hi |= ((qh[l] >> (2 * g + 1)) & 1) << 4;
        }
        u[l] = lo;
        u[32 + l] = hi;
      }
      int sc, mn;
      for (int h = 0; h < 2; ++h) {
        UnpackScaleMinK4(2 * g + h, scales, &sc, &mn);
        for (int l = 0; l < 8; ++l) s[8 * h + l] = d * static_cast<float>(sc);
      }
      if (g == 0 && m != nullptr) {
        std::fill(m, m + kChunkLanes, 0.0f);
        for (int j = 0; j < 8; ++j) {
          UnpackScaleMinK4(j, scales, &sc, &mn);
          m[j] = dmin * static_cast<float>(mn);
        }
      }
      return;
    }
    case TensorType::kQ6_K: {
      const int64_t sb = c / 4;
      const int g = static_cast<int>(c % 4);
      const uint8_t* blk = row + sb * kQ6_KBytes;
      const uint8_t* ql = blk;
      const uint8_t* qh = blk + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
      const float d = LoadF16(blk + 208);
      // Chunk g covers elements 64g..64g+63 = half h = g/2, k = 2*(g%2) + {0,1}.
      const int h = g / 2;
      for (int kk = 0; kk < 2; ++kk) {
        const int k4 = 2 * (g % 2) + kk;  // which of the 4 quarter-rows of the half
        for (int l = 0; l < 32; ++l) {
          const uint8_t lq = ql[64 * h + 32 * (k4 & 1) + l];
          const uint8_t low = (k4 < 2) ? (lq & 0xF) : (lq >> 4);
          const uint8_t high = (qh[32 * h + l] >> (2 * k4)) & 3;
          u[32 * kk + l] = static_cast<uint8_t>(low | (high << 4));
        }
      }
      for (int l = 0; l < kChunkLanes; ++l) s[l] = d * static_cast<float>(sc[4 * g + l / 4]);
      return;
    }
    default:
      KVX_CHECK_MSG(false, "DecodeChunkScalar: not an integer-path type");
  }
}

void MatMulRowsFloatScalar(const WeightView& w, const float* x, int64_t n_tokens, float* y, int64_t r0, int64_t r1) {
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = base + static_cast<size_t>(r) * w.row_bytes;
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* xt = x + t * w.n_in;
      float acc[kFloatLanes] = {};
      for (int64_t k = 0; k < w.n_in; ++k) {
        acc[k % kFloatLanes] = std::fma(FloatWeight(w.type, row, k), xt[k], acc[k % kFloatLanes]);
      }
      y[t * w.n_out + r] = ReduceLanes(acc);
    }
  }
}

namespace {

// The kInterleaved16 contract (matmul_internal.h), from the row's GGUF form.
void MatMulRowsInterleavedScalar(const WeightView& w, const QuantizedActs& a, float* y, int64_t r0, int64_t r1) {
  std::vector<uint8_t> row(RowBytesOf(w.type, w.n_in));
  const int64_t nb = w.n_in / kActBlock;
  for (int64_t r = r0; r < r1; ++r) {
    CopyRowAsStored(w, r, row.data());
    for (int64_t t = 0; t < a.n_tokens; ++t) {
      const int8_t* q = a.QRow(t);
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = row.data() + b * kQ8_0Bytes;
        int32_t isum = a.BlockBiasRow(t)[b];
        for (int j = 0; j < kActBlock; ++j) isum += static_cast<int32_t>(blk[2 + j] ^ 0x80) * q[kActBlock * b + j];
        acc = std::fma(static_cast<float>(isum), LoadF16(blk) * a.DsRow(t)[b], acc);
      }
      y[t * w.n_out + r] = acc;
    }
  }
}

}  // namespace

void MatMulRowsIntScalar(const WeightView& w, const QuantizedActs& a, float* y, int64_t r0, int64_t r1) {
  if (w.layout == WeightLayout::kInterleaved16) return MatMulRowsInterleavedScalar(w, a, y, r0, r1);
  const IntTypeInfo info = GetIntTypeInfo(w.type);
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  const int64_t n_chunks = a.k_pad / kChunk;
  uint8_t u[kChunk];
  float s[kChunkLanes], m[kChunkLanes];
  std::vector<uint8_t> stored;  // a row of a repacked matrix, back in GGUF form
  if (w.layout != WeightLayout::kRows) stored.resize(RowBytesOf(w.type, w.n_in));
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = base + static_cast<size_t>(r) * w.row_bytes;
    if (w.layout != WeightLayout::kRows) {
      CopyRowAsStored(w, r, stored.data());
      row = stored.data();
    }
    for (int64_t t = 0; t < a.n_tokens; ++t) {
      const int8_t* q = a.QRow(t);
      const float* da = a.DRow(t);
      const int32_t* bias = a.BiasRow(t);
      const float* sa = a.SaRow(t);
      float acc[kChunkLanes] = {};
      for (int64_t c = 0; c < n_chunks; ++c) {
        DecodeChunkScalar(w.type, row, w.n_in, c, u, s, m);
        for (int l = 0; l < kChunkLanes; ++l) {
          int32_t i = info.bias_shift >= 0 ? bias[16 * c + l] * (1 << info.bias_shift) : 0;
          for (int e = 0; e < 4; ++e) i += static_cast<int32_t>(u[4 * l + e]) * q[kChunk * c + 4 * l + e];
          acc[l] = std::fma(static_cast<float>(i), s[l] * da[16 * c + l], acc[l]);
        }
        if (info.has_min && c % 4 == 3) {  // m was filled at chunk c - 3
          for (int j = 0; j < 8; ++j) acc[j] = std::fma(-m[j], sa[8 * (c / 4) + j], acc[j]);
        }
      }
      y[t * w.n_out + r] = ReduceLanes(acc);
    }
  }
}

}  // namespace kvx::ops::internal
