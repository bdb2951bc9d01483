#include "kv/tier/storage_transform_file.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "util/byte_io.h"
#include "util/mmap_file.h"
#include "util/output_file.h"

namespace kvx::kv::tier {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'X', 'S', 'T', 'R', 'A', 'N'};
// A transform of head dim d is ~4 d^2 bytes a tensor: 1 GiB bounds any real one.
constexpr size_t kMaxTransformFileBytes = size_t{1} << 30;

std::string Hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

bool SameIdentity(const TransformIdentity& a, const TransformIdentity& b) {
  return a.model_fingerprint == b.model_fingerprint && a.spec_fingerprint == b.spec_fingerprint &&
         a.n_layers == b.n_layers && a.n_kv_heads == b.n_kv_heads && a.head_dim == b.head_dim;
}

}  // namespace

std::string TransformIdentity::ToString() const {
  return "model " + Hex(model_fingerprint) + ", KV spec " + Hex(spec_fingerprint) + " (" + std::to_string(n_layers) +
         " layers x " + std::to_string(n_kv_heads) + " kv heads x head dim " + std::to_string(head_dim) + ")";
}

TransformIdentity IdentityOf(const BlockSpace& space) {
  return {space.model_fingerprint, space.spec_fingerprint, space.layout.n_layers, space.layout.n_kv_heads,
          space.layout.head_dim};
}

std::string EncodeTransformFile(const StorageTransform& transform, const TransformIdentity& identity) {
  ByteWriter w;
  w.Bytes(kMagic, sizeof kMagic);
  w.U32(kTransformFileVersion);
  w.U64(identity.model_fingerprint);
  w.U64(identity.spec_fingerprint);
  w.U32(static_cast<uint32_t>(identity.n_layers));
  w.U32(static_cast<uint32_t>(identity.n_kv_heads));
  w.U32(static_cast<uint32_t>(identity.head_dim));
  w.U64(transform.digest());
  for (int t = 0; t < transform.tables(); ++t) {
    for (int kv = 0; kv < 2; ++kv) {
      const TensorTransform& tt = transform.tensor(t, kv);
      w.Bytes(tt.mean.data(), tt.mean.size() * sizeof(float));
      w.Bytes(tt.basis.data(), tt.basis.size() * sizeof(float));
      w.Bytes(tt.variance.data(), tt.variance.size() * sizeof(float));
      w.Bytes(tt.bits.data(), tt.bits.size());
    }
  }
  w.U64(XXH3_64bits(w.out().data(), w.out().size()));
  return std::move(w.out());
}

Result<StorageTransform> DecodeTransformFile(std::span<const uint8_t> bytes, const TransformIdentity& expected,
                                             const std::string& name) {
  if (bytes.size() < sizeof kMagic + 4 + 8 || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) {
    return InvalidArgument(name + " is not a kvx storage transform file (write one with kvx calibrate-storage)");
  }
  ByteReader r(bytes, "storage transform file");
  r.Span(sizeof kMagic, "magic");
  const uint32_t version = r.U32("version");
  if (version != kTransformFileVersion) {
    return Unimplemented(name + " is a storage transform file of version " + std::to_string(version) + "; this kvx reads version " +
                         std::to_string(kTransformFileVersion) + ": calibrate it again with kvx calibrate-storage");
  }
  const size_t body = bytes.size() - 8;
  uint64_t stored_sum = 0;
  std::memcpy(&stored_sum, bytes.data() + body, 8);
  if (XXH3_64bits(bytes.data(), body) != stored_sum) {
    return DataLoss(name + " is damaged (its checksum does not match): calibrate it again with kvx calibrate-storage");
  }
  TransformIdentity id;
  id.model_fingerprint = r.U64("model fingerprint");
  id.spec_fingerprint = r.U64("spec fingerprint");
  id.n_layers = static_cast<int>(r.U32("layers"));
  id.n_kv_heads = static_cast<int>(r.U32("kv heads"));
  id.head_dim = static_cast<int>(r.U32("head dim"));
  const uint64_t digest = r.U64("transform digest");
  if (!r.ok()) return r.Error();
  if (!SameIdentity(id, expected)) {
    return InvalidArgument(name + " is the storage transform of " + id.ToString() + ", not of this one, " +
                           expected.ToString() + ": calibrate one for this model and --kv with kvx calibrate-storage");
  }
  const uint64_t d = static_cast<uint64_t>(id.head_dim);
  std::vector<TensorTransform> tensors(static_cast<size_t>(id.n_layers) * static_cast<size_t>(id.n_kv_heads) * 2);
  for (TensorTransform& t : tensors) {
    r.Array(&t.mean, d, "means");
    r.Array(&t.basis, d * d, "basis");
    r.Array(&t.variance, d, "variances");
    r.Array(&t.bits, d, "bit widths");
    if (!r.ok()) return r.Error();
  }
  if (r.U64("checksum") != stored_sum || !r.at_end()) return DataLoss(name + " has bytes past its checksum");
  Result<StorageTransform> t = StorageTransform::FromTensors(id.head_dim, std::move(tensors));
  if (!t.ok()) return DataLoss(name + ": " + t.status().message());
  if (t->digest() != digest) return DataLoss(name + "'s tensors do not match its digest");
  return t;
}

Status WriteTransformFile(const std::string& path, const StorageTransform& transform, const TransformIdentity& identity) {
  return WriteFileAtomically(path, EncodeTransformFile(transform, identity));
}

Result<StorageTransform> ReadTransformFile(const std::string& path, const TransformIdentity& expected) {
  KVX_ASSIGN_OR_RETURN(const std::string bytes, ReadFileToString(path, kMaxTransformFileBytes));
  return DecodeTransformFile({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, expected, path);
}

}  // namespace kvx::kv::tier
