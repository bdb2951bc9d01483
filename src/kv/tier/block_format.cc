#include "kv/tier/block_format.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>
#include <zstd.h>

#include "kv/tier/storage_transform.h"
#include "util/byte_io.h"

namespace kvx::kv::tier {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'X', 'B', 'L', 'O', 'C', 'K'};
constexpr uint32_t kNoCompression = 0, kZstd = 1;
constexpr const char* kDocument = "tier block";
// The header sizes of the versions before this one: a sound header of one of
// them (its own checksum in its last 8 bytes) is another version, a miss.
constexpr std::pair<uint32_t, size_t> kOlderHeaders[] = {{1, 96}, {2, 104}};

template <class T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

std::string Hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The pages of one table a block spans (a chunk's last one partial).
int PagesPerBlock(const BlockSpace& s) { return (s.block_tokens + s.layout.page_tokens - 1) / s.layout.page_tokens; }

}  // namespace

namespace {

void ReserveMore(ByteWriter& w, size_t n) { w.out().reserve(w.out().size() + n); }
void ReserveMore(AlignedBuffer& w, size_t n) { w.Reserve(w.size() + n); }

// Appends block `index`'s payload (block_format.h) to `w` (a ByteWriter or
// an AlignedBuffer); `coded` is scratch for one coded table. Returns whether
// some table was coded (else the block is lossless whatever was asked).
template <class Writer>
Result<bool> WritePayload(Writer& w, ByteWriter& coded, const BlockSpace& space, const KVManager::SequenceImage& image,
                          int index, const BlockEncodeOptions& options) {
  const int B = space.block_tokens, ppb = PagesPerBlock(space);
  const KVLayout& layout = space.layout;
  const size_t end = static_cast<size_t>(index + 1) * B;
  const size_t n_tables = static_cast<size_t>(layout.n_layers) * layout.n_kv_heads;
  const int first_page = index * ppb;
  size_t page_bytes = 0;  // to size the payload once (growing it by doubling copied 6 MB blocks twice)
  for (const SequenceKV::TableImage& ti : image.tables) {
    for (size_t p = first_page; p < std::min(ti.pages.size(), static_cast<size_t>(first_page + ppb)); ++p) {
      page_bytes += 5 + ti.pages[p].size();
    }
  }
  const bool lossy = options.level != StorageLevel::kLossless;
  const StorageTransform* transform = options.level == StorageLevel::kCompact ? space.transform.get() : nullptr;
  ReserveMore(w, 16 + (end + B) * sizeof(int32_t) + n_tables + (lossy ? page_bytes / 2 : page_bytes));
  w.U32(static_cast<uint32_t>(end));
  w.Bytes(image.tokens.data(), end * sizeof(int32_t));
  w.Bytes(image.positions.data() + static_cast<size_t>(index) * B, static_cast<size_t>(B) * sizeof(int32_t));
  w.U32(static_cast<uint32_t>(n_tables));
  w.U32(static_cast<uint32_t>(ppb));
  bool coded_any = false;
  for (size_t t = 0; t < n_tables; ++t) {
    const SequenceKV::TableImage& ti = image.tables[t];
    const int layer = static_cast<int>(t / layout.n_kv_heads);
    const LayerCodec& lc = space.layers[layer];
    if (ti.length != static_cast<int>(image.tokens.size()) || ti.pages.size() < static_cast<size_t>(first_page + ppb)) {
      return InvalidArgument("table " + std::to_string(t) + " of the sequence image does not hold block " +
                             std::to_string(index));
    }
    for (int p = first_page; p < first_page + ppb; ++p) {
      if (ti.full[p] && p >= lc.sink_pages) {
        return InvalidArgument("block " + std::to_string(index) + " is still in the f16 staging window of layer " +
                               std::to_string(layer) + ": store it once the sequence is " +
                               std::to_string(lc.residual) + " tokens past it");
      }
    }
    const std::span<const std::span<const uint8_t>> pages(ti.pages.data() + first_page, ppb);
    const std::span<const uint8_t> full(ti.full.data() + first_page, ppb);
    coded.out().clear();
    TableCoding coding;
    if (transform != nullptr) {
      coding.transforms[0] = &transform->tensor(static_cast<int>(t), 0);
      coding.transforms[1] = &transform->tensor(static_cast<int>(t), 1);
    } else if (lossy) {
      coding.bits = LayerBits(options.level, layer, layout.n_layers);
      coding.anchor_tokens = options.anchor_tokens;
    }
    const bool code = lossy && HoldsFloatPages(lc) && EncodeTablePages(lc, pages, full, coding, &coded);
    w.U8(code ? 1 : 0);
    for (int p = 0; p < ppb; ++p) {
      w.U8(full[p]);
      if (code) continue;
      w.U32(static_cast<uint32_t>(pages[p].size()));
      w.Bytes(pages[p].data(), pages[p].size());
    }
    if (code) {
      w.U32(static_cast<uint32_t>(coded.out().size()));
      w.Bytes(coded.out().data(), coded.out().size());
    }
    coded_any = coded_any || code;
  }
  return coded_any;
}

// Appends the stored form of `payload` (zstd-compressed when asked) to
// `out`, which holds the header's room before it.
Status AppendStored(std::string_view payload, const BlockEncodeOptions& options, AlignedBuffer& out) {
  if (!options.compress) {
    out.Bytes(payload.data(), payload.size());
    return Status::Ok();
  }
  const size_t at = out.size();
  out.Resize(at + ZSTD_compressBound(payload.size()));
  const size_t n = ZSTD_compress(out.data() + at, out.size() - at, payload.data(), payload.size(), options.zstd_level);
  if (ZSTD_isError(n)) return Internal(std::string("zstd compression failed: ") + ZSTD_getErrorName(n));
  out.Resize(at + n);
  return Status::Ok();
}

// Writes the header into the first kBlockHeaderBytes of `out`, whose stored
// payload follows them.
void WriteHeader(const BlockHeader& header, bool compressed, uint64_t payload_bytes, AlignedBuffer& out) {
  const std::span<const uint8_t> body(out.data() + kBlockHeaderBytes, out.size() - kBlockHeaderBytes);
  ByteWriter h;
  h.Bytes(kMagic, sizeof kMagic);
  h.U32(kBlockFormatVersion);
  h.U32(compressed ? kZstd : kNoCompression);
  h.U64(header.key.lo);
  h.U64(header.key.hi);
  h.U64(header.model_fingerprint);
  h.U64(header.spec_fingerprint);
  h.U64(header.salt_digest);
  h.U32(static_cast<uint32_t>(header.index));
  h.U32(static_cast<uint32_t>(header.block_tokens));
  h.U32(static_cast<uint32_t>(header.level));
  h.U32(0);
  h.U64(header.transform_digest);
  h.U64(payload_bytes);
  h.U64(body.size());
  h.U64(XXH3_64bits(body.data(), body.size()));
  h.U64(XXH3_64bits(h.out().data(), h.out().size()));
  std::memcpy(out.data(), h.out().data(), kBlockHeaderBytes);
}

}  // namespace

Status BlockEncoder::Encode(const BlockSpace& space, uint64_t salt, const KVManager::SequenceImage& image, int index,
                            const BlockEncodeOptions& options) {
  const int B = space.block_tokens;
  const KVLayout& layout = space.layout;
  const size_t end = static_cast<size_t>(index + 1) * B;
  if (index < 0 || B <= 0 || end > image.tokens.size()) {
    return InvalidArgument("the sequence holds " + std::to_string(image.tokens.size()) + " tokens, not the whole block " +
                           std::to_string(index) + " of " + std::to_string(B));
  }
  if (image.entries_removed) {
    return InvalidArgument("a policy removed entries of this sequence: its pages no longer hold exactly its tokens, "
                           "so its blocks cannot be stored");
  }
  const size_t n_tables = static_cast<size_t>(layout.n_layers) * layout.n_kv_heads;
  if (image.tables.size() != n_tables || image.positions.size() != image.tokens.size() ||
      space.layers.size() != static_cast<size_t>(layout.n_layers)) {
    return InvalidArgument("the sequence image does not match the block space's layout " + layout.ToString());
  }
  if (space.chunk && options.level != StorageLevel::kLossless) {
    return InvalidArgument("a chunk is stored at the lossless level (its last page is partial)");
  }
  const bool compact = options.level == StorageLevel::kCompact;
  const StorageTransform* transform = compact ? space.transform.get() : nullptr;
  if (compact && (transform == nullptr || transform->tables() != static_cast<int>(layout.n_layers * layout.n_kv_heads) ||
                  transform->head_dim() != layout.head_dim)) {
    return InvalidArgument("the compact storage level needs the storage transform calibrated for this model and layout");
  }
  // Lossy levels always compress (zstd is their entropy coder). An
  // uncompressed payload is written in place after the header's room.
  BlockEncodeOptions frame = options;
  if (options.level != StorageLevel::kLossless) {
    frame.compress = true;
    frame.zstd_level = options.lossy_zstd_level;
  }
  block_.Clear();
  block_.Resize(kBlockHeaderBytes);
  bool coded_any = false;
  uint64_t payload_bytes = 0;
  if (frame.compress) {
    payload_.out().clear();
    KVX_ASSIGN_OR_RETURN(coded_any, WritePayload(payload_, coded_, space, image, index, options));
    KVX_RETURN_IF_ERROR(AppendStored(payload_.out(), frame, block_));
    payload_bytes = payload_.out().size();
  } else {
    KVX_ASSIGN_OR_RETURN(coded_any, WritePayload(block_, coded_, space, image, index, options));
    payload_bytes = block_.size() - kBlockHeaderBytes;
  }
  key_ = BlockKeys(space, salt, std::span<const int32_t>(image.tokens.data(), end))[index];
  // The level the bytes have: a block none of whose tables could be coded
  // (quantized pools) is lossless whatever was asked.
  level_ = coded_any ? options.level : StorageLevel::kLossless;
  const uint64_t transform_digest = level_ == StorageLevel::kCompact ? transform->digest() : 0;
  const BlockHeader header{key_, space.model_fingerprint, space.spec_fingerprint, SaltDigest(salt), index, B, level_,
                           transform_digest};
  WriteHeader(header, frame.compress, payload_bytes, block_);
  return Status::Ok();
}

Result<EncodedBlock> EncodeBlock(const BlockSpace& space, uint64_t salt, const KVManager::SequenceImage& image, int index,
                                 const BlockEncodeOptions& options) {
  BlockEncoder encoder;
  KVX_RETURN_IF_ERROR(encoder.Encode(space, salt, image, index, options));
  return EncodedBlock{encoder.key(), std::string(encoder.bytes()), encoder.level()};
}

Result<std::string> FrameBlock(const BlockHeader& header, std::string_view payload, const BlockEncodeOptions& options) {
  AlignedBuffer out;
  out.Resize(kBlockHeaderBytes);
  KVX_RETURN_IF_ERROR(AppendStored(payload, options, out));
  WriteHeader(header, options.compress, payload.size(), out);
  return std::string(out.view());
}

Result<ParsedBlock> ParseBlock(std::span<const uint8_t> bytes) {
  if (bytes.size() < sizeof kMagic || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) {
    return DataLoss("not a kvx tier block (no KVXBLOCK magic)");
  }
  // A sound block of an older version (its own header size, its checksum
  // in the last 8 bytes) is another version, a miss; anything else that
  // fails the header checksum below is damaged.
  for (const auto& [version, header_bytes] : kOlderHeaders) {
    if (bytes.size() >= header_bytes && Load<uint32_t>(bytes.data() + 8) == version &&
        XXH3_64bits(bytes.data(), header_bytes - 8) == Load<uint64_t>(bytes.data() + header_bytes - 8)) {
      return Unimplemented("tier block version " + std::to_string(version) + "; this kvx reads version " +
                           std::to_string(kBlockFormatVersion));
    }
  }
  if (bytes.size() < kBlockHeaderBytes) {
    return DataLoss("tier block is truncated: " + std::to_string(bytes.size()) + " bytes, its header alone has " +
                    std::to_string(kBlockHeaderBytes));
  }
  if (XXH3_64bits(bytes.data(), kBlockHeaderBytes - 8) != Load<uint64_t>(bytes.data() + kBlockHeaderBytes - 8)) {
    return DataLoss("tier block header is corrupted (checksum mismatch)");
  }
  ByteReader hr(bytes.first(kBlockHeaderBytes), kDocument);
  ParsedBlock b;
  uint8_t magic[8];
  hr.Take(magic, sizeof magic, "magic");
  const uint32_t version = hr.U32("version");
  const uint32_t compression = hr.U32("compression");
  b.key.lo = hr.U64("key");
  b.key.hi = hr.U64("key");
  b.model_fingerprint = hr.U64("model fingerprint");
  b.spec_fingerprint = hr.U64("spec fingerprint");
  b.salt_digest = hr.U64("salt digest");
  b.index = static_cast<int>(hr.U32("block index"));
  b.block_tokens = static_cast<int>(hr.U32("block tokens"));
  const uint32_t level = hr.U32("storage level");
  hr.U32("reserved");
  b.transform_digest = hr.U64("transform digest");
  const uint64_t payload_bytes = hr.U64("payload size");
  const uint64_t stored_bytes = hr.U64("stored size");
  const uint64_t stored_hash = hr.U64("payload checksum");
  if (version != kBlockFormatVersion) {  // checked first: an older header's fields mean other things
    return Unimplemented("tier block version " + std::to_string(version) + "; this kvx reads version " +
                         std::to_string(kBlockFormatVersion));
  }
  if (compression != kNoCompression && compression != kZstd) return DataLoss("tier block names an unknown compression");
  if (level > static_cast<uint32_t>(StorageLevel::kCompact)) return DataLoss("tier block names an unknown storage level");
  if ((level == static_cast<uint32_t>(StorageLevel::kCompact)) != (b.transform_digest != 0)) {
    return DataLoss("tier block's storage transform does not match its level");
  }
  b.level = static_cast<StorageLevel>(level);
  const std::span<const uint8_t> stored = bytes.subspan(kBlockHeaderBytes);
  if (stored.size() != stored_bytes) {
    return DataLoss("tier block is " + std::string(stored.size() < stored_bytes ? "truncated" : "longer than its header says") +
                    ": " + std::to_string(stored.size()) + " bytes of payload, the header announces " +
                    std::to_string(stored_bytes));
  }
  if (XXH3_64bits(stored.data(), stored.size()) != stored_hash) {
    return DataLoss("tier block is corrupted (checksum mismatch over its payload)");
  }
  if (payload_bytes > kMaxBlockPayloadBytes || b.index < 0 || b.block_tokens <= 0 || b.block_tokens > kMaxBlockTokens) {
    return DataLoss("tier block header holds impossible sizes");
  }
  if (compression == kZstd) {
    if (ZSTD_getFrameContentSize(stored.data(), stored.size()) != payload_bytes) {
      return DataLoss("tier block's compressed payload does not match its header");
    }
    b.payload.resize(payload_bytes);
    const size_t n = ZSTD_decompress(b.payload.data(), b.payload.size(), stored.data(), stored.size());
    if (ZSTD_isError(n) || n != payload_bytes) return DataLoss("tier block's compressed payload is damaged");
  } else {
    if (payload_bytes != stored_bytes) return DataLoss("tier block's sizes disagree");
    b.payload.assign(stored.begin(), stored.end());
  }

  ByteReader r(b.payload, kDocument);
  const uint32_t n = r.U32("token count");
  if (static_cast<uint64_t>(n) != (static_cast<uint64_t>(b.index) + 1) * static_cast<uint64_t>(b.block_tokens)) {
    return DataLoss("tier block holds " + std::to_string(n) + " tokens, its header says block " + std::to_string(b.index) +
                    " of " + std::to_string(b.block_tokens));
  }
  r.Array(&b.tokens, n, "token ids");
  r.Array(&b.positions, static_cast<uint64_t>(b.block_tokens), "positions");
  b.tables = static_cast<int>(r.U32("table count"));
  b.pages_per_table = static_cast<int>(r.U32("pages per table"));
  if (!r.ok()) return r.Error();
  const uint64_t n_pages = static_cast<uint64_t>(static_cast<uint32_t>(b.tables)) * static_cast<uint32_t>(b.pages_per_table);
  if (b.tables <= 0 || b.pages_per_table <= 0 || !r.Fits(n_pages, 5, "page list")) {
    return r.ok() ? DataLoss("tier block holds no pages") : r.Error();
  }
  b.full.resize(n_pages);
  b.pages.resize(n_pages);
  b.coded.resize(static_cast<size_t>(b.tables));
  for (int t = 0; t < b.tables; ++t) {
    const uint8_t form = r.U8("table form");
    if (form > 1) return r.ok() ? DataLoss("tier block names an unknown table form") : r.Error();
    for (int p = 0; p < b.pages_per_table; ++p) {
      const size_t at = static_cast<size_t>(t) * b.pages_per_table + p;
      b.full[at] = r.U8("page kind");
      if (b.full[at] > 1) return DataLoss("tier block names an unknown page kind");
      if (form == 0) b.pages[at] = r.Span(r.U32("page size"), "page bytes");
    }
    if (form == 1) {
      b.coded[t] = r.Span(r.U32("coded table size"), "coded table");
      if (r.ok() && b.coded[t].empty()) return DataLoss("tier block holds an empty coded table");
    }
    if (!r.ok()) return r.Error();
  }
  if (!r.at_end()) return DataLoss("tier block has bytes after its last page");
  return b;
}

Status DecodeCodedTables(const BlockSpace& s, ParsedBlock& b) {
  const KVLayout& l = s.layout;
  if (b.tables != l.n_layers * l.n_kv_heads || b.pages_per_table != PagesPerBlock(s) ||
      b.positions.size() != static_cast<size_t>(s.block_tokens)) {
    return DataLoss("tier block's tables do not match its spec's layout " + l.ToString());
  }
  const int ppb = b.pages_per_table;
  size_t bytes = 0;  // sized once: the page spans point into it
  for (int t = 0; t < b.tables; ++t) {
    if (b.coded[t].empty()) continue;
    const LayerCodec& lc = s.layers[t / s.layout.n_kv_heads];
    for (int p = 0; p < ppb; ++p) bytes += lc.PageBytes(b.full[static_cast<size_t>(t) * ppb + p]);
  }
  b.decoded.assign(bytes, 0);
  size_t at = 0;
  const StorageTransform* transform = b.level == StorageLevel::kCompact ? s.transform.get() : nullptr;
  if (b.level == StorageLevel::kCompact && (transform == nullptr || transform->digest() != b.transform_digest ||
                                            transform->tables() != b.tables || transform->head_dim() != l.head_dim)) {
    return NotFound("tier block was coded with another storage transform");
  }
  std::vector<std::span<uint8_t>> out(ppb);
  for (int t = 0; t < b.tables; ++t) {
    if (b.coded[t].empty()) continue;
    const LayerCodec& lc = s.layers[t / s.layout.n_kv_heads];
    const std::span<const uint8_t> full(b.full.data() + static_cast<size_t>(t) * ppb, ppb);
    for (int p = 0; p < ppb; ++p) {
      out[p] = std::span<uint8_t>(b.decoded.data() + at, lc.PageBytes(full[p]));
      b.pages[static_cast<size_t>(t) * ppb + p] = out[p];
      at += out[p].size();
    }
    TableCoding coding;
    if (transform != nullptr) coding.transforms[0] = &transform->tensor(t, 0), coding.transforms[1] = &transform->tensor(t, 1);
    KVX_RETURN_IF_ERROR(DecodeTablePages(lc, b.coded[t], full, b.positions, out, coding));
  }
  return Status::Ok();
}

Result<ParsedBlock> DecodeBlock(std::span<const uint8_t> bytes, const BlockRequest& q) {
  KVX_ASSIGN_OR_RETURN(ParsedBlock b, ParseBlock(bytes));
  const BlockSpace& s = *q.space;
  auto differs = [&](const std::string& what) { return NotFound("tier block " + q.key.Hex() + " is another block: " + what); };
  if (b.key != q.key) return differs("its key is " + b.key.Hex());
  if (b.model_fingerprint != s.model_fingerprint) {
    return differs("made with another model (fingerprint " + Hex64(b.model_fingerprint) + ", this one " +
                   Hex64(s.model_fingerprint) + ")");
  }
  if (b.spec_fingerprint != s.spec_fingerprint) return differs("made with another KV spec");
  if (b.salt_digest != SaltDigest(q.salt)) return differs("made for another tenant");
  if (b.index != q.index || b.block_tokens != s.block_tokens) return differs("another index or block size");
  const size_t end = (static_cast<size_t>(q.index) + 1) * static_cast<size_t>(s.block_tokens);
  if (q.tokens.size() < end || std::memcmp(b.tokens.data(), q.tokens.data(), end * sizeof(int32_t)) != 0) {
    return differs("it holds other tokens (a key collision)");
  }
  const KVLayout& l = s.layout;
  if (b.tables != l.n_layers * l.n_kv_heads || b.pages_per_table != PagesPerBlock(s)) {
    return DataLoss("tier block's tables do not match its spec's layout " + l.ToString());
  }
  if (!AcceptsLevel(q.accepts, b.level)) {
    return differs("stored at storage level " + std::string(StorageLevelName(b.level)) + ", this reader accepts " +
                   std::string(StorageLevelName(q.accepts)) + " or more faithful");
  }
  KVX_RETURN_IF_ERROR(DecodeCodedTables(s, b));
  return b;
}

}  // namespace kvx::kv::tier
