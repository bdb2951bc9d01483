// Block keys for the KV tiers (kv/tier/, docs/tiers.md): names for the KV of
// a run of tokens that mean the same in every process and on every machine.
//
// A block is the KV of `block_tokens` consecutive tokens of one sequence (a
// whole number of pages), every layer and kv head. Block b's key is
//
//   chain_b = XXH3_128(chain_{b-1} || tokens of block b)      chain_{-1} = 0
//   key_b   = XXH3_128("kvx-tier-key-v1" || chain_b || model fingerprint ||
//                      spec fingerprint || tenant salt || block_tokens)
//
// (all integers little-endian), so key_b depends on every token 0..end of
// block b, on the model's weights and config (the caller's fingerprint, see
// model/fingerprint.h), on everything that changes the stored bytes
// (SpecFingerprint) and on the tenant. Nothing in it depends on the process
// (no pointers, no std::hash, no per-process seeds): the same prompt gives
// the same key anywhere. XXH3-128 rather than SHA-256: keys are computed on
// every lookup over every prompt token at memory speed (tens of GB/s against
// SHA-256's ~1 GB/s without SHA extensions), 128 bits make an accidental
// collision negligible (~2^-64 at 2^32 blocks), and a collision could never
// serve wrong KV anyway because a hit also compares the stored tokens
// (block_format.h). kvx already uses xxHash (libxxhash-dev) for its hashes.
//
// Thread-safety: value types and pure functions.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kv/kv_manager.h"
#include "util/status.h"

namespace kvx::kv::tier {

class StorageTransform;

struct BlockKey {
  uint64_t lo = 0, hi = 0;
  // 32 lowercase hex digits (hi then lo): file names, Redis keys.
  std::string Hex() const;
  // The inverse of Hex(); nullopt for anything that is not 32 hex digits.
  static std::optional<BlockKey> FromHex(std::string_view hex);
  bool operator==(const BlockKey&) const = default;
};

struct BlockKeyHash {
  size_t operator()(const BlockKey& k) const { return static_cast<size_t>(k.lo ^ (k.hi * 0x9e3779b97f4a7c15ull)); }
};

// A 64-bit digest of everything in a resolved spec that changes the bytes a
// page stores: the KV layout (layers, kv heads, head dim, page size), every
// layer's resolved codec (codec, K/V bits, group, sym, clip, outliers,
// sealing with its residual window, sink pages, page byte sizes), the
// rotation (and its seed) and pre-RoPE keys. Computed from the resolved
// layers, not from the spec's text, so two spellings of one configuration
// ("codec=int4" and "codec=int4,bits=k4v4,group=32") give one fingerprint;
// the pool budget and the policies (which decide what is kept, not how it is
// stored) are not part of it.
uint64_t SpecFingerprint(const ResolvedKVSpec& spec);

// Everything a block means besides its tokens and tenant: the key's other
// ingredients, and the shape of the pages it holds (to check them).
struct BlockSpace {
  uint64_t model_fingerprint = 0;
  uint64_t spec_fingerprint = 0;
  int block_tokens = 0;
  KVLayout layout;                 // the spec's
  std::vector<LayerCodec> layers;  // the spec's, one per layer
  // The compact level's calibrated transform (storage_transform.h), or null
  // (then compact blocks can be neither written nor read). Not in the key:
  // the block header records its digest, like the storage level.
  std::shared_ptr<const StorageTransform> transform;
  // A chunk's space (ChunkSpace): its one block is the whole chunk, keyed by
  // ChunkKey, its last page partial when block_tokens is not a whole number
  // of pages.
  bool chunk = false;
};

// The most tokens a block may hold (large blocks make partial hits rare and
// a value in Redis large).
inline constexpr int kMaxBlockTokens = 4096;

// The blocks of `spec`'s pages for the model with `model_fingerprint`.
// InvalidArgument unless block_tokens is a positive multiple of the spec's
// page size, at most kMaxBlockTokens.
Result<BlockSpace> MakeBlockSpace(const ResolvedKVSpec& spec, uint64_t model_fingerprint, int block_tokens);

// The keys of the full blocks of `tokens` (tokens.size() / block_tokens of
// them, in order) for tenant `salt`; in a chunk's space, ChunkKey of a chunk
// of exactly block_tokens tokens.
std::vector<BlockKey> BlockKeys(const BlockSpace& space, uint64_t salt, std::span<const int32_t> tokens);

// The key of a chunk (chunk reuse, kv/chunk_cache.h): the KV of `tokens`
// computed on their own at positions 0..n-1. The block key of one block
// holding exactly those tokens, under its own domain string
// ("kvx-chunk-key-v1"), since a chunk may hold any number of tokens:
//   key = XXH3_128("kvx-chunk-key-v1" || XXH3_128(0 || tokens) ||
//                  model fingerprint || spec fingerprint || salt || n)
// (space.block_tokens is not used: n is the chunk's length).
BlockKey ChunkKey(const BlockSpace& space, uint64_t salt, std::span<const int32_t> tokens);

// The space in which a chunk of `n_tokens` tokens (its KV computed alone, at
// positions 0..n-1) is stored as block 0 (chunk reuse in the tiers,
// docs/kv-reuse.md): `space` with block_tokens = n_tokens, its last page
// partial. InvalidArgument beyond 1..kMaxBlockTokens tokens.
Result<BlockSpace> ChunkSpace(const BlockSpace& space, int n_tokens);

// The XXH3-64 digest of a tenant salt as a block header records it.
uint64_t SaltDigest(uint64_t salt);

}  // namespace kvx::kv::tier
