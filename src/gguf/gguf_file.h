// GgufFile: a read-only, bounds-checked view of a GGUF v2/v3 file.
//
// The file is memory-mapped; tensor data is never copied. Every length,
// count, offset and type read from the file is validated before use, so a
// truncated, corrupted or hostile file yields a DataLoss/InvalidArgument
// status naming the problem, never a crash or an out-of-bounds read.
//
// Layout (little-endian): magic "GGUF", u32 version, u64 n_tensors,
// u64 n_kv, then n_kv key/values, n_tensors tensor infos, padding to
// `general.alignment` (default 32), then the tensor data section.
//
// Thread-safety: immutable after Open; safe to read from many threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "gguf/tensor_type.h"
#include "util/mmap_file.h"
#include "util/status.h"

namespace kvx::gguf {

enum class ValueType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5,
  kFloat32 = 6, kBool = 7, kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11,
  kFloat64 = 12,
};
const char* ValueTypeName(ValueType t);

// A metadata value. Integers of every width are held as int64/uint64 (the
// original type is kept in `type`); arrays hold their element type and
// elements (arrays may nest).
struct Value {
  ValueType type = ValueType::kUint8;
  ValueType array_type = ValueType::kUint8;  // element type when type == kArray
  std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<Value>> data;

  bool IsInteger() const;
  bool IsFloat() const;  // float32/float64
};

struct TensorInfo {
  std::string name;
  TensorType type = TensorType::kF32;
  // ggml order: dims[0] is the innermost (contiguous) dimension; a weight
  // matrix with n_out rows of n_in elements has dims {n_in, n_out}.
  std::vector<uint64_t> dims;
  uint64_t n_elements = 0;
  uint64_t offset = 0;    // relative to the data section, as stored
  uint64_t n_bytes = 0;   // validated: lies within the file
  const uint8_t* data = nullptr;
};

class GgufFile {
 public:
  static Result<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses a buffer the caller keeps alive (tests, fuzzing). `name` is used
  // in error messages.
  static Result<std::unique_ptr<GgufFile>> Parse(const uint8_t* data, size_t size,
                                                 const std::string& name = "<buffer>");

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::string& name() const { return name_; }
  // File offset where the tensor data section starts (a multiple of
  // alignment()); TensorInfo::offset is relative to it.
  uint64_t data_offset() const { return data_offset_; }

  // Metadata in file order.
  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  const Value* Find(std::string_view key) const;
  bool Has(std::string_view key) const { return Find(key) != nullptr; }

  // Typed getters: NotFound if absent, InvalidArgument naming the key and the
  // actual type if the type does not fit. Integer getters accept any integer
  // type whose value fits; GetFloat accepts floats and integers.
  Result<uint64_t> GetUint(std::string_view key) const;
  Result<int64_t> GetInt(std::string_view key) const;
  Result<double> GetFloat(std::string_view key) const;
  Result<bool> GetBool(std::string_view key) const;
  Result<std::string> GetString(std::string_view key) const;
  Result<std::vector<std::string>> GetStringArray(std::string_view key) const;
  Result<std::vector<double>> GetFloatArray(std::string_view key) const;
  Result<std::vector<int64_t>> GetIntArray(std::string_view key) const;
  // Convenience: the value or `fallback` when the key is absent (a present
  // key of the wrong type is still an error).
  Result<uint64_t> GetUintOr(std::string_view key, uint64_t fallback) const;
  Result<double> GetFloatOr(std::string_view key, double fallback) const;
  Result<bool> GetBoolOr(std::string_view key, bool fallback) const;
  Result<std::string> GetStringOr(std::string_view key, const std::string& fallback) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* FindTensor(std::string_view name) const;

  // Human-readable value (arrays abbreviated after `max_items`).
  static std::string ValueToString(const Value& v, size_t max_items = 8);

 private:
  GgufFile() = default;
  Status ParseAll(const uint8_t* data, size_t size);

  std::unique_ptr<MappedFile> file_;
  std::string name_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, Value>> kv_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace kvx::gguf
