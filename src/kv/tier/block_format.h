// The tier block format: one block (block_key.h) of a sequence's KV as bytes
// that any tier stores (disk file, Redis value) and any process running the
// same model and spec loads back: the pages as the pool stores them (the
// `lossless` storage level, bit for bit) or, for tables of float pages at a
// lossy level, coded by the storage codec (storage_codec.h, CacheGen-style)
// and encoded into the pool's codec again on load.
//
// Layout (little-endian), version kBlockFormatVersion (3):
//   header, kBlockHeaderBytes = 112: magic "KVXBLOCK", u32 version,
//     u32 compression (0 none, 1 zstd), u64 key lo, u64 key hi, u64 model
//     fingerprint, u64 spec fingerprint, u64 salt digest (SaltDigest),
//     u32 block index, u32 block tokens, u32 storage level (StorageLevel:
//     what the bytes mean; a reader that accepts only more faithful blocks
//     treats the block as a miss), u32 zero, u64 storage transform digest
//     (compact: the StorageTransform that coded it, a reader with another
//     treats the block as a miss; 0 at the other levels), u64 payload bytes,
//     u64 stored bytes, u64 XXH3-64 of the stored payload, u64 XXH3-64 of
//     the 104 bytes before;
//   payload (zstd-compressed when compression is 1; always at lossy levels):
//     u32 n, i32[n] token ids 0..end of the block (n = (index + 1) * block
//     tokens: a hit compares them all, so neither a key collision nor a
//     damaged index can serve the KV of another prefix), i32[block tokens]
//     positions of the block's tokens, u32 tables (n_layers * n_kv_heads,
//     layer-major), u32 pages per table (block tokens / page tokens), then
//     per table: u8 form, and
//       form 0 (pages): per page u8 f16 (1) / packed (0), u32 bytes, the
//         page's bytes as the pool holds them (its position array included);
//       form 1 (coded): per page u8 f16/packed, then u32 bytes and the
//         table's K and V as storage_codec.h writes them (at compact, as
//         storage_transform.h writes them).
//   Versions 1 (no storage level, no form byte) and 2 (no transform
//   digest) are read as a miss.
//
// A block holds pages in their final form only: a page of a sealed layer
// (kivi*, residual=) still in the f16 staging window is refused by
// EncodeBlock (write the block once the sequence is `residual` tokens past
// it, or when it finishes), so blocks from different sequences always
// concatenate into a sequence ImportSequence accepts.
//
// Faults: every decoding error is a Status, never a crash: DataLoss for a
// damaged block (checksum, truncation, impossible fields, a coded table
// that does not decode), Unimplemented for another version, NotFound for a
// sound block that is not the one asked for (another model, spec, tenant,
// key or tokens, or a lossier storage level than the reader accepts: a
// miss).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kv/kv_manager.h"
#include "kv/tier/block_key.h"
#include "kv/tier/storage_codec.h"
#include "util/aligned_buffer.h"
#include "util/byte_io.h"
#include "util/status.h"

namespace kvx::kv::tier {

inline constexpr uint32_t kBlockFormatVersion = 3;
inline constexpr size_t kBlockHeaderBytes = 112;
// The largest payload a block may announce (bounds what a damaged or hostile
// value can make a decoder allocate).
inline constexpr uint64_t kMaxBlockPayloadBytes = 1ull << 30;

struct BlockEncodeOptions {
  bool compress = false;  // zstd the payload (f16 pages shrink ~10%, quantized ones less; costs encode time)
  int zstd_level = 1;
  // Lossy levels code the tables of float pages (storage_codec.h) and
  // always compress (zstd is their entropy coder), at lossy_zstd_level.
  StorageLevel level = StorageLevel::kLossless;
  int anchor_tokens = kDefaultAnchorTokens;
  int lossy_zstd_level = 3;
};

struct EncodedBlock {
  BlockKey key;
  std::string bytes;
  StorageLevel level = StorageLevel::kLossless;  // what the bytes hold (the header's)
};

// Block `index` (tokens [index * B, (index + 1) * B), B = space.block_tokens)
// of `image` (KVManager::ExportSequence) for tenant `salt`. InvalidArgument
// when the image does not hold the whole block, when a policy removed
// entries (its pages no longer hold exactly its tokens), when its tables do
// not match the space's layout, or when a page of the block is still in the
// f16 staging window of a sealed layer.
Result<EncodedBlock> EncodeBlock(const BlockSpace& space, uint64_t salt, const KVManager::SequenceImage& image, int index,
                                 const BlockEncodeOptions& options = {});

// EncodeBlock into memory kept from one block to the next (the tier
// store's writer): no allocation, hence no page faults, once it has held a
// block of that size, and the bytes start at an address aligned to
// AlignedBuffer::kAlignment, which the disk tier writes without a copy
// through the page cache.
class BlockEncoder {
 public:
  // EncodeBlock's work and errors; bytes() hold the block until the next call.
  Status Encode(const BlockSpace& space, uint64_t salt, const KVManager::SequenceImage& image, int index,
                const BlockEncodeOptions& options = {});
  const BlockKey& key() const { return key_; }
  StorageLevel level() const { return level_; }
  std::string_view bytes() const { return block_.view(); }

 private:
  AlignedBuffer block_;  // header, then the stored payload
  ByteWriter payload_;   // the payload before compression (compressed blocks)
  ByteWriter coded_;     // one coded table
  BlockKey key_;
  StorageLevel level_ = StorageLevel::kLossless;
};

// What a block's header says besides sizes and checksums.
struct BlockHeader {
  BlockKey key;
  uint64_t model_fingerprint = 0, spec_fingerprint = 0, salt_digest = 0;
  int index = 0, block_tokens = 0;
  StorageLevel level = StorageLevel::kLossless;
  // The digest of the storage transform that coded the block (compact; 0
  // at the other levels): a reader with another transform takes it as a
  // miss.
  uint64_t transform_digest = 0;
};

// The header (sizes, checksums) and the payload (compressed when asked):
// the last step of EncodeBlock, public so the fuzzer can reach the payload
// parser behind valid checksums.
Result<std::string> FrameBlock(const BlockHeader& header, std::string_view payload, const BlockEncodeOptions& options);

// A block as stored, checked for integrity but not yet for identity.
struct ParsedBlock : BlockHeader {
  std::vector<int32_t> tokens;     // 0..end of the block
  std::vector<int32_t> positions;  // of the block's tokens
  int tables = 0, pages_per_table = 0;
  std::vector<uint8_t> full;                    // [tables * pages_per_table]
  // [tables * pages_per_table], into payload (form 0) or decoded (form 1;
  // empty until DecodeBlock decoded them)
  std::vector<std::span<const uint8_t>> pages;
  std::vector<std::span<const uint8_t>> coded;  // [tables]: a coded table's bytes, empty for form 0
  std::vector<uint8_t> payload;                 // owns the page bytes (a vector: moving it keeps them in place)
  std::vector<uint8_t> decoded;                 // owns the coded tables' pages once decoded
};

// Checks magic, header checksum, version, sizes, the payload checksum, and
// decompresses and parses the payload (coded tables are decoded by
// DecodeBlock, which knows the spec). DataLoss / Unimplemented as above.
Result<ParsedBlock> ParseBlock(std::span<const uint8_t> bytes);

// DecodeBlock's last step, public for the fuzzer: decodes b's coded tables
// into pages of the space's codecs (owned by b.decoded, b.pages point into
// it). DataLoss when they do not decode to the space's pages.
Status DecodeCodedTables(const BlockSpace& space, ParsedBlock& b);

// What a lookup asks for: block `index` of `tokens` for tenant `salt`.
struct BlockRequest {
  const BlockSpace* space = nullptr;
  uint64_t salt = 0;
  std::span<const int32_t> tokens;  // the prompt; holds at least (index + 1) * block_tokens tokens
  int index = 0;
  BlockKey key;                     // BlockKeys(...)[index]
  // The least faithful storage level the reader accepts (lossless: only
  // pages byte for byte).
  StorageLevel accepts = StorageLevel::kLossless;
};

// ParseBlock, then the identity: key, model and spec fingerprints, salt,
// block index and size, every token equal to the request's, the tables the
// space's layout (page sizes are checked by ImportSequence), the storage
// level one the request accepts; then decodes coded tables into pages of
// the pool's codec. NotFound naming the first difference when the block is
// sound but not this one.
// REQUIRES: request.space != nullptr, request.index >= 0.
Result<ParsedBlock> DecodeBlock(std::span<const uint8_t> bytes, const BlockRequest& request);

}  // namespace kvx::kv::tier
