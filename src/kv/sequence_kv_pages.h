// Internal to SequenceKV (sequence_kv*.cc): decoding and encoding one page
// in any page format (page_table.h), through the format's codec
// (SequenceKV::format_codec).
#pragma once

#include <cstdint>
#include <vector>

#include "kv/block_pool.h"
#include "kv/sequence_kv.h"

namespace kvx::kv {

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
