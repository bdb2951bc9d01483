// GgufWriter: builds a GGUF v3 file (metadata + tensors) in memory and
// writes it to a file or a buffer, in the standard layout llama.cpp reads:
// header, key/values, tensor infos, zero padding to `general.alignment`,
// then each tensor's data padded to the alignment.
//
// Used by tests (hand-made and corrupted files), `kvx gen-model` and any tool
// that rewrites models. Metadata keys keep their first insertion order; a
// repeated Set* replaces the value in place. Tensors are written in the order
// they were added.
//
// Thread-safety: not thread-safe; one writer per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gguf/gguf_file.h"
#include "gguf/tensor_type.h"
#include "util/status.h"

namespace kvx::gguf {

struct GgufWriterOptions {
  // Alignment of the data section and of every tensor; a power of two.
  // When it differs from GGUF's default (32), `general.alignment` is written.
  uint32_t alignment = 32;
};

class GgufWriter {
 public:
  explicit GgufWriter(GgufWriterOptions options = {});

  // Typed setters. Setting "general.alignment" also changes the layout;
  // REQUIRES: it is a uint32 power of two (SetValue returns an error instead).
  void SetUint8(const std::string& key, uint8_t v);
  void SetInt8(const std::string& key, int8_t v);
  void SetUint16(const std::string& key, uint16_t v);
  void SetInt16(const std::string& key, int16_t v);
  void SetUint32(const std::string& key, uint32_t v);
  void SetInt32(const std::string& key, int32_t v);
  void SetUint64(const std::string& key, uint64_t v);
  void SetInt64(const std::string& key, int64_t v);
  void SetFloat32(const std::string& key, float v);
  void SetFloat64(const std::string& key, double v);
  void SetBool(const std::string& key, bool v);
  void SetString(const std::string& key, std::string v);
  void SetStringArray(const std::string& key, const std::vector<std::string>& v);
  void SetFloat32Array(const std::string& key, const std::vector<float>& v);
  void SetInt32Array(const std::string& key, const std::vector<int32_t>& v);
  void SetUint32Array(const std::string& key, const std::vector<uint32_t>& v);
  // Any value, including nested arrays (e.g. copied from a GgufFile).
  // InvalidArgument if the value is inconsistent (variant alternative does
  // not match `type`, array elements differ from `array_type`, nesting
  // deeper than the reader accepts) or sets a bad `general.alignment`.
  Status SetValue(const std::string& key, Value v);
  bool Remove(const std::string& key);

  // Adds a tensor. dims are in ggml order (dims[0] contiguous). InvalidArgument
  // for an empty or duplicate name, 0 or more than 4 dims, a row length that
  // is not a multiple of the type's block size, or a byte count that does not
  // match type and dims.
  Status AddTensor(const std::string& name, TensorType type, std::vector<uint64_t> dims,
                   std::vector<uint8_t> bytes);  // takes ownership
  Status AddTensor(const std::string& name, TensorType type, std::vector<uint64_t> dims,
                   const void* data, size_t n_bytes);  // copies
  // Like AddTensor but only references `data`, which must stay alive until
  // the last Write* call (for streaming large tensors from a mapped file).
  Status AddTensorRef(const std::string& name, TensorType type, std::vector<uint64_t> dims,
                      const void* data, size_t n_bytes);

  uint32_t alignment() const { return alignment_; }
  size_t n_tensors() const { return tensors_.size(); }
  size_t n_metadata() const { return kv_.size(); }

  // Writes the file under kvx's rule for output files (util/output_file.h):
  // via a temporary beside it, renamed on success, so a failed write never
  // leaves a half-written model under the final name; devices, FIFOs and
  // directories are refused.
  Status WriteToFile(const std::string& path) const;
  std::vector<uint8_t> WriteToBuffer() const;

 private:
  struct PendingTensor {
    std::string name;
    TensorType type;
    std::vector<uint64_t> dims;
    std::vector<uint8_t> owned;
    const uint8_t* data = nullptr;  // into `owned` or the caller's memory
    size_t n_bytes = 0;
  };
  void Set(const std::string& key, Value v);
  Status CheckTensor(const std::string& name, TensorType type,
                     const std::vector<uint64_t>& dims, size_t n_bytes) const;
  // Everything before the data section, padded to the alignment.
  std::vector<uint8_t> EncodeHeader() const;

  uint32_t alignment_;
  std::vector<std::pair<std::string, Value>> kv_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<PendingTensor> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace kvx::gguf
