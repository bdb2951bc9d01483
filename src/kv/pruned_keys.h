// The pruned page format (page_table.h kPagePruned; ThinK, kv/policy/think.h):
// a page whose keys keep only some channels, the table's channel mask
// `kept` (ascending channel indices), and whose values are whole.
//
// Layout (after the page's position header), T = page_tokens, d = head_dim,
// R = KeyRows(kept.size()):
//   K^T[R][T]  f16, channel-major like F16Codec: row i is channel kept[i];
//              rows kept.size()..R-1 are zero padding, so that R is a
//              multiple of 8 and the SIMD column kernels take these keys;
//   V[T][d]    f16, row-major like F16Codec.
// A pruned channel reads as zero: q.k over the page is q[kept].k[kept], the
// queries gathered to the kept channels once per work item (GatherQueries).
// Entries are stored in f16 whatever the layer codec (f16 or f32: ThinK is
// rejected with quantized layer codecs, whose pages would be smaller than
// these).
//
// Thread-safety: stateless.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kv/codec/f16_codec.h"

namespace kvx::kv::pruned {

// Stored key channel rows for `kept` channels (a multiple of 8).
inline int KeyRows(int kept) { return (kept + 7) / 8 * 8; }

// Bytes of a pruned page (positions header, keys, values; aligned).
inline size_t PageBytes(int page_tokens, int head_dim, int kept) {
  const size_t T = static_cast<size_t>(page_tokens);
  return AlignUp(PageDataOffset(page_tokens) + sizeof(uint16_t) * T * (KeyRows(kept) + static_cast<size_t>(head_dim)),
                 kPageAlign);
}

inline uint16_t* Keys(uint8_t* data) { return reinterpret_cast<uint16_t*>(data); }
inline const uint16_t* Keys(const uint8_t* data) { return reinterpret_cast<const uint16_t*>(data); }
inline const uint16_t* Values(const uint8_t* data, int page_tokens, int kept) {
  return Keys(data) + static_cast<size_t>(KeyRows(kept)) * page_tokens;
}
inline uint16_t* Values(uint8_t* data, int page_tokens, int kept) {
  return Keys(data) + static_cast<size_t>(KeyRows(kept)) * page_tokens;
}

// Stores n rows k, v ([n][d] floats) in slots 0..n-1; the key channels not
// in `kept` are dropped. Padding rows are zeroed.
inline void Encode(const std::vector<int>& kept, int T, int d, uint8_t* data, int n, const float* k, const float* v) {
  const int nk = static_cast<int>(kept.size()), rows = KeyRows(nk);
  uint16_t* keys = Keys(data);
  for (int i = 0; i < rows; ++i) {
    uint16_t* col = keys + static_cast<size_t>(i) * T;
    for (int j = 0; j < n; ++j) col[j] = i < nk ? FloatToFp16(k[static_cast<size_t>(j) * d + kept[i]]) : 0;
  }
  uint16_t* values = Values(data, T, nk);
  for (size_t i = 0; i < static_cast<size_t>(n) * d; ++i) values[i] = FloatToFp16(v[i]);
}

// Rows 0..n-1 back as [n][d] floats; the pruned key channels read 0.
inline void Decode(const std::vector<int>& kept, int T, int d, const uint8_t* data, int n, float* k, float* v) {
  const int nk = static_cast<int>(kept.size());
  std::fill(k, k + static_cast<size_t>(n) * d, 0.0f);
  const uint16_t* keys = Keys(data);
  for (int i = 0; i < nk; ++i) {
    const uint16_t* col = keys + static_cast<size_t>(i) * T;
    for (int j = 0; j < n; ++j) k[static_cast<size_t>(j) * d + kept[i]] = HalfToFloatFast(col[j]);
  }
  const uint16_t* values = Values(data, T, nk);
  for (size_t i = 0; i < static_cast<size_t>(n) * d; ++i) v[i] = HalfToFloatFast(values[i]);
}

// qg[r][KeyRows] = q[r][kept] (padding 0), for nr rows of d floats.
inline void GatherQueries(const std::vector<int>& kept, int d, const float* q, int nr, std::vector<float>* qg) {
  const int nk = static_cast<int>(kept.size()), rows = KeyRows(nk);
  qg->assign(static_cast<size_t>(nr) * rows, 0.0f);
  for (int r = 0; r < nr; ++r) {
    for (int i = 0; i < nk; ++i) (*qg)[static_cast<size_t>(r) * rows + i] = q[static_cast<size_t>(r) * d + kept[i]];
  }
}

// s[r * ss + j] = qg_r . K_j over the stored channel rows (F16Codec's kernels
// with the kept channels as the head dimension).
inline void Scores(int nk, int T, const uint8_t* data, int m, const float* qg, int nr, float* s, int ss) {
  CodecParams p;
  p.page_tokens = T;
  p.head_dim = KeyRows(nk);
  F16Codec::Scores(p, data, m, qg, nr, s, ss);
}

inline void AccumulateValues(int nk, int T, int d, const uint8_t* data, int m, const float* w, int nr, int ws,
                             float* acc) {
  F16Codec::AccumulateValueRows(Values(data, T, nk), d, m, w, nr, ws, acc);
}

// Whether AttendRun runs here: F16Codec's fused kernel does for this page
// shape on this CPU (the key rows, a multiple of 8, always suit it).
inline bool HasAttendRun(int T, int d) {
  CodecParams p;
  p.page_tokens = T;
  p.head_dim = d;
  return F16Codec::HasAttendRun(p);
}

// F16Codec::AttendRun over a run of pruned pages (pages[i]: a page's start,
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
