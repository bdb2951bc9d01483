#include "kv/tier/block_key.h"

#include <cstdio>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kv/codec/hadamard.h"
#include "util/byte_io.h"

namespace kvx::kv::tier {
namespace {

constexpr std::string_view kKeyDomain = "kvx-tier-key-v1";
constexpr std::string_view kSpecDomain = "kvx-tier-spec-v1";
constexpr std::string_view kChunkDomain = "kvx-chunk-key-v1";

void PutKey(ByteWriter& w, const BlockKey& k) {
  w.U64(k.lo);
  w.U64(k.hi);
}

BlockKey Hash128(const std::string& bytes) {
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  return {h.low64, h.high64};
}

}  // namespace

std::string BlockKey::Hex() const {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi), static_cast<unsigned long long>(lo));
  return buf;
}

std::optional<BlockKey> BlockKey::FromHex(std::string_view hex) {
  if (hex.size() != 32) return std::nullopt;
  uint64_t words[2] = {0, 0};
  for (size_t i = 0; i < 32; ++i) {
    const char c = hex[i];
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return std::nullopt;
    words[i / 16] = words[i / 16] << 4 | static_cast<uint64_t>(d);
  }
  return BlockKey{words[1], words[0]};
}

uint64_t SpecFingerprint(const ResolvedKVSpec& spec) {
  ByteWriter w;
  w.Bytes(kSpecDomain.data(), kSpecDomain.size());
  const KVLayout& l = spec.layout;
  for (int v : {l.n_layers, l.n_kv_heads, l.head_dim, l.page_tokens}) w.U32(static_cast<uint32_t>(v));
  const CodecConfig& c = spec.spec.codec;
  w.U8(static_cast<uint8_t>(c.rotation));
  w.U64(c.rotation == Rotation::kNone ? 0 : HadamardRotation::kDefaultSeed);
  w.U8(c.pre_rope ? 1 : 0);
  for (const LayerCodec& lc : spec.layers) {
    const CodecParams& p = lc.params;
    w.U32(static_cast<uint32_t>(lc.id));
    for (int v : {p.page_tokens, p.head_dim, p.k_bits, p.v_bits, p.group, p.outliers, lc.residual, lc.sink_pages}) {
      w.U32(static_cast<uint32_t>(v));
    }
    w.U8(static_cast<uint8_t>(p.sym | p.clip << 1 | lc.sealed << 2));
    w.U64(lc.packed_page_bytes);
    w.U64(lc.full_page_bytes);
  }
  return XXH3_64bits(w.out().data(), w.out().size());
}

Result<BlockSpace> MakeBlockSpace(const ResolvedKVSpec& spec, uint64_t model_fingerprint, int block_tokens) {
  const int page = spec.layout.page_tokens;
  if (block_tokens <= 0 || block_tokens > kMaxBlockTokens || page <= 0 || block_tokens % page != 0) {
    return InvalidArgument("a tier block must hold a whole number of pages: block_tokens " + std::to_string(block_tokens) +
                           " is not a positive multiple of the page size " + std::to_string(page) + " (at most " +
                           std::to_string(kMaxBlockTokens) + ")");
  }
  return BlockSpace{model_fingerprint, SpecFingerprint(spec), block_tokens, spec.layout, spec.layers, nullptr};
}

namespace {

// One link of the chain: the hash of the previous link and the tokens.
BlockKey ChainLink(const BlockKey& previous, std::span<const int32_t> tokens) {
  ByteWriter link;
  PutKey(link, previous);
  link.Bytes(tokens.data(), tokens.size() * sizeof(int32_t));
  return Hash128(link.out());
}

// The key of a chain link: what else the stored bytes depend on.
BlockKey KeyOf(std::string_view domain, const BlockKey& chain, const BlockSpace& space, uint64_t salt, size_t n_tokens) {
  ByteWriter key;
  key.Bytes(domain.data(), domain.size());
  PutKey(key, chain);
  key.U64(space.model_fingerprint);
  key.U64(space.spec_fingerprint);
  key.U64(salt);
  key.U32(static_cast<uint32_t>(n_tokens));
  return Hash128(key.out());
}

}  // namespace

std::vector<BlockKey> BlockKeys(const BlockSpace& space, uint64_t salt, std::span<const int32_t> tokens) {
  std::vector<BlockKey> keys;
  if (space.block_tokens <= 0) return keys;
  if (space.chunk) {
    if (tokens.size() == static_cast<size_t>(space.block_tokens)) keys.push_back(ChunkKey(space, salt, tokens));
    return keys;
  }
  const size_t B = static_cast<size_t>(space.block_tokens);
  BlockKey chain;
  for (size_t start = 0; start + B <= tokens.size(); start += B) {
    chain = ChainLink(chain, tokens.subspan(start, B));
    keys.push_back(KeyOf(kKeyDomain, chain, space, salt, B));
  }
  return keys;
}

BlockKey ChunkKey(const BlockSpace& space, uint64_t salt, std::span<const int32_t> tokens) {
  return KeyOf(kChunkDomain, ChainLink(BlockKey{}, tokens), space, salt, tokens.size());
}

Result<BlockSpace> ChunkSpace(const BlockSpace& space, int n_tokens) {
  if (n_tokens < 1 || n_tokens > kMaxBlockTokens) {
    return InvalidArgument("a chunk stored in the tiers holds 1.." + std::to_string(kMaxBlockTokens) + " tokens, not " +
                           std::to_string(n_tokens));
  }
  BlockSpace s = space;
  s.block_tokens = n_tokens;
  s.chunk = true;
  return s;
}

uint64_t SaltDigest(uint64_t salt) { return XXH3_64bits(&salt, sizeof salt); }

}  // namespace kvx::kv::tier
