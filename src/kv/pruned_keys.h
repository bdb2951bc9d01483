// The pruned page format (page_table.h kPagePruned; ThinK, kv/policy/think.h):
// a page whose keys keep only some channels, the table's channel mask
// `kept` (ascending channel indices), and whose values are whole.
//
// One layout for every codec that has one (the "block codec" of a layer:
// F16Codec for f16 and f32 layers, the layer's TokenQuantCodec for int8,
// int4 and int2): after the page's position header,
//   key block    the block codec's key block at head_dim R = KeyRows:
//                row i is channel kept[i]; rows kept.size()..R-1 are zero
//                padding, so R is a multiple of what the codec's kernels
//                need (KeyChannelMultiple: 8 for f16's SIMD columns; whole
//                quantization groups and 8-byte bit planes for int8/4/2);
//   value block  the block codec's value block at the layer's head_dim d.
// f16: K^T[R][T] then V[T][d] f16. int8/4/2: per-token codes [T][R*kb/8]
// and (scale, min) [T][R/group] over the kept channels, then the values
// exactly as a packed page of the layer stores them (same bits, group,
// sym). Attention runs the block codec's own kernels: its Scores at head_dim
// R with the queries gathered to the kept channels once per work item
// (GatherQueries; a pruned channel reads as zero, so q.k over the page is
// q[kept].k[kept]), and its value accumulation; f16 pages also take the
// fused kernel (AttendRun).
//
// When a packed page is pruned (SequenceKV::PruneKeyChannels) its keys are
// decoded and the kept channels encoded again over the shorter rows (for a
// quantized codec: re-quantized in new groups of kept channels, the only
// extra error); values of a layer whose codec is the block codec are copied
// as stored (CopyValueBlock), those of an f32 layer are rounded to f16.
//
// Thread-safety: stateless.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "kv/codec/f16_codec.h"
#include "kv/codec/quant_codec.h"

namespace kvx::kv::pruned {

// The block codec of a layer codec, if pruned pages exist for it: f16 for
// f16 and f32 layers (f32 values are rounded to f16), the codec itself for
// the row-wise quantized ones. None for KIVI (keys per channel over a
// sealed page) and for outliers (side lists indexed by channel).
inline std::optional<CodecId> BlockCodec(CodecId layer, const CodecParams& p) {
  switch (layer) {
    case CodecId::kF16:
    case CodecId::kF32: return CodecId::kF16;
    case CodecId::kInt8:
    case CodecId::kInt4:
    case CodecId::kInt2:
      if (p.outliers > 0) return std::nullopt;
      return layer;
    case CodecId::kKivi4:
    case CodecId::kKivi2: return std::nullopt;
  }
  return std::nullopt;
}

// Calls fn(F16Codec{}) or fn(TokenQuantCodec{}) for a block codec id.
template <typename Fn>
decltype(auto) DispatchBlock(CodecId id, Fn&& fn) {
  if (id == CodecId::kF16) return fn(F16Codec{});
  KVX_CHECK_MSG(id == CodecId::kInt8 || id == CodecId::kInt4 || id == CodecId::kInt2,
                "pruned pages take f16, int8, int4 or int2 blocks");
  return fn(TokenQuantCodec{});
}

// Where everything of one pruned page is, for one (layer codec, kept count).
struct Shape {
  CodecId id = CodecId::kF16;  // the block codec
  CodecParams keys;            // its parameters at head_dim = rows
  CodecParams values;          // its parameters at the layer's head_dim
  int kept = 0, rows = 0;      // kept channels, stored key rows (kept + zero padding)
  int row_unit = 8;            // rows is a multiple of it (the block codec's KeyChannelMultiple)
  size_t value_offset = 0;     // the value block, from the page's data
  size_t page_bytes = 0;       // positions header, keys, values; aligned
};

// REQUIRES: BlockCodec(layer, p) has a value; 1 <= kept <= p.head_dim.
inline Shape ShapeFor(CodecId layer, const CodecParams& p, int kept) {
  Shape s;
  s.id = *BlockCodec(layer, p);
  s.kept = kept;
  s.values = p;
  DispatchBlock(s.id, [&](auto codec) {
    using C = decltype(codec);
    const int unit = C::KeyChannelMultiple(p);
    s.row_unit = unit;
    s.rows = (kept + unit - 1) / unit * unit;
    s.keys = p;
    s.keys.head_dim = s.rows;
    s.value_offset = C::KeyBlockBytes(s.keys);
    s.page_bytes = AlignUp(PageDataOffset(p.page_tokens) + s.value_offset + C::ValueBlockBytes(s.values), kPageAlign);
  });
  return s;
}

// Whether a packed page of `layer`'s codec stores its values as the pruned
// page does (then they are copied, not encoded again).
inline bool SharesValueBlock(const Shape& s, CodecId layer) { return s.id == layer; }

// Keys k [n][d] into slots 0..n-1 of the key block (pruned channels dropped).
inline void EncodeKeys(const Shape& s, const std::vector<int>& kept, uint8_t* data, int n, const float* k) {
  const int d = s.values.head_dim;
  float row[kMaxHeadDim];
  DispatchBlock(s.id, [&](auto codec) {
    using C = decltype(codec);
    for (int j = 0; j < n; ++j) {
      std::fill(row, row + s.rows, 0.0f);
      for (int i = 0; i < s.kept; ++i) row[i] = k[static_cast<size_t>(j) * d + kept[i]];
      C::EncodeKeyRow(s.keys, data, j, row);
    }
  });
}
inline void EncodeValues(const Shape& s, uint8_t* data, int n, const float* v) {
  const size_t d = static_cast<size_t>(s.values.head_dim);
  DispatchBlock(s.id, [&](auto codec) {
    for (int j = 0; j < n; ++j) decltype(codec)::EncodeValueRow(s.values, data + s.value_offset, j, v + j * d);
  });
}
// Stores n rows k, v ([n][d] floats) in slots 0..n-1.
inline void Encode(const Shape& s, const std::vector<int>& kept, uint8_t* data, int n, const float* k,
                   const float* v) {
  EncodeKeys(s, kept, data, n, k);
  EncodeValues(s, data, n, v);
}
// One row into `slot`, the other slots untouched.
inline void EncodeRow(const Shape& s, const std::vector<int>& kept, uint8_t* data, int slot, const float* k,
                      const float* v) {
  float row[kMaxHeadDim] = {};
  for (int i = 0; i < s.kept; ++i) row[i] = k[kept[i]];
  DispatchBlock(s.id, [&](auto codec) {
    using C = decltype(codec);
    C::EncodeKeyRow(s.keys, data, slot, row);
    C::EncodeValueRow(s.values, data + s.value_offset, slot, v);
  });
}
// The value block of a packed page (its data) into a pruned page's data, as stored.
// REQUIRES: SharesValueBlock(s, the packed page's codec).
inline void CopyValueBlock(const Shape& s, const uint8_t* packed, uint8_t* data) {
  DispatchBlock(s.id, [&](auto codec) {
    using C = decltype(codec);
    std::memcpy(data + s.value_offset, packed + C::ValueBlockOffset(s.values), C::ValueBlockBytes(s.values));
  });
}
// Row from_slot of page data `from` into row to_slot of `to`, as stored.
inline void CopyRow(const Shape& s, const uint8_t* from, int from_slot, uint8_t* to, int to_slot) {
  DispatchBlock(s.id, [&](auto codec) {
    using C = decltype(codec);
    C::CopyKeyRow(s.keys, from, from_slot, to, to_slot);
    C::CopyValueRow(s.values, from + s.value_offset, from_slot, to + s.value_offset, to_slot);
  });
}

// Rows 0..n-1 back as [n][d] floats; the pruned key channels read 0.
inline void Decode(const Shape& s, const std::vector<int>& kept, const uint8_t* data, int n, float* k, float* v) {
  const int d = s.values.head_dim;
  std::vector<float> rows(static_cast<size_t>(n) * s.rows);
  DispatchBlock(s.id, [&](auto codec) {
    using C = decltype(codec);
    C::DecodeKeys(s.keys, data, n, rows.data());
    C::DecodeValueBlock(s.values, data + s.value_offset, n, v);
  });
  std::fill(k, k + static_cast<size_t>(n) * d, 0.0f);
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < s.kept; ++i) k[static_cast<size_t>(j) * d + kept[i]] = rows[static_cast<size_t>(j) * s.rows + i];
  }
}

// qg[r][rows] = q[r][kept] (padding 0), for nr rows of d floats.
inline void GatherQueries(const std::vector<int>& kept, int rows, int d, const float* q, int nr,
                          std::vector<float>* qg) {
  const int nk = static_cast<int>(kept.size());
  qg->assign(static_cast<size_t>(nr) * rows, 0.0f);
  for (int r = 0; r < nr; ++r) {
    for (int i = 0; i < nk; ++i) (*qg)[static_cast<size_t>(r) * rows + i] = q[static_cast<size_t>(r) * d + kept[i]];
  }
}

// s[r * ss + j] = qg_r . K_j over the stored key rows: the block codec's
// Scores with the key rows as the head dimension (qg: GatherQueries).
inline void Scores(const Shape& s, const uint8_t* data, int m, const float* qg, int nr, float* out, int ss) {
  DispatchBlock(s.id, [&](auto codec) { decltype(codec)::Scores(s.keys, data, m, qg, nr, out, ss); });
}
// acc[r][c] += sum_j w[r*ws + j] V_j[c]: the block codec's value kernel.
inline void AccumulateValues(const Shape& s, const uint8_t* data, int m, const float* w, int nr, int ws, float* acc) {
  DispatchBlock(s.id, [&](auto codec) {
    decltype(codec)::AccumulateValueBlock(s.values, data + s.value_offset, m, w, nr, ws, acc);
  });
}

// --- f16 pruned pages (f16 and f32 layers) ---

inline Shape F16Shape(int page_tokens, int head_dim, int kept) {
  CodecParams p;
  p.page_tokens = page_tokens;
  p.head_dim = head_dim;
  return ShapeFor(CodecId::kF16, p, kept);
}
// Stored key channel rows of an f16 pruned page for `kept` channels (a multiple of 8).
inline int KeyRows(int kept) { return (kept + 7) / 8 * 8; }
inline size_t PageBytes(int page_tokens, int head_dim, int kept) { return F16Shape(page_tokens, head_dim, kept).page_bytes; }
inline void Encode(const std::vector<int>& kept, int T, int d, uint8_t* data, int n, const float* k, const float* v) {
  Encode(F16Shape(T, d, static_cast<int>(kept.size())), kept, data, n, k, v);
}
inline void Decode(const std::vector<int>& kept, int T, int d, const uint8_t* data, int n, float* k, float* v) {
  Decode(F16Shape(T, d, static_cast<int>(kept.size())), kept, data, n, k, v);
}
inline void GatherQueries(const std::vector<int>& kept, int d, const float* q, int nr, std::vector<float>* qg) {
  GatherQueries(kept, KeyRows(static_cast<int>(kept.size())), d, q, nr, qg);
}

// Whether AttendRun runs here: F16Codec's fused kernel does for this page
// shape on this CPU (the key rows, a multiple of 8, always suit it).
inline bool HasAttendRun(int T, int d) {
  CodecParams p;
  p.page_tokens = T;
  p.head_dim = d;
  return F16Codec::HasAttendRun(p);
}
inline bool HasAttendRun(const Shape& s) {
  return s.id == CodecId::kF16 && HasAttendRun(s.values.page_tokens, s.values.head_dim);
}

// F16Codec::AttendRun over a run of f16 pruned pages (pages[i]: a page's start,
// page_bytes long, T entries each but the last, m_last) with the queries
// gathered to the kept channels (qg [nq][KeyRows(nk)], GatherQueries): the
// same fused kernel with KeyRows(nk) key channels and d value channels, so
// a pruned page is read as an f16 page is (scores, softmax step and values
// per 16 entries, in registers). REQUIRES: HasAttendRun(T, d).
inline void AttendRun(int nk, int T, int d, const uint8_t* const* pages, int n_pages, int m_last, size_t page_bytes,
                      const float* qg, const int32_t* qpos, int nq, float* mx, float* sum, float* acc,
                      const uint8_t* after, size_t after_bytes) {
  simd::F16DecodePages(pages, n_pages, m_last, T, KeyRows(nk), d, page_bytes, qg, qpos, nq, mx, sum, acc, after,
                       after_bytes);
}

}  // namespace kvx::kv::pruned
