// Internal to SequenceKV (sequence_kv*.cc): what its files share. Decoding
// and encoding one page in any page format (page_table.h), through the
// format's codec (SequenceKV::format_codec); the chain's first page that may
// still change; the largest pre-RoPE position.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kv/block_pool.h"
#include "kv/sequence_kv.h"

namespace kvx::kv {

// Positions a pre-RoPE cache may hold (the cos/sin table is dense in position).
inline constexpr int32_t kMaxPreRopePosition = 1 << 22;

// Index of the first page that may still change at chain length `len`: the
// first f16 staging page of a sealed layer, else the page holding slot len.
// Staging pages are the tail of the chain after the sink pages; a packed
// page never returns to f16, even when removed pages put it back inside the
// residual window by the index rule (LayerCodec::IsFullPage), so the staging
// run is read from the pages' flags, not recomputed from the length.
inline int FirstMutablePage(const LayerCodec& lc, const PageTable& t, int len) {
  const int T = lc.params.page_tokens;
  int p = std::min(len / T, t.num_pages());
  if (lc.sealed) {
    int staging = t.num_pages();
    while (staging > lc.sink_pages && t.is_full(staging - 1)) --staging;
    p = std::min(p, staging);
  }
  return p;
}

// A page's decoded entries: keys, values and positions of its slots.
struct DecodedPage {
  std::vector<float> k, v;
  std::vector<int32_t> pos;
};

// Decodes slots 0..slots-1 of page `id` (keys and values as stored: rotated,
// pre-RoPE keys un-roped). Page codecs decode whole pages: slots == T.
void DecodePage(const BlockPool& pool, const SequenceKV::FormatCodec& fc, PageId id, int slots, DecodedPage* out);

// Writes `n` rows into a fresh page of the format: positions, then the
// codec's encoding (EncodePage for whole-page formats, which need all T
// rows: the caller pads dead slots with copies of a live row).
void EncodeInto(BlockPool* pool, const SequenceKV::FormatCodec& fc, PageId id, int n, const float* k, const float* v,
                const int32_t* pos);

}  // namespace kvx::kv
