#include "kv/tier/storage_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kv/codec/codecs.h"
#include "util/fp16.h"

namespace kvx::kv::tier {
namespace {

// The largest magnitude the grid's f16 origin and step can hold with room
// to spare (f16's largest finite value is 65504).
constexpr float kMaxGridValue = 60000.0f;

// The f16 value nearest to f on the side of -inf (+inf): the grid's origin
// must not lie above the channel's minimum, nor its step below what covers
// the range, or a value would fall off the grid.
uint16_t HalfAtMost(float f) {
  uint16_t h = FloatToFp16(f);
  if (Fp16ToFloat(h) > f) h = (h & 0x8000u) ? h + 1 : (h == 0 ? 0x8001u : h - 1);
  return h;
}
uint16_t HalfAtLeast(float f) {
  uint16_t h = FloatToFp16(f);
  if (Fp16ToFloat(h) < f) h = (h & 0x8000u) ? (h == 0x8000u ? 1 : h - 1) : h + 1;
  return h;
}

// Symbols of `bits` bits share a byte when they fit more than once (1, 2
// and 4 bits pack exactly, 3 bits two to a byte): zstd's Huffman stage
// spends at least one bit per byte, so unpacked 2-bit symbols would cost
// twice their entropy (docs/tiers.md measures it).
int SymbolsPerByte(int bits) { return 8 / bits; }
size_t PackedBytes(int tokens, int bits) {
  const int per = SymbolsPerByte(bits);
  return static_cast<size_t>((tokens + per - 1) / per);
}

// The grid index token j's symbol is coded against: its anchor's (the
// first token of its group of G), an anchor's previous anchor's, 0 for the
// first token or without anchors (G = 0).
int AnchorReference(const std::vector<int>& q, int j, int anchor_tokens) {
  if (anchor_tokens <= 0) return 0;
  const int anchor = j - j % anchor_tokens;
  if (j != anchor) return q[anchor];
  return anchor > 0 ? q[anchor - anchor_tokens] : 0;
}

// The page codec a table's page is stored in (f16 for staging/sink pages).
CodecId PageCodecId(const LayerCodec& lc, bool full) { return full ? CodecId::kF16 : lc.id; }

}  // namespace

std::string_view StorageLevelName(StorageLevel level) {
  switch (level) {
    case StorageLevel::kLossless: return "lossless";
    case StorageLevel::kHigh: return "high";
    case StorageLevel::kMedium: return "medium";
    case StorageLevel::kLow: return "low";
    case StorageLevel::kCompact: return "compact";
  }
  return "?";
}

std::optional<StorageLevel> ParseStorageLevel(std::string_view name) {
  for (StorageLevel l : kAllStorageLevels) {
    if (StorageLevelName(l) == name) return l;
  }
  return std::nullopt;
}

StorageLevel StorageLevels::For(std::string_view tier_kind) const {
  for (const auto& [kind, level] : by_tier) {
    if (kind == tier_kind) return level;
  }
  return fallback;
}

Result<StorageLevels> ParseStorageLevels(std::string_view text) {
  StorageLevels out;
  bool bare = false;
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    const std::string_view item = text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    const size_t eq = item.find('=');
    const std::string_view kind = eq == std::string_view::npos ? std::string_view() : item.substr(0, eq);
    const std::optional<StorageLevel> level = ParseStorageLevel(eq == std::string_view::npos ? item : item.substr(eq + 1));
    const bool known_kind = kind.empty() || kind == "ram" || kind == "disk" || kind == "redis";
    const bool repeated = kind.empty() ? bare : std::any_of(out.by_tier.begin(), out.by_tier.end(), [&](const auto& kv) {
      return kv.first == kind;
    });
    if (!level || !known_kind || repeated) {
      return InvalidArgument("'" + std::string(item) + "' is not a storage level (" + std::string(kStorageLevelChoices) +
                             ") or TIER=LEVEL with TIER ram, disk or redis, each named once; e.g. "
                             "--cache-codec medium or --cache-codec disk=high,redis=medium");
    }
    if (kind.empty()) {
      out.fallback = *level;
      bare = true;
    } else {
      out.by_tier.emplace_back(std::string(kind), *level);
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

StorageBits LayerBits(StorageLevel level, int layer, int n_layers) {
  // Bits of the first third of the layers and of the rest, per level.
  int early = 8, late = 8;  // lossless stores pages: not used
  switch (level) {
    case StorageLevel::kHigh: early = 4, late = 5; break;
    case StorageLevel::kMedium: early = 3, late = 4; break;
    case StorageLevel::kLow: early = 2, late = 3; break;
    case StorageLevel::kLossless:
    case StorageLevel::kCompact: break;
  }
  const int bits = 3 * layer < n_layers ? early : late;
  return {bits, bits};
}

bool HoldsFloatPages(const LayerCodec& lc) {
  return !lc.sealed && (lc.id == CodecId::kF16 || lc.id == CodecId::kF32);
}

bool EncodeTensor(const float* x, int tokens, int dim, int bits, int anchor_tokens, ByteWriter* out) {
  const int levels = (1 << bits) - 1;
  std::vector<uint16_t> origin(dim), step(dim);
  for (int c = 0; c < dim; ++c) {
    float lo = x[c], hi = x[c];
    for (int j = 0; j < tokens; ++j) {
      const float v = x[static_cast<size_t>(j) * dim + c];
      if (!std::isfinite(v) || std::fabs(v) > kMaxGridValue) return false;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    origin[c] = HalfAtMost(lo);
    step[c] = HalfAtLeast((hi - Fp16ToFloat(origin[c])) / static_cast<float>(levels));
    if (!std::isfinite(Fp16ToFloat(step[c]))) return false;
  }
  out->U8(static_cast<uint8_t>(bits));
  out->U8(static_cast<uint8_t>(anchor_tokens));
  out->Bytes(origin.data(), origin.size() * sizeof(uint16_t));
  out->Bytes(step.data(), step.size() * sizeof(uint16_t));
  const int per_byte = SymbolsPerByte(bits);
  std::vector<uint8_t> packed(PackedBytes(tokens, bits));
  std::vector<int> q(static_cast<size_t>(tokens));
  for (int c = 0; c < dim; ++c) {
    const float o = Fp16ToFloat(origin[c]), s = Fp16ToFloat(step[c]);
    for (int j = 0; j < tokens; ++j) {
      const float v = x[static_cast<size_t>(j) * dim + c];
      q[j] = s > 0 ? std::clamp(static_cast<int>(std::lround((v - o) / s)), 0, levels) : 0;
    }
    std::fill(packed.begin(), packed.end(), 0);
    for (int j = 0; j < tokens; ++j) {
      const int symbol = (q[j] - AnchorReference(q, j, anchor_tokens)) & levels;  // mod 2^bits
      packed[j / per_byte] |= static_cast<uint8_t>(symbol << (j % per_byte * bits));
    }
    out->Bytes(packed.data(), packed.size());
  }
  return true;
}

Status DecodeTensor(ByteReader& in, int tokens, int dim, float* x) {
  const int bits = in.U8("storage codec bits");
  const int anchor_tokens = in.U8("storage codec anchor");
  std::vector<uint16_t> origin, step;
  in.Array(&origin, static_cast<uint64_t>(dim), "storage codec origins");
  in.Array(&step, static_cast<uint64_t>(dim), "storage codec steps");
  if (!in.ok()) return in.Error();
  if (bits < 1 || bits > 8) return DataLoss("tier block's storage codec names " + std::to_string(bits) + " bits");
  const int levels = (1 << bits) - 1;
  const int per_byte = SymbolsPerByte(bits);
  std::vector<int> q(static_cast<size_t>(tokens));
  for (int c = 0; c < dim; ++c) {
    const float o = Fp16ToFloat(origin[c]), s = Fp16ToFloat(step[c]);
    if (!std::isfinite(o) || !std::isfinite(s) || s < 0) return DataLoss("tier block's storage codec grid is damaged");
    const std::span<const uint8_t> packed = in.Span(PackedBytes(tokens, bits), "storage codec symbols");
    if (!in.ok()) return in.Error();
    for (size_t b = 0; b < packed.size(); ++b) {  // bits beyond the symbols (or the last token) are zero
      const int used = std::min(per_byte, tokens - static_cast<int>(b) * per_byte) * bits;
      if (used < 8 && (packed[b] >> used) != 0) return DataLoss("tier block's storage codec symbols fall off their grid");
    }
    for (int j = 0; j < tokens; ++j) {
      const int symbol = (packed[j / per_byte] >> (j % per_byte * bits)) & levels;
      q[j] = (AnchorReference(q, j, anchor_tokens) + symbol) & levels;
      x[static_cast<size_t>(j) * dim + c] = o + static_cast<float>(q[j]) * s;
    }
  }
  return Status::Ok();
}

std::vector<float> TableFloats(const LayerCodec& lc, std::span<const std::span<const uint8_t>> pages,
                               std::span<const uint8_t> full) {
  const CodecParams& p = lc.params;
  const size_t T = static_cast<size_t>(p.page_tokens), d = static_cast<size_t>(p.head_dim);
  const size_t n = pages.size() * T;
  std::vector<float> out(2 * n * d);
  for (size_t i = 0; i < pages.size(); ++i) {
    const uint8_t* data = pages[i].data() + PageDataOffset(p.page_tokens);
    DispatchCodec(PageCodecId(lc, full[i]), [&](auto codec) {
      using C = decltype(codec);
      C::DecodeKeys(p, data, p.page_tokens, &out[i * T * d]);
      C::DecodeValues(p, data, p.page_tokens, &out[(n + i * T) * d]);
    });
  }
  return out;
}

bool EncodeTablePages(const LayerCodec& lc, std::span<const std::span<const uint8_t>> pages,
                      std::span<const uint8_t> full, const TableCoding& coding, ByteWriter* out) {
  const int n = static_cast<int>(pages.size()) * lc.params.page_tokens, d = lc.params.head_dim;
  const std::vector<float> kv = TableFloats(lc, pages, full);
  ByteWriter w;
  for (int i = 0; i < 2; ++i) {
    const float* x = kv.data() + static_cast<size_t>(i) * n * d;
    const bool ok = coding.transforms[i] != nullptr
                        ? EncodeTransformed(*coding.transforms[i], x, n, &w)
                        : EncodeTensor(x, n, d, i == 0 ? coding.bits.k : coding.bits.v, coding.anchor_tokens, &w);
    if (!ok) return false;
  }
  out->Bytes(w.out().data(), w.out().size());
  return true;
}

Status DecodeTablePages(const LayerCodec& lc, std::span<const uint8_t> coded, std::span<const uint8_t> full,
                        std::span<const int32_t> positions, std::span<const std::span<uint8_t>> out,
                        const TableCoding& coding) {
  const CodecParams& p = lc.params;
  const size_t T = static_cast<size_t>(p.page_tokens), d = static_cast<size_t>(p.head_dim);
  const size_t n = out.size() * T;
  if (!HoldsFloatPages(lc) || positions.size() != n || full.size() != out.size()) {
    return DataLoss("tier block codes a table its spec does not store as floats, or its sizes disagree");
  }
  std::vector<float> k(n * d), v(n * d);
  ByteReader in(coded, "tier block");
  for (int i = 0; i < 2; ++i) {
    float* x = i == 0 ? k.data() : v.data();
    KVX_RETURN_IF_ERROR(coding.transforms[i] != nullptr
                            ? DecodeTransformed(*coding.transforms[i], in, static_cast<int>(n), x)
                            : DecodeTensor(in, static_cast<int>(n), p.head_dim, x));
  }
  if (!in.at_end()) return DataLoss("tier block has bytes after a coded table");
  for (size_t i = 0; i < out.size(); ++i) {
    const std::span<uint8_t> page = out[i];
    if (page.size() != lc.PageBytes(full[i])) return DataLoss("tier block's coded page has the wrong size");
    std::fill(page.begin(), page.end(), 0);
    std::memcpy(PagePositions(page.data()), positions.data() + i * T, T * sizeof(int32_t));
    DispatchCodec(PageCodecId(lc, full[i]), [&](auto codec) {
      decltype(codec)::EncodePage(p, page.data() + PageDataOffset(p.page_tokens), p.page_tokens, &k[i * T * d],
                                  &v[i * T * d]);
    });
  }
  return Status::Ok();
}

}  // namespace kvx::kv::tier
