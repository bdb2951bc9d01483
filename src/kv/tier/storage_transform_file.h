// The storage transform's side file (docs/tiers.md#the-compact-level): a
// transform calibrated once (`kvx calibrate-storage`, or a server's first
// start) is kept on disk so a server loads it instead of calibrating, and
// every process that reads a `compact` block from a shared tier decodes it
// with the same basis (the block header's digest says which).
//
// Layout (little-endian), version kTransformFileVersion (1):
//   magic "KVXSTRAN", u32 version, u64 model fingerprint
//   (model/fingerprint.h), u64 spec fingerprint (SpecFingerprint: layout,
//   codecs, pre-RoPE keys: what the pool's floats mean), u32 layers, u32 kv
//   heads, u32 head dim, u64 transform digest, then per table (layer-major)
//   and K, V: f32 mean[d], f32 basis[d][d], f32 variance[d], u8 bits[d];
//   last, u64 XXH3-64 of every byte before it.
// A file of another model or spec is refused naming both fingerprints; a
// damaged one (checksum, truncation, a digest that does not match its
// tensors) is DataLoss; another version Unimplemented.
//
// Thread-safety: pure functions (and the file system).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "kv/tier/block_key.h"
#include "kv/tier/storage_transform.h"
#include "util/status.h"

namespace kvx::kv::tier {

inline constexpr uint32_t kTransformFileVersion = 1;

// Which pool a transform was calibrated on.
struct TransformIdentity {
  uint64_t model_fingerprint = 0, spec_fingerprint = 0;
  int n_layers = 0, n_kv_heads = 0, head_dim = 0;
  std::string ToString() const;  // "model 0123..., KV spec 4567... (8 layers x 2 kv heads x 64)"
};
TransformIdentity IdentityOf(const BlockSpace& space);

std::string EncodeTransformFile(const StorageTransform& transform, const TransformIdentity& identity);
// `name` is the file's name in messages. InvalidArgument when it was
// calibrated for another identity than `expected` (both named).
Result<StorageTransform> DecodeTransformFile(std::span<const uint8_t> bytes, const TransformIdentity& expected,
                                             const std::string& name);

// The file at `path`, written atomically (util/output_file.h) / read and
// decoded as above.
Status WriteTransformFile(const std::string& path, const StorageTransform& transform, const TransformIdentity& identity);
Result<StorageTransform> ReadTransformFile(const std::string& path, const TransformIdentity& expected);

}  // namespace kvx::kv::tier
