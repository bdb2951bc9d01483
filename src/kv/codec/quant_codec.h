// Quantized page codecs: per-token int8/int4/int2 (TokenQuantCodec) and KIVI
// (KiviCodec), both with optional dense-and-sparse outliers.
//
//   TokenQuantCodec  K and V per token: each row's `group` consecutive
//                    channels share an f16 (scale, zero point) — llama.cpp's
//                    q8_0/q4_0 idea, asymmetric. Row-wise: a token is encoded
//                    the moment it arrives (unless outliers or a residual
//                    window ask for sealing).
//   KiviCodec        KIVI (arXiv 2402.02750): K per CHANNEL over the page's T
//                    tokens (one (scale, min) per channel per page, so the
//                    few large-magnitude key channels do not blow up every
//                    token's range), V per token as above. Needs the whole
//                    page, so it is always sealed.
//
// Page data layout (offsets rounded up to 8 bytes):
//   K codes | K params | V codes [T][d*vb/8] | V params [T][d/group][2] f16
//   | K outliers | V outliers
// K codes are [T][d*kb/8] per token, or for KIVI channel-major [d][T*kb/8]
// (each channel's T codes packed along the page: ChannelTensor); K params
// are [T][d/group][2] f16 (per token) or [d][2] f16 (per channel).
// Outliers (p.outliers per tensor, KVQuant's dense-and-sparse): the entries
// farthest from their quantization group's mean (|x - mean|: the ones that
// stretch the group's min/max most) are excluded from the group's range and
// kept exactly as f32 with their index (quant.h); attention adds the
// correction q_c (x - x^dense) to the score and p (x - x^dense) to the output.
//
// Bytes per token per (layer, head), d = 64, group 32, no outliers:
//   int8 72+4+72+4 = 152 (+4 position) | int4 40+40 | int2 24+24 | kivi2 (T=128) 16+2+16+8.
//
// Thread-safety: stateless.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kv/codec/codec_id.h"
#include "kv/codec/f32_codec.h"
#include "kv/codec/quant.h"
#include "kv/codec/simd_x86.h"
#include "kv/layout.h"
#include "util/check.h"

namespace kvx::kv {

// Calls fn(std::integral_constant<int, B>{}) for bits B in {2, 4, 8}.
template <typename Fn>
decltype(auto) DispatchBits(int bits, Fn&& fn) {
  switch (bits) {
    case 8: return fn(std::integral_constant<int, 8>{});
    case 4: return fn(std::integral_constant<int, 4>{});
    case 2: return fn(std::integral_constant<int, 2>{});
  }
  KVX_CHECK_MSG(false, "quantized codecs support 2, 4 or 8 bits");
}

// A per-token quantized tensor: codes [T][R], then per group f16 (scale, min)
// [T][G][2], or with p.sym only the scale [T][G][1]. A layer's head_dim is a
// multiple of its group; the key block of a ThinK pruned page (its kept
// channel rows, a multiple of 8) may end in a shorter last group.
struct TokenTensor {
  static constexpr bool kRowWise = true;

  static int Groups(const CodecParams& p) { return (p.head_dim + p.group - 1) / p.group; }
  static int StatsPerGroup(const CodecParams& p) { return p.sym ? 1 : 2; }
  static size_t CodeBytes(const CodecParams& p, int bits) {
    return AlignUp(static_cast<size_t>(p.page_tokens) * quant::RowBytes(p.head_dim, bits), 8);
  }
  static size_t Bytes(const CodecParams& p, int bits) {
    return CodeBytes(p, bits) + AlignUp(static_cast<size_t>(p.page_tokens) * Groups(p) * StatsPerGroup(p) * 2, 8);
  }
  static const uint16_t* Stats(const CodecParams& p, int bits, const uint8_t* base) {
    return reinterpret_cast<const uint16_t*>(base + CodeBytes(p, bits));
  }
  // (scale, min) of group g of row j as floats (x^ = min + scale * q).
  static void GroupParams(const CodecParams& p, int bits, const uint8_t* base, int j, int g, float* s, float* m) {
    const uint16_t* st = Stats(p, bits, base) + (static_cast<size_t>(j) * Groups(p) + g) * StatsPerGroup(p);
    *s = HalfToFloatFast(st[0]);
    *m = p.sym ? -static_cast<float>(quant::SymZero(bits)) * *s : HalfToFloatFast(st[1]);
  }

  // dev[j*d + c] = |x - mean of its row group| (outlier ranking).
  static void Deviations(const CodecParams& p, int n, const float* x, float* dev) {
    const int d = p.head_dim, g = p.group;
    for (int j = 0; j < n; ++j) {
      for (int c0 = 0; c0 < d; c0 += g) {
        const float* xg = x + static_cast<size_t>(j) * d + c0;
        const int w = std::min(g, d - c0);
        float mean = 0;
        for (int c = 0; c < w; ++c) mean += xg[c];
        mean /= static_cast<float>(w);
        for (int c = 0; c < w; ++c) dev[static_cast<size_t>(j) * d + c0 + c] = std::fabs(xg[c] - mean);
      }
    }
  }

  // Encodes row x[d] into slot j; skip[c] != 0 excludes x[c] from its group's range.
  static void EncodeRow(const CodecParams& p, int bits, uint8_t* base, int j, const float* x, const uint8_t* skip) {
    const int d = p.head_dim, g = p.group, groups = Groups(p);
    uint8_t codes[kMaxHeadDim];
    const int spg = StatsPerGroup(p);
    uint16_t* st = reinterpret_cast<uint16_t*>(base + CodeBytes(p, bits)) + static_cast<size_t>(j) * groups * spg;
    for (int gi = 0; gi < groups; ++gi) {
      const int c0 = gi * g, w = std::min(g, d - c0);
      float s, m;
      quant::ChooseGroup(x + c0, w, 1, skip == nullptr ? nullptr : skip + c0, bits, p.sym, p.clip, st + spg * gi, &s,
                         &m);
      for (int c = c0; c < c0 + w; ++c) codes[c] = quant::QuantizeOne(x[c], s, m, bits);
    }
    quant::PackRow(codes, d, bits, base + static_cast<size_t>(j) * quant::RowBytes(d, bits));
  }
  static void EncodeRows(const CodecParams& p, int bits, uint8_t* base, int n, const float* x, const uint8_t* skip) {
    const size_t d = static_cast<size_t>(p.head_dim);
    for (int j = 0; j < n; ++j) EncodeRow(p, bits, base, j, x + j * d, skip == nullptr ? nullptr : skip + j * d);
  }

  static float At(const CodecParams& p, int bits, const uint8_t* base, int j, int c) {
    const int d = p.head_dim;
    float s, m;
    GroupParams(p, bits, base, j, c / p.group, &s, &m);
    return m + s * static_cast<float>(quant::CodeAt(base + static_cast<size_t>(j) * quant::RowBytes(d, bits), d, bits, c));
  }
  static void Decode(const CodecParams& p, int bits, const uint8_t* base, int n, float* out);

  // SIMD path: rows in blocks of kRowBlock whose f16 group parameters are
  // converted to floats once, then the multi-query kernels.
  static constexpr int kRowBlock = 16;
  static bool UseSimd(const CodecParams& p, int bits) { return simd::UseSimdQuant(p.head_dim, bits) && p.group % 8 == 0; }
  template <typename Fn>
  static void ForRowBlocks(const CodecParams& p, int bits, const uint8_t* base, int n, Fn&& fn) {
    const int groups = Groups(p), rb = quant::RowBytes(p.head_dim, bits);
    float params[kRowBlock * 2 * (kMaxHeadDim / 8)];
    for (int j0 = 0; j0 < n; j0 += kRowBlock) {
      const int nb = std::min(kRowBlock, n - j0);
      if (p.sym) {  // scales only: expand to (s, -z s) pairs
        const float z = static_cast<float>(quant::SymZero(bits));
        simd::HalfToFloat(Stats(p, bits, base) + static_cast<size_t>(j0) * groups, nb * groups, params + nb * groups);
        for (int i = 0; i < nb * groups; ++i) {
          const float sc = params[nb * groups + i];
          params[2 * i] = sc;
          params[2 * i + 1] = -z * sc;
        }
      } else {
        simd::HalfToFloat(Stats(p, bits, base) + static_cast<size_t>(j0) * groups * 2, nb * groups * 2, params);
      }
      DispatchBits(bits, [&](auto b) {
        constexpr int B = decltype(b)::value;
        const simd::TokenRows<B> src{base + static_cast<size_t>(j0) * rb, params, rb, groups, __builtin_ctz(p.group)};
        fn(src, j0, nb);
      });
    }
  }

  static void Dot(const CodecParams& p, int bits, const uint8_t* base, int n, const float* q, int nq, float* s,
                  int ss) {
    const int d = p.head_dim;
    if (UseSimd(p, bits)) {
      ForRowBlocks(p, bits, base, n, [&](const auto& src, int j0, int nb) {
        simd::DotRowsQN(src, nb, d, q, nq, s + j0, ss);
      });
      return;
    }
    float row[kMaxHeadDim];
    for (int j = 0; j < n; ++j) {
      for (int c = 0; c < d; ++c) row[c] = At(p, bits, base, j, c);
      for (int r = 0; r < nq; ++r) s[static_cast<size_t>(r) * ss + j] = DotF32(q + static_cast<size_t>(r) * d, row, d);
    }
  }

  static void Axpy(const CodecParams& p, int bits, const uint8_t* base, int n, const float* w, int nq, int ws,
                   float* acc);

  // Row `from_slot` of `from` (codes and group parameters, as stored) into row `to_slot` of `to`.
  static void CopyRow(const CodecParams& p, int bits, const uint8_t* from, int from_slot, uint8_t* to, int to_slot) {
    const size_t rb = static_cast<size_t>(quant::RowBytes(p.head_dim, bits));
    std::memcpy(to + to_slot * rb, from + from_slot * rb, rb);
    const size_t stats = static_cast<size_t>(Groups(p)) * StatsPerGroup(p);
    std::memcpy(const_cast<uint16_t*>(Stats(p, bits, to)) + to_slot * stats, Stats(p, bits, from) + from_slot * stats,
                sizeof(uint16_t) * stats);
  }
};

inline void TokenTensor::Decode(const CodecParams& p, int bits, const uint8_t* base, int n, float* out) {
  const int d = p.head_dim;
  if (UseSimd(p, bits)) {
    ForRowBlocks(p, bits, base, n, [&](const auto& src, int j0, int nb) {
      simd::DecodeRowsQ(src, nb, d, out + static_cast<size_t>(j0) * d);
    });
    return;
  }
  for (int j = 0; j < n; ++j) {
    for (int c = 0; c < d; ++c) out[static_cast<size_t>(j) * d + c] = At(p, bits, base, j, c);
  }
}

inline void TokenTensor::Axpy(const CodecParams& p, int bits, const uint8_t* base, int n, const float* w, int nq,
                              int ws, float* acc) {
  {
    const int d = p.head_dim;
    if (UseSimd(p, bits)) {
      ForRowBlocks(p, bits, base, n, [&](const auto& src, int j0, int nb) {
        simd::AxpyRowsQN(src, nb, d, w + j0, nq, ws, acc);
      });
      return;
    }
    float row[kMaxHeadDim];
    for (int j = 0; j < n; ++j) {
      for (int c = 0; c < d; ++c) row[c] = At(p, bits, base, j, c);
      for (int r = 0; r < nq; ++r) {
        const float wj = w[static_cast<size_t>(r) * ws + j];
        if (wj == 0.0f) continue;
        float* a = acc + static_cast<size_t>(r) * d;
        for (int c = 0; c < d; ++c) a[c] += wj * row[c];
      }
    }
  }
}

// A per-channel quantized tensor (KIVI keys): codes [T][R], then f16
// (scale, min) [d][2] shared by the page's tokens.
struct ChannelTensor {
  static constexpr bool kRowWise = false;

  // Codes are stored channel-major: column c (channel c of the page's T
  // entries) at base + c * ColBytes, planar-packed along the entries
  // (quant::PackRow over T codes: entry j in byte j % ColBytes at bit shift
  // bits * (j / ColBytes)). One 16-byte load then gives 16 consecutive
  // entries of a channel per plane, and scores come out 16 entries per
  // vector (simd::DotCodeColumns) instead of one horizontal sum per entry.
  // REQUIRES: page_tokens * bits % 8 == 0 (ValidateCodecConfig).
  static int ColBytes(const CodecParams& p, int bits) { return quant::RowBytes(p.page_tokens, bits); }
  static size_t CodeBytes(const CodecParams& p, int bits) {
    return AlignUp(static_cast<size_t>(p.head_dim) * ColBytes(p, bits), 8);
  }
  static size_t Bytes(const CodecParams& p, int bits) {
    return CodeBytes(p, bits) + AlignUp(static_cast<size_t>(p.head_dim) * 4, 8);
  }
  static const uint16_t* Stats(const CodecParams& p, int bits, const uint8_t* base) {
    return reinterpret_cast<const uint16_t*>(base + CodeBytes(p, bits));
  }

  // dev[j*d + c] = |x - mean of channel c over the n rows|.
  static void Deviations(const CodecParams& p, int n, const float* x, float* dev) {
    const int d = p.head_dim;
    for (int c = 0; c < d; ++c) {
      float mean = 0;
      for (int j = 0; j < n; ++j) mean += x[static_cast<size_t>(j) * d + c];
      mean /= static_cast<float>(n);
      for (int j = 0; j < n; ++j) dev[static_cast<size_t>(j) * d + c] = std::fabs(x[static_cast<size_t>(j) * d + c] - mean);
    }
  }

  static void EncodeRow(const CodecParams&, int, uint8_t*, int, const float*, const uint8_t*) {
    KVX_CHECK_MSG(false, "per-channel quantization encodes whole pages");
  }
  // Encodes rows x[n][d] (n = T: the page is sealed); skip as in TokenTensor.
  static void EncodeRows(const CodecParams& p, int bits, uint8_t* base, int n, const float* x, const uint8_t* skip) {
    const int d = p.head_dim, T = p.page_tokens, cb = ColBytes(p, bits);
    uint16_t* st = reinterpret_cast<uint16_t*>(base + CodeBytes(p, bits));
    std::vector<uint8_t> column(static_cast<size_t>(T), 0);
    for (int c = 0; c < d; ++c) {
      float s, m;
      // No clipping search here: clipping a key channel's extremes distorts
      // the largest scores (measured: KIVI + clip is worse).
      quant::ChooseGroup(x + c, n, d, skip == nullptr ? nullptr : skip + c, bits, /*sym=*/false, /*clip=*/false,
                         st + 2 * c, &s, &m);
      for (int j = 0; j < n; ++j) column[j] = quant::QuantizeOne(x[static_cast<size_t>(j) * d + c], s, m, bits);
      quant::PackRow(column.data(), T, bits, base + static_cast<size_t>(c) * cb);
    }
  }

  static float At(const CodecParams& p, int bits, const uint8_t* base, int j, int c) {
    return quant::Dequant(Stats(p, bits, base) + 2 * c,
                          quant::CodeAt(base + static_cast<size_t>(c) * ColBytes(p, bits), p.page_tokens, bits, j));
  }

  // Rows out[n][d] (pre-RoPE scoring, page conversion, tests).
  static void Decode(const CodecParams& p, int bits, const uint8_t* base, int n, float* out) {
    const int d = p.head_dim;
    if (simd::UseSimdQuant(d, bits) && DispatchBits(bits, [&](auto b) {
          return simd::DecodeCodeColumns<decltype(b)::value>(base, ColBytes(p, bits), Stats(p, bits, base), n, d, out);
        })) {
      return;
    }
    for (int j = 0; j < n; ++j) {
      for (int c = 0; c < d; ++c) out[static_cast<size_t>(j) * d + c] = At(p, bits, base, j, c);
    }
  }

  // s[r*ss + j] = q_r . x_j with x = min + scale * code per channel:
  // (q_r * scale) . code_j + q_r . min, the queries scaled once per page.
  static void Dot(const CodecParams& p, int bits, const uint8_t* base, int n, const float* q, int nq, float* s,
                  int ss) {
    const int d = p.head_dim, T = p.page_tokens, cb = ColBytes(p, bits);
    const uint16_t* st = Stats(p, bits, base);
    KVX_CHECK(nq <= kMaxQueryRows);
    float qs[kMaxQueryRows * kMaxHeadDim], bias[kMaxQueryRows];
    const bool simd = simd::UseSimdQuant(d, bits);
    if (!(simd && simd::ScaleQueriesByChannel(st, d, q, nq, qs, bias))) {
      for (int r = 0; r < nq; ++r) {
        const float* qr = q + static_cast<size_t>(r) * d;
        bias[r] = 0.0f;
        for (int c = 0; c < d; ++c) {
          qs[static_cast<size_t>(r) * d + c] = qr[c] * HalfToFloatFast(st[2 * c]);
          bias[r] += qr[c] * HalfToFloatFast(st[2 * c + 1]);
        }
      }
    }
    if (simd) {
      const bool done = DispatchBits(bits, [&](auto b) {
        return simd::DotCodeColumns<decltype(b)::value>(base, cb, n, d, qs, nq, bias, s, ss);
      });
      if (done) return;
    }
    for (int r = 0; r < nq; ++r) {
      const float* qr = qs + static_cast<size_t>(r) * d;
      for (int j = 0; j < n; ++j) {
        float acc = 0.0f;
        for (int c = 0; c < d; ++c) {
          acc += qr[c] * static_cast<float>(quant::CodeAt(base + static_cast<size_t>(c) * cb, T, bits, j));
        }
        s[static_cast<size_t>(r) * ss + j] = acc + bias[r];
      }
    }
  }
};

// K stored as KT (TokenTensor or ChannelTensor), V per token, optional outliers.
template <class KT>
struct QuantCodec {
  static constexpr bool kRowWise = KT::kRowWise;

  struct Layout {
    size_t v = 0, k_out = 0, v_out = 0, bytes = 0;
  };
  static Layout LayoutOf(const CodecParams& p) {
    Layout l;
    l.v = KT::Bytes(p, p.k_bits);
    l.k_out = l.v + TokenTensor::Bytes(p, p.v_bits);
    const size_t out = p.outliers > 0 ? quant::OutlierBytes(p.outliers, p.page_tokens, p.head_dim) : 0;
    l.v_out = l.k_out + out;
    l.bytes = l.v_out + out;
    return l;
  }

  static size_t DataBytes(const CodecParams& p) { return LayoutOf(p).bytes; }

  // REQUIRES: kRowWise and p.outliers == 0 (SequenceKV seals pages otherwise).
  static void EncodeRow(const CodecParams& p, uint8_t* data, int slot, const float* k, const float* v) {
    KVX_DCHECK(p.outliers == 0);
    const Layout l = LayoutOf(p);
    KT::EncodeRow(p, p.k_bits, data, slot, k, nullptr);
    TokenTensor::EncodeRow(p, p.v_bits, data + l.v, slot, v, nullptr);
  }

  static void EncodePage(const CodecParams& p, uint8_t* data, int n, const float* k, const float* v) {
    const Layout l = LayoutOf(p);
    if (p.outliers == 0) {
      KT::EncodeRows(p, p.k_bits, data, n, k, nullptr);
      TokenTensor::EncodeRows(p, p.v_bits, data + l.v, n, v, nullptr);
      return;
    }
    const int entries = n * p.head_dim;
    KVX_CHECK(p.outliers <= entries);
    std::vector<float> dev(static_cast<size_t>(entries));
    std::vector<uint8_t> skip(static_cast<size_t>(entries));
    KT::Deviations(p, n, k, dev.data());
    quant::SelectOutliers(k, dev.data(), entries, p.outliers, p.page_tokens, p.head_dim, skip.data(), data + l.k_out);
    KT::EncodeRows(p, p.k_bits, data, n, k, skip.data());
    TokenTensor::Deviations(p, n, v, dev.data());
    quant::SelectOutliers(v, dev.data(), entries, p.outliers, p.page_tokens, p.head_dim, skip.data(), data + l.v_out);
    TokenTensor::EncodeRows(p, p.v_bits, data + l.v, n, v, skip.data());
  }

  static void DecodeKeys(const CodecParams& p, const uint8_t* data, int n, float* k) {
    KT::Decode(p, p.k_bits, data, n, k);
    if (p.outliers > 0) Patch(Outliers(p, data + LayoutOf(p).k_out), n * p.head_dim, k);
  }
  static void DecodeValues(const CodecParams& p, const uint8_t* data, int n, float* v) {
    const Layout l = LayoutOf(p);
    TokenTensor::Decode(p, p.v_bits, data + l.v, n, v);
    if (p.outliers > 0) Patch(Outliers(p, data + l.v_out), n * p.head_dim, v);
  }

  static void Scores(const CodecParams& p, const uint8_t* data, int n, const float* q, int nq, float* s, int ss) {
    KT::Dot(p, p.k_bits, data, n, q, nq, s, ss);
    if (p.outliers == 0) return;
    // Sparse part: s_j += q_c (x - x^dense) for each outlier (j, c).
    const int d = p.head_dim;
    const quant::OutlierList o = Outliers(p, data + LayoutOf(p).k_out);
    for (int i = 0; i < o.n; ++i) {
      const uint32_t at = o.Index(i);
      const int j = static_cast<int>(at / d), c = static_cast<int>(at % d);
      if (j >= n) break;  // sorted by index
      const float delta = o.value[i] - KT::At(p, p.k_bits, data, j, c);
      for (int r = 0; r < nq; ++r) s[static_cast<size_t>(r) * ss + j] += q[static_cast<size_t>(r) * d + c] * delta;
    }
  }

  static void AccumulateValues(const CodecParams& p, const uint8_t* data, int n, const float* w, int nq, int ws,
                               float* acc) {
    const Layout l = LayoutOf(p);
    TokenTensor::Axpy(p, p.v_bits, data + l.v, n, w, nq, ws, acc);
    if (p.outliers == 0) return;
    // Sparse part: acc_c += w_j (x - x^dense) for each outlier (j, c).
    const int d = p.head_dim;
    const quant::OutlierList o = Outliers(p, data + l.v_out);
    for (int i = 0; i < o.n; ++i) {
      const uint32_t at = o.Index(i);
      const int j = static_cast<int>(at / d), c = static_cast<int>(at % d);
      if (j >= n) break;
      const float delta = o.value[i] - TokenTensor::At(p, p.v_bits, data + l.v, j, c);
      for (int r = 0; r < nq; ++r) acc[static_cast<size_t>(r) * d + c] += w[static_cast<size_t>(r) * ws + j] * delta;
    }
  }

 private:
  static quant::OutlierList Outliers(const CodecParams& p, const uint8_t* base) {
    return quant::ReadOutliers(base, p.outliers, p.page_tokens, p.head_dim);
  }
  static void Patch(const quant::OutlierList& o, int entries, float* x) {
    for (int i = 0; i < o.n; ++i) {
      const uint32_t at = o.Index(i);
      if (static_cast<int>(at) >= entries) break;
      x[at] = o.value[i];
    }
  }
};

// int8 / int4 / int2: keys and values per token.
struct TokenQuantCodec : QuantCodec<TokenTensor> {
  // The page as a key block then a value block, for ThinK's pruned pages
  // (kv/pruned_keys.h; as F16Codec's): the key block (codes, then group
  // parameters) at head_dim = the stored key rows, in groups of p.group
  // channels, the last one shorter when the rows are not a multiple of it
  // (so a page keeping 39 of 64 channels stores 40 int8 rows, not 64); the
  // value block as a packed page stores it. Rows are independent, so
  // copying one copies its codes and parameters and re-quantizes nothing.
  // REQUIRES p.outliers == 0.
  static int KeyChannelMultiple(const CodecParams& p) {
    // Whole 8-byte blocks per bit plane (simd::UseSimdQuant); groups are
    // multiples of 8, so no 8 channels the kernels load straddle two.
    return std::max(8, 64 / p.k_bits);
  }
  static size_t KeyBlockBytes(const CodecParams& p) { return TokenTensor::Bytes(p, p.k_bits); }
  static size_t ValueBlockOffset(const CodecParams& p) { return LayoutOf(p).v; }
  static size_t ValueBlockBytes(const CodecParams& p) { return TokenTensor::Bytes(p, p.v_bits); }
  static void EncodeKeyRow(const CodecParams& p, uint8_t* keys, int slot, const float* k) {
    TokenTensor::EncodeRow(p, p.k_bits, keys, slot, k, nullptr);
  }
  static void EncodeValueRow(const CodecParams& p, uint8_t* values, int slot, const float* v) {
    TokenTensor::EncodeRow(p, p.v_bits, values, slot, v, nullptr);
  }
  static void CopyKeyRow(const CodecParams& p, const uint8_t* from, int from_slot, uint8_t* to, int to_slot) {
    TokenTensor::CopyRow(p, p.k_bits, from, from_slot, to, to_slot);
  }
  static void CopyValueRow(const CodecParams& p, const uint8_t* from, int from_slot, uint8_t* to, int to_slot) {
    TokenTensor::CopyRow(p, p.v_bits, from, from_slot, to, to_slot);
  }
  static void DecodeValueBlock(const CodecParams& p, const uint8_t* values, int n, float* v) {
    TokenTensor::Decode(p, p.v_bits, values, n, v);
  }
  static void AccumulateValueBlock(const CodecParams& p, const uint8_t* values, int n, const float* w, int nq, int ws,
                                   float* acc) {
    TokenTensor::Axpy(p, p.v_bits, values, n, w, nq, ws, acc);
  }
};
// kivi4 / kivi2: keys per channel over the page, values per token.
struct KiviCodec : QuantCodec<ChannelTensor> {};

static_assert(PageCodec<TokenQuantCodec>);
static_assert(PageCodec<KiviCodec>);

}  // namespace kvx::kv
