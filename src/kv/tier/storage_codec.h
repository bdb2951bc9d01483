// The storage codec of the KV tiers (docs/tiers.md#the-storage-codec): how
// the pages of one (layer, kv head) table of a block are written when the
// block leaves the pool, after CacheGen (Liu et al., SIGCOMM'24).
//
// Levels: `lossless` writes the pages byte for byte as the pool holds them
// (any codec: f16, f32, int*, kivi*). The lossy levels (`high`, `medium`,
// `low`) apply to tables whose pages hold floats (f16 and f32 layers; a
// quantized layer's pages are already quantized and stay byte for byte:
// quantizing them again would stack two errors). Such a table's K and V are
// decoded to floats ([tokens][dim]) and each is written as
//
//   u8 bits, u8 anchor tokens G, f16 origin[dim], f16 step[dim],
//   per channel: its tokens' symbols, 8 / bits of them to a byte
//   (channel-major; symbol j of a byte at bits j * bits..)
//
// Every value x of channel c is put on the channel's grid: q = round((x -
// origin_c) / step_c) in [0, 2^bits - 1], with origin_c <= min_c and
// step_c >= (max_c - origin_c) / (2^bits - 1) over the block's tokens, so
// |x - (origin_c + q step_c)| <= step_c / 2: the error bound of a level is
// half its step, per channel. The bit width is per layer (LayerBits: on the
// recall model the later layers are the sensitive ones, the reverse of
// CacheGen's models; docs/tiers.md). The symbols are the grid indices as deltas against an
// anchor token (CacheGen's token locality): the first token of each group of
// G tokens is the anchor, coded against the previous anchor; the others are
// coded against their group's anchor (mod 2^bits, so the deltas are exact
// integers: the anchor changes the size, never the error). G = 0 stores the
// indices themselves: the default, since on the recall model a token's KV
// is no closer to its neighbours' than to the channel's other values
// (deltas cost 0.4 bit a value more; docs/tiers.md). The entropy coder is zstd over the whole block payload
// (block_format.cc); docs/tiers.md measures what an arithmetic coder would
// save over it.
//
// On load the floats are encoded into the pool's codec again (f16 pages for
// an f16 pool), so a block stored from a pool loads into the same pool.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kv/codec/codec_config.h"
#include "kv/tier/storage_transform.h"
#include "util/byte_io.h"
#include "util/status.h"

namespace kvx::kv::tier {

// Ordered from the most faithful to the least: a block at level s may serve
// a reader that accepts level a iff s <= a (AcceptsLevel).
// kCompact codes through a calibrated storage transform (storage_transform.h).
enum class StorageLevel : uint8_t { kLossless = 0, kHigh = 1, kMedium = 2, kLow = 3, kCompact = 4 };

inline constexpr StorageLevel kAllStorageLevels[] = {StorageLevel::kLossless, StorageLevel::kHigh,
                                                     StorageLevel::kMedium, StorageLevel::kLow,
                                                     StorageLevel::kCompact};
inline constexpr std::string_view kStorageLevelChoices = "lossless, high, medium, low, compact";

std::string_view StorageLevelName(StorageLevel level);
std::optional<StorageLevel> ParseStorageLevel(std::string_view name);
// Whether a reader that accepts blocks at `accepted` (or more faithful) may
// be served a block stored at `stored`.
inline bool AcceptsLevel(StorageLevel accepted, StorageLevel stored) { return stored <= accepted; }

// The levels of `--cache-codec`: "LEVEL" for every tier, or a list of
// "TIER=LEVEL" (TIER: ram, disk, redis) with an optional bare LEVEL for the
// tiers not named ("medium,ram=lossless"). Unnamed tiers default to lossless.
struct StorageLevels {
  StorageLevel fallback = StorageLevel::kLossless;
  std::vector<std::pair<std::string, StorageLevel>> by_tier;  // tier kind -> level
  StorageLevel For(std::string_view tier_kind) const;
};
// InvalidArgument naming the item at fault and the accepted forms.
Result<StorageLevels> ParseStorageLevels(std::string_view text);

// The K and V bit widths of `layer` (of n_layers) at a lossy level: the
// first third of the layers one bit fewer than the rest (measured on the
// recall model: 2 bits instead of 3 in layers 0-2 left KLD unchanged, in
// layers 3-7 it multiplied it by 7). REQUIRES: level is high, medium or low
// (compact's widths are per component: storage_transform.h).
struct StorageBits {
  int k = 0, v = 0;
};
StorageBits LayerBits(StorageLevel level, int layer, int n_layers);

// The anchor group of the lossy levels (tokens; 0 = no deltas), chosen by
// measurement (docs/tiers.md#the-storage-codec).
inline constexpr int kDefaultAnchorTokens = 0;

// Whether a table of layer codec `lc` holds floats in every page (f16 or f32
// pages, its f16 sink pages included), i.e. whether the lossy levels apply.
bool HoldsFloatPages(const LayerCodec& lc);

// One table's pages (`full[p]`: staging/sink f16 page, else the layer's
// codec) as floats: K then V, [pages * page_tokens][head_dim] each.
std::vector<float> TableFloats(const LayerCodec& lc, std::span<const std::span<const uint8_t>> pages,
                               std::span<const uint8_t> full);

// Writes one tensor ([tokens][dim] floats, row-major) at `bits` (1..8) with
// anchor groups of `anchor_tokens` (0..255). False (nothing written) when it
// holds a value the grid cannot represent (not finite, or beyond f16's
// range): the caller stores the table byte for byte instead.
bool EncodeTensor(const float* x, int tokens, int dim, int bits, int anchor_tokens, ByteWriter* out);
// Reads what EncodeTensor wrote back into x ([tokens][dim]). DataLoss for a
// tensor that could not have been written (bits, anchor, step, symbols out
// of the grid).
Status DecodeTensor(ByteReader& in, int tokens, int dim, float* x);

// How a table's K and V are coded: per-channel grids of `bits` with anchor
// groups (high, medium, low), or, where transforms[0] (K) / [1] (V) is set,
// through that tensor's storage transform (compact).
struct TableCoding {
  StorageBits bits;
  int anchor_tokens = kDefaultAnchorTokens;
  const TensorTransform* transforms[2] = {nullptr, nullptr};
};

// One table's pages of a block (`full[p]`: staging/sink f16 page, else the
// layer's codec) coded as `coding` says; false as EncodeTensor.
// REQUIRES: HoldsFloatPages(lc); every page holds page_tokens entries.
bool EncodeTablePages(const LayerCodec& lc, std::span<const std::span<const uint8_t>> pages,
                      std::span<const uint8_t> full, const TableCoding& coding, ByteWriter* out);
// The pages back: page p is written to out[p] (lc.PageBytes(full[p]) bytes
// each), its position header from `positions` (page_tokens per page);
// `coding`'s transforms as at encoding (its bits are read from the bytes).
// DataLoss for coded bytes that do not decode to exactly these pages.
Status DecodeTablePages(const LayerCodec& lc, std::span<const uint8_t> coded, std::span<const uint8_t> full,
                        std::span<const int32_t> positions, std::span<const std::span<uint8_t>> out,
                        const TableCoding& coding = {});

}  // namespace kvx::kv::tier
