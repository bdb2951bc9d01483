// Scores of queries against one page of pre-RoPE keys (KVQuant, prerope=1):
// the keys are cached before RoPE (and, with rotate=hadamard, in the
// Hadamard basis), so attention decodes them, rotates them back, ropes them
// at their stored positions and dots them with the queries, at every step.
//
// RoPE angles are linear in the position, R(p0 + t) = R(p0) R(t), and
// rotations are orthogonal, so q . R(p0 + t) k = (R(-p0) q) . (R(t) k): the
// queries are rotated back once per page by its smallest position p0 and
// each key by its offset t = pos - p0, whose cos/sin (t < T when the page
// holds consecutive positions) stay in cache. The Hadamard rotation Q does
// not commute with RoPE, so the keys' Q^-1 cannot move to the query: it is
// applied to every decoded key.
//
// Two paths, the same scores up to float rounding:
//  - channel-major (AVX-512, f16 and KIVI key pages: both store keys
//    channel-major): 16 entries at a time, every step a vertical operation
//    on channel rows (simd_avx512_prerope.h);
//  - the reference: the page's keys decoded to rows, each row rotated back
//    and roped, then the row-major dot. Every other codec, shape and CPU.
//
// Thread-safety: per-thread scratch; concurrent calls on one page are safe.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kv/codec/codecs.h"
#include "kv/codec/simd_avx512_prerope.h"
#include "kv/page_table.h"
#include "kv/sequence_kv.h"
#include "ops/nn.h"

namespace kvx::kv::prerope {

struct Scratch {
  std::vector<float> qrot;      // [rows][D] the queries rotated back to the page's first position
  std::vector<float> tile;      // [T][D] decoded keys (reference path)
  std::vector<float> cs;        // [2][n_dims/2][T] cos, then sin, per pair and entry (a page of scattered positions)
  std::vector<float> scale_min; // [2][D] KIVI keys' per-channel scale, then min, as floats
};
inline thread_local Scratch tls_scratch;

// cos (cols[i * T + t]) and sin (cols[(half + i) * T + t]) of pair i at
// offsets t < T: the offsets of a page of consecutive positions, computed
// once per thread and RoPE configuration.
inline const float* OffsetRopeColumns(const ops::RopeParams& rope, int T) {
  struct Cache {
    ops::RopeParams rope{};
    int T = 0;
    std::vector<float> cols;
  };
  thread_local Cache cache;
  const ops::RopeParams& c = cache.rope;
  if (cache.T != T || c.n_dims != rope.n_dims || c.freq_base != rope.freq_base || c.freq_scale != rope.freq_scale ||
      c.freq_factors != rope.freq_factors || c.neox != rope.neox) {
    const int half = rope.n_dims / 2;
    cache.cols.resize(static_cast<size_t>(2 * half) * T);
    std::vector<float> cs(static_cast<size_t>(rope.n_dims));
    for (int t = 0; t < T; ++t) {
      ops::RopeCosSin(t, rope, cs.data());
      for (int i = 0; i < half; ++i) {
        cache.cols[static_cast<size_t>(i) * T + t] = cs[2 * i];
        cache.cols[static_cast<size_t>(half + i) * T + t] = cs[2 * i + 1];
      }
    }
    cache.rope = rope;
    cache.T = T;
  }
  return cache.cols.data();
}

// The cos/sin columns (OffsetRopeColumns' layout, stride T) of the page's
// entries at offsets pos[j] - p0: the cached ones when the positions are
// consecutive, else gathered into `out` (dead entries, which are masked
// later, at offset 0).
inline const float* PageRopeColumns(const SequenceKV& kv, const int32_t* pos, int32_t p0, int m, int T,
                                    std::vector<float>* out) {
  const ops::RopeParams& rope = kv.rope();
  bool consecutive = true;
  for (int j = 0; j < m && consecutive; ++j) consecutive = pos[j] == p0 + j;
  if (consecutive) return OffsetRopeColumns(rope, T);
  const int half = rope.n_dims / 2;
  out->assign(static_cast<size_t>(2 * half) * T, 0.0f);
  for (int j = 0; j < m; ++j) {
    const float* cs = kv.RopeCosSin(pos[j] == kDeadPosition ? 0 : pos[j] - p0);
    for (int i = 0; i < half; ++i) {
      (*out)[static_cast<size_t>(i) * T + j] = cs[2 * i];
      (*out)[static_cast<size_t>(half + i) * T + j] = cs[2 * i + 1];
    }
  }
  return out->data();
}

// Rotates x (one head) by RoPE at position `at` (its inverse with `inverse`).
inline void RopeHead(const SequenceKV& kv, float* x, int32_t at, bool inverse) {
  const ops::RopeParams& rope = kv.rope();
  const float* cs = kv.RopeCosSin(at);
  if (simd::UseSimd(kv.layout().head_dim) && (rope.neox ? rope.n_dims % 16 == 0 : rope.n_dims % 8 == 0)) {
    return simd::RopeRow(x, cs, rope.n_dims, rope.neox, inverse);
  }
  if (!inverse) return ops::RopeApply(x, cs, rope);
  float neg[2 * kMaxHeadDim];
  for (int i = 0; i < rope.n_dims; i += 2) neg[i] = cs[i], neg[i + 1] = -cs[i + 1];
  ops::RopeApply(x, neg, rope);
}

// The reference path: s[r*ss + j] = qrot_r . R(pos_j - p0) Q^-1 k_j from
// keys decoded to rows.
template <PageCodec C>
void ReferenceScores(const SequenceKV& kv, const CodecParams& params, const uint8_t* page, int m, int32_t p0,
                     const float* qrot, int nr, float* s, int ss) {
  const int D = kv.layout().head_dim;
  const int32_t* pos = PagePositions(page);
  std::vector<float>& tile = tls_scratch.tile;
  tile.resize(static_cast<size_t>(m) * D);
  C::DecodeKeys(params, page + PageDataOffset(params.page_tokens), m, tile.data());
  for (int j = 0; j < m; ++j) {
    float* row = &tile[static_cast<size_t>(j) * D];
    if (pos[j] == kDeadPosition) continue;  // never attended (masked by the caller), has no RoPE angle
    if (kv.keys_rotated()) kv.rotation()->Inverse(row);
    RopeHead(kv, row, pos[j] - p0, /*inverse=*/false);
  }
  if (simd::UseSimd(D)) {
    simd::DotRowsQN(simd::F32Rows{tile.data(), D}, m, D, qrot, nr, s, ss);
    return;
  }
  for (int r = 0; r < nr; ++r) {
    F32Codec::ScoresScalar(tile.data(), D, m, qrot + static_cast<size_t>(r) * D, s + static_cast<size_t>(r) * ss);
  }
}

// The channel-major path (simd_avx512_prerope.h) when this CPU, the codec
// and the shape allow it; false (nothing done) otherwise.
template <PageCodec C>
bool ColumnScores(const SequenceKV& kv, const CodecParams& params, const uint8_t* page, int m, int32_t p0,
                  const float* qrot, int nr, float* s, int ss) {
#ifdef KVX_KV_HAVE_X86_SIMD
  constexpr bool kF16 = std::is_same_v<C, F16Codec>, kKivi = std::is_same_v<C, KiviCodec>;
  const int D = params.head_dim, T = params.page_tokens;
  if (!(kF16 || kKivi) || !simd::UseAvx512() || D % 16 != 0 || D > simd::avx512::kMaxPreRopeDim || T % 16 != 0) {
    return false;
  }
  const ops::RopeParams& rope = kv.rope();
  simd::avx512::PreRopeShape shape{D, rope.n_dims, rope.neox, 0, nullptr, nullptr, nullptr, T};
  if (kv.keys_rotated()) {
    shape.hadamard_block = kv.rotation()->block();
    shape.unrotate = kv.rotation()->inverse_factors();
  } else {
    static const std::vector<float> ones(kMaxHeadDim, 1.0f);
    shape.unrotate = ones.data();
  }
  const float* cols = PageRopeColumns(kv, PagePositions(page), p0, m, T, &tls_scratch.cs);
  shape.cos = cols;
  shape.sin = cols + static_cast<size_t>(rope.n_dims / 2) * T;
  const uint8_t* data = page + PageDataOffset(T);
  auto run = [&](const auto& src) {
    simd::WithQueryRows(nr, [&](auto rows) {
      simd::avx512::PreRopeScores<decltype(rows)::value>(src, m, shape, qrot, s, ss);
    });
  };
  if constexpr (kF16) {
    run(simd::avx512::F16KeyColumns{F16Codec::Keys(data), T});
    return true;
  } else if constexpr (kKivi) {
    const int cb = ChannelTensor::ColBytes(params, params.k_bits);
    if (params.outliers > 0 || cb % 16 != 0) return false;
    std::vector<float>& sm = tls_scratch.scale_min;
    sm.resize(static_cast<size_t>(2) * D);
    const uint16_t* st = ChannelTensor::Stats(params, params.k_bits, data);
    for (int c = 0; c < D; ++c) {
      sm[c] = HalfToFloatFast(st[2 * c]);
      sm[D + c] = HalfToFloatFast(st[2 * c + 1]);
    }
    DispatchBits(params.k_bits, [&](auto bits) {
      run(simd::avx512::CodeKeyColumns<decltype(bits)::value>{data, cb, sm.data(), sm.data() + D});
    });
    return true;
  }
#endif
  return false;
}

// s[r*ss + j] = q_r . RoPE(pos_j, Q^-1 k_j) for the page's m entries (q:
// [nr][D], already scaled), the page encoded with codec C and `params`.
// Entries at kDeadPosition get some finite score, which the caller masks.
template <PageCodec C>
void Scores(const SequenceKV& kv, const CodecParams& params, const uint8_t* page, int m, const float* q, int nr,
            float* s, int ss) {
  const int D = kv.layout().head_dim;
  const int32_t* pos = PagePositions(page);
  int32_t p0 = pos[0];  // the smallest position (dead slots hold the largest, kDeadPosition)
  for (int j = 1; j < m; ++j) p0 = std::min(p0, pos[j]);
  if (p0 == kDeadPosition) return;  // a sink page whose entries all died: masked by the caller
  std::vector<float>& qrot = tls_scratch.qrot;
  qrot.assign(q, q + static_cast<size_t>(nr) * D);
  for (int r = 0; r < nr; ++r) RopeHead(kv, &qrot[static_cast<size_t>(r) * D], p0, /*inverse=*/true);
  if (ColumnScores<C>(kv, params, page, m, p0, qrot.data(), nr, s, ss)) return;
  ReferenceScores<C>(kv, params, page, m, p0, qrot.data(), nr, s, ss);
}

}  // namespace kvx::kv::prerope
