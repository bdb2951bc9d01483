#include "gguf/gguf_file.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "util/printable.h"

namespace kvx::gguf {

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader assumes a little-endian host");

namespace {

constexpr uint32_t kMaxDims = 4;        // GGML_MAX_DIMS
constexpr int kMaxNesting = 8;          // arrays of arrays deeper than this are rejected
constexpr uint64_t kDefaultAlignment = 32;
// Each parsed metadata value costs ~48 bytes in memory, so a file made of one
// huge uint8 array could demand 48x its size. Real models stay far below this
// (a 262k-token vocabulary with scores, types and merges is ~1M values).
constexpr uint64_t kMaxMetadataValues = uint64_t{1} << 24;
constexpr uint32_t kMaxValueType = static_cast<uint32_t>(ValueType::kFloat64);
constexpr char kCorruptHint[] = "the file is truncated or corrupt; re-download or re-convert it";

std::string Num(uint64_t v) { return std::to_string(v); }

bool IsValidValueType(uint32_t t) { return t <= kMaxValueType; }

// The fewest bytes one encoded value of type `t` can take. Used to bound
// element counts by the bytes that are left before anything is allocated.
uint64_t MinEncodedSize(ValueType t) {
  switch (t) {
    case ValueType::kUint8: case ValueType::kInt8: case ValueType::kBool: return 1;
    case ValueType::kUint16: case ValueType::kInt16: return 2;
    case ValueType::kUint32: case ValueType::kInt32: case ValueType::kFloat32: return 4;
    case ValueType::kUint64: case ValueType::kInt64: case ValueType::kFloat64: return 8;
    case ValueType::kString: return 8;   // u64 length, possibly empty
    case ValueType::kArray: return 12;   // u32 element type + u64 count
  }
  return 1;
}

// Sequential little-endian reader over [data, data + size). Every read is
// bounds-checked; a short read is reported with the offset and what was
// being read, so a truncation is easy to diagnose.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  Status Read(void* out, size_t n, const char* what) {
    if (n > remaining()) {
      return DataLoss("unexpected end of file at offset " + Num(pos_) + " while reading " + what +
                      " (needs " + Num(n) + " bytes, " + Num(remaining()) + " left): " +
                      kCorruptHint);
    }
    if (n > 0) std::memcpy(out, data_ + pos_, n);
    pos_ += n;
    return Status::Ok();
  }
  template <typename T>
  Status ReadPod(T* out, const char* what) {
    return Read(out, sizeof(T), what);
  }

  Status ReadString(std::string* out, const char* what) {
    uint64_t len = 0;
    const size_t at = pos_;
    KVX_RETURN_IF_ERROR(ReadPod(&len, what));
    if (len > remaining()) {
      return DataLoss(std::string(what) + " at offset " + Num(at) + " claims a length of " +
                      Num(len) + " bytes but only " + Num(remaining()) + " are left: " +
                      kCorruptHint);
    }
    out->assign(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return Status::Ok();
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Reads a `Wire`-typed scalar and stores it widened to `Held` (all integers
// are held as uint64/int64, floats as double; see Value).
template <typename Wire, typename Held>
Status ReadAs(Cursor& c, const char* what, Value* out) {
  Wire v;
  KVX_RETURN_IF_ERROR(c.ReadPod(&v, what));
  out->data = static_cast<Held>(v);
  return Status::Ok();
}

Status ReadValue(Cursor& c, ValueType type, int depth, uint64_t* budget, Value* out);

Status ReadArray(Cursor& c, int depth, uint64_t* budget, Value* out) {
  const size_t at = c.pos();
  uint32_t elem_type = 0;
  KVX_RETURN_IF_ERROR(c.ReadPod(&elem_type, "array element type"));
  if (!IsValidValueType(elem_type)) {
    return DataLoss("array at offset " + Num(at) + " has unknown element type id " +
                    Num(elem_type) + " (valid ids are 0.." + Num(kMaxValueType) + "): " +
                    kCorruptHint);
  }
  const ValueType et = static_cast<ValueType>(elem_type);
  if (et == ValueType::kArray && depth + 1 >= kMaxNesting) {
    return DataLoss("arrays nested more than " + Num(kMaxNesting) + " deep at offset " + Num(at) +
                    ": kvx refuses such files; " + kCorruptHint);
  }
  uint64_t count = 0;
  KVX_RETURN_IF_ERROR(c.ReadPod(&count, "array element count"));
  const uint64_t min_size = MinEncodedSize(et);
  if (count > c.remaining() / min_size) {
    return DataLoss("array at offset " + Num(at) + " claims " + Num(count) + " elements of type " +
                    ValueTypeName(et) + " (at least " + Num(min_size) + " bytes each) but only " +
                    Num(c.remaining()) + " bytes are left: " + kCorruptHint);
  }
  if (count > *budget) {
    return ResourceExhausted("array at offset " + Num(at) + " would bring the metadata to more "
                             "than " + Num(kMaxMetadataValues) + " values; kvx refuses such "
                             "files (real models have far fewer): " + kCorruptHint);
  }
  *budget -= count;
  out->type = ValueType::kArray;
  out->array_type = et;
  std::vector<Value> elems;
  // Safe: count is bounded by the remaining bytes checked above.
  elems.resize(static_cast<size_t>(count));
  for (Value& e : elems) KVX_RETURN_IF_ERROR(ReadValue(c, et, depth + 1, budget, &e));
  out->data = std::move(elems);
  return Status::Ok();
}

Status ReadValue(Cursor& c, ValueType type, int depth, uint64_t* budget, Value* out) {
  out->type = type;
  switch (type) {
    case ValueType::kUint8: return ReadAs<uint8_t, uint64_t>(c, "uint8 value", out);
    case ValueType::kUint16: return ReadAs<uint16_t, uint64_t>(c, "uint16 value", out);
    case ValueType::kUint32: return ReadAs<uint32_t, uint64_t>(c, "uint32 value", out);
    case ValueType::kUint64: return ReadAs<uint64_t, uint64_t>(c, "uint64 value", out);
    case ValueType::kInt8: return ReadAs<int8_t, int64_t>(c, "int8 value", out);
    case ValueType::kInt16: return ReadAs<int16_t, int64_t>(c, "int16 value", out);
    case ValueType::kInt32: return ReadAs<int32_t, int64_t>(c, "int32 value", out);
    case ValueType::kInt64: return ReadAs<int64_t, int64_t>(c, "int64 value", out);
    case ValueType::kFloat32: return ReadAs<float, double>(c, "float32 value", out);
    case ValueType::kFloat64: return ReadAs<double, double>(c, "float64 value", out);
    case ValueType::kBool: {
      const size_t at = c.pos();
      uint8_t v;
      KVX_RETURN_IF_ERROR(c.ReadPod(&v, "bool value"));
      // Writers emit 0 or 1; anything else means the bytes are not a bool.
      if (v > 1) {
        return DataLoss("bool value at offset " + Num(at) + " is " + Num(v) +
                        " (must be 0 or 1): " + kCorruptHint);
      }
      out->data = v == 1;
      break;
    }
    case ValueType::kString: {
      std::string s;
      KVX_RETURN_IF_ERROR(c.ReadString(&s, "string value"));
      out->data = std::move(s);
      break;
    }
    case ValueType::kArray:
      return ReadArray(c, depth, budget, out);
  }
  return Status::Ok();
}

bool IsIntegerType(ValueType t) {
  switch (t) {
    case ValueType::kUint8: case ValueType::kInt8: case ValueType::kUint16:
    case ValueType::kInt16: case ValueType::kUint32: case ValueType::kInt32:
    case ValueType::kUint64: case ValueType::kInt64:
      return true;
    default:
      return false;
  }
}

// A path in a message (printable; long paths are rare but legitimate).
std::string QuotePath(std::string_view s) { return QuotePrintable(s, 4096); }
// A key or tensor name from the file, quoted for a message (printable, capped).
std::string Quote(std::string_view s) { return QuotePrintable(s); }

// Integer value of `v` as uint64 (false if negative or not an integer).
bool AsUint(const Value& v, uint64_t* out) {
  if (const uint64_t* u = std::get_if<uint64_t>(&v.data)) { *out = *u; return true; }
  if (const int64_t* i = std::get_if<int64_t>(&v.data)) {
    if (*i < 0) return false;
    *out = static_cast<uint64_t>(*i);
    return true;
  }
  return false;
}
bool AsInt(const Value& v, int64_t* out) {
  if (const int64_t* i = std::get_if<int64_t>(&v.data)) { *out = *i; return true; }
  if (const uint64_t* u = std::get_if<uint64_t>(&v.data)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(*u);
    return true;
  }
  return false;
}
bool AsDouble(const Value& v, double* out) {
  if (const double* d = std::get_if<double>(&v.data)) { *out = *d; return true; }
  if (const uint64_t* u = std::get_if<uint64_t>(&v.data)) {
    *out = static_cast<double>(*u);
    return true;
  }
  if (const int64_t* i = std::get_if<int64_t>(&v.data)) {
    *out = static_cast<double>(*i);
    return true;
  }
  return false;
}

std::string TypeDescription(const Value& v) {
  if (v.type == ValueType::kArray) {
    return std::string("array of ") + ValueTypeName(v.array_type);
  }
  return ValueTypeName(v.type);
}

}  // namespace

const char* ValueTypeName(ValueType t) {
  switch (t) {
    case ValueType::kUint8: return "uint8";
    case ValueType::kInt8: return "int8";
    case ValueType::kUint16: return "uint16";
    case ValueType::kInt16: return "int16";
    case ValueType::kUint32: return "uint32";
    case ValueType::kInt32: return "int32";
    case ValueType::kFloat32: return "float32";
    case ValueType::kBool: return "bool";
    case ValueType::kString: return "string";
    case ValueType::kArray: return "array";
    case ValueType::kUint64: return "uint64";
    case ValueType::kInt64: return "int64";
    case ValueType::kFloat64: return "float64";
  }
  return "unknown";
}

bool Value::IsInteger() const { return IsIntegerType(type); }
bool Value::IsFloat() const { return type == ValueType::kFloat32 || type == ValueType::kFloat64; }

Result<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  KVX_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapped, MappedFile::Open(path));
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->name_ = path;
  const Status st = f->ParseAll(mapped->data(), mapped->size());
  if (!st.ok()) return st.WithContext(QuotePath(path));
  f->file_ = std::move(mapped);
  return f;
}

Result<std::unique_ptr<GgufFile>> GgufFile::Parse(const uint8_t* data, size_t size,
                                                  const std::string& name) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->name_ = name;
  const Status st = f->ParseAll(data, size);
  if (!st.ok()) return st.WithContext(QuotePath(name));
  return f;
}

Status GgufFile::ParseAll(const uint8_t* data, size_t size) {
  Cursor c(data, size);

  // ---- header ----
  char magic[4];
  if (size < 4 || std::memcmp(data, "GGUF", 4) != 0) {
    std::string shown;
    for (size_t i = 0; i < std::min<size_t>(size, 4); ++i) {
      const char ch = static_cast<char>(data[i]);
      if (ch >= 32 && ch < 127) {
        shown += ch;
      } else {
        static const char kHex[] = "0123456789abcdef";
        shown += "\\x";
        shown += kHex[data[i] >> 4];
        shown += kHex[data[i] & 0xF];
      }
    }
    return InvalidArgument("not a GGUF file (starts with \"" + shown +
                           "\", expected \"GGUF\"): pass a .gguf model file");
  }
  KVX_RETURN_IF_ERROR(c.Read(magic, 4, "magic"));
  uint32_t version = 0;
  KVX_RETURN_IF_ERROR(c.ReadPod(&version, "version"));
  if (version == 1) {
    return Unimplemented("unsupported old GGUF version 1: re-convert the model with a current "
                         "llama.cpp (GGUF v2 or v3)");
  }
  if (version != 2 && version != 3) {
    // A big-endian file stores its small version number byte-swapped, so the
    // low 16 bits read as zero on a little-endian host.
    const uint32_t swapped = __builtin_bswap32(version);
    if ((version & 0xFFFFu) == 0 && swapped >= 1 && swapped <= 3) {
      return Unimplemented("this is a big-endian GGUF file (version " + Num(swapped) +
                           " byte-swapped); kvx reads only little-endian GGUF: convert it "
                           "with a little-endian llama.cpp / gguf-py");
    }
    return Unimplemented("unsupported GGUF version " + Num(version) +
                         " (kvx reads versions 2 and 3): the file may be newer than kvx or "
                         "corrupt");
  }
  version_ = version;
  uint64_t n_tensors = 0, n_kv = 0;
  KVX_RETURN_IF_ERROR(c.ReadPod(&n_tensors, "tensor count"));
  KVX_RETURN_IF_ERROR(c.ReadPod(&n_kv, "metadata count"));
  // Each metadata entry takes at least a key length (8), a type (4) and a
  // one-byte value; each tensor info at least 8 + 4 + 4 + 8 bytes plus one
  // dimension. Reject counts the file cannot possibly hold up front.
  constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
  constexpr uint64_t kMinTensorBytes = 8 + 4 + 8 + 4 + 8;
  if (n_kv > c.remaining() / kMinKvBytes) {
    return DataLoss("header claims " + Num(n_kv) + " metadata entries but only " +
                    Num(c.remaining()) + " bytes follow: " + kCorruptHint);
  }
  if (n_tensors > (c.remaining() - n_kv * kMinKvBytes) / kMinTensorBytes) {
    return DataLoss("header claims " + Num(n_tensors) + " tensors but only " +
                    Num(c.remaining()) + " bytes follow: " + kCorruptHint);
  }

  // ---- metadata ----
  kv_.reserve(static_cast<size_t>(n_kv));
  uint64_t value_budget = kMaxMetadataValues;
  for (uint64_t i = 0; i < n_kv; ++i) {
    const size_t at = c.pos();
    std::string key;
    Status st = c.ReadString(&key, "metadata key");
    if (!st.ok()) return st.WithContext("metadata entry " + Num(i) + " of " + Num(n_kv));
    const std::string ctx = "metadata entry " + Num(i) + " " + Quote(key) + " (offset " +
                            Num(at) + ")";
    if (kv_index_.count(key) != 0) {
      return DataLoss(ctx + ": duplicate key (first seen as entry " + Num(kv_index_[key]) +
                      "): " + kCorruptHint);
    }
    uint32_t type = 0;
    st = c.ReadPod(&type, "value type");
    if (!st.ok()) return st.WithContext(ctx);
    if (!IsValidValueType(type)) {
      return DataLoss(ctx + ": unknown value type id " + Num(type) + " (valid ids are 0.." +
                      Num(kMaxValueType) + "): " + kCorruptHint);
    }
    Value value;
    st = ReadValue(c, static_cast<ValueType>(type), 0, &value_budget, &value);
    if (!st.ok()) return st.WithContext(ctx);
    kv_index_.emplace(key, kv_.size());
    kv_.emplace_back(std::move(key), std::move(value));
  }

  // ---- alignment ----
  alignment_ = kDefaultAlignment;
  if (const Value* a = Find("general.alignment")) {
    const uint64_t* v = std::get_if<uint64_t>(&a->data);
    if (a->type != ValueType::kUint32 || v == nullptr) {
      return DataLoss("'general.alignment' has type " + TypeDescription(*a) +
                      " but must be uint32: " + kCorruptHint);
    }
    if (*v == 0 || !std::has_single_bit(*v)) {
      return DataLoss("'general.alignment' is " + Num(*v) +
                      " but must be a nonzero power of two: " + kCorruptHint);
    }
    alignment_ = *v;
  }

  // ---- tensor infos ----
  tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const size_t at = c.pos();
    TensorInfo t;
    Status st = c.ReadString(&t.name, "tensor name");
    if (!st.ok()) return st.WithContext("tensor info " + Num(i) + " of " + Num(n_tensors));
    const std::string ctx = "tensor " + Quote(t.name) + " (info " + Num(i) + ", offset " +
                            Num(at) + ")";
    if (t.name.empty()) return DataLoss(ctx + ": empty tensor name: " + kCorruptHint);
    if (tensor_index_.count(t.name) != 0) {
      return DataLoss(ctx + ": duplicate tensor name: " + kCorruptHint);
    }
    uint32_t n_dims = 0;
    st = c.ReadPod(&n_dims, "dimension count");
    if (!st.ok()) return st.WithContext(ctx);
    if (n_dims == 0 || n_dims > kMaxDims) {
      return DataLoss(ctx + ": has " + Num(n_dims) + " dimensions (must be 1.." + Num(kMaxDims) +
                      "): " + kCorruptHint);
    }
    t.dims.resize(n_dims);
    t.n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      st = c.ReadPod(&t.dims[d], "dimension");
      if (!st.ok()) return st.WithContext(ctx);
      // ggml stores dims as int64, so larger values are negative there.
      if (t.dims[d] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          __builtin_mul_overflow(t.n_elements, t.dims[d], &t.n_elements) ||
          t.n_elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return DataLoss(ctx + ": dimension " + Num(d) + " = " + Num(t.dims[d]) +
                        " makes the element count overflow: " + kCorruptHint);
      }
    }
    uint32_t type_id = 0;
    st = c.ReadPod(&type_id, "tensor type");
    if (!st.ok()) return st.WithContext(ctx);
    const TensorTypeTraits* traits = GetTensorTypeTraits(type_id);
    if (traits == nullptr) {
      return Unimplemented(ctx + ": unknown tensor type id " + Num(type_id) +
                           " (not a ggml type kvx knows; the file may need a newer kvx, or it "
                           "uses a type removed from ggml: re-convert it)");
    }
    t.type = static_cast<TensorType>(type_id);
    if (t.dims[0] % traits->block_size != 0) {
      return DataLoss(ctx + ": row length " + Num(t.dims[0]) + " is not a multiple of the " +
                      traits->name + " block size " + Num(traits->block_size) + ": " +
                      kCorruptHint);
    }
    // Cannot overflow: n_elements < 2^63 and type_size/block_size <= 8.
    const uint64_t rows = t.dims[0] == 0 ? 0 : t.n_elements / t.dims[0];
    if (__builtin_mul_overflow(t.dims[0] / traits->block_size * traits->type_size, rows,
                               &t.n_bytes)) {
      return DataLoss(ctx + ": byte size overflows: " + kCorruptHint);
    }
    st = c.ReadPod(&t.offset, "tensor data offset");
    if (!st.ok()) return st.WithContext(ctx);
    if (t.offset % alignment_ != 0) {
      return DataLoss(ctx + ": data offset " + Num(t.offset) + " is not a multiple of the " +
                      "alignment " + Num(alignment_) + ": " + kCorruptHint);
    }
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // ---- data section ----
  // It starts at the first multiple of the alignment after the tensor infos.
  const uint64_t end_of_infos = c.pos();
  const uint64_t data_start = (end_of_infos + alignment_ - 1) / alignment_ * alignment_;
  data_offset_ = data_start;
  if (n_tensors == 0) return Status::Ok();  // vocab-only files may omit the padding
  if (data_start > size) {
    return DataLoss("tensor data section would start at offset " + Num(data_start) +
                    " but the file has only " + Num(size) + " bytes: " + kCorruptHint);
  }
  const uint64_t data_size = size - data_start;
  for (TensorInfo& t : tensors_) {
    if (t.offset > data_size || t.n_bytes > data_size - t.offset) {
      return DataLoss("tensor " + Quote(t.name) + " data [offset " + Num(data_start + t.offset) +
                      ", " + Num(t.n_bytes) + " bytes] extends past end of file (size " +
                      Num(size) + "): the file is truncated; re-download or re-convert it");
    }
    t.data = data + data_start + t.offset;
  }
  // Tensors must not overlap: overlapping data means a corrupt offset table.
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(tensors_.size());
  for (const TensorInfo& t : tensors_) {
    if (t.n_bytes > 0) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo* prev = by_offset[i - 1];
    if (prev->offset + prev->n_bytes > by_offset[i]->offset) {
      return DataLoss("tensors " + Quote(prev->name) + " and " + Quote(by_offset[i]->name) +
                      " overlap in the data section (offsets " + Num(prev->offset) + " and " +
                      Num(by_offset[i]->offset) + "): " + kCorruptHint);
    }
  }
  return Status::Ok();
}

// ---- lookups ----

const Value* GgufFile::Find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const TensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

Status MissingKey(const std::string& file, std::string_view key) {
  return NotFound(QuotePath(file) + ": metadata key " + Quote(key) + " is missing");
}
Status WrongType(const std::string& file, std::string_view key, const Value& v,
                 const char* wanted) {
  return InvalidArgument(QuotePath(file) + ": metadata key " + Quote(key) + " has type " +
                         TypeDescription(v) + ", expected " + wanted);
}

}  // namespace

Result<uint64_t> GgufFile::GetUint(std::string_view key) const {
  const Value* v = Find(key);
  if (v == nullptr) return MissingKey(name_, key);
  uint64_t out;
  if (!v->IsInteger()) return WrongType(name_, key, *v, "an unsigned integer");
  if (!AsUint(*v, &out)) {
    return InvalidArgument(QuotePath(name_) + ": metadata key " + Quote(key) + " is negative (" +
                           ValueToString(*v) + "), expected an unsigned integer");
  }
  return out;
}

Result<int64_t> GgufFile::GetInt(std::string_view key) const {
  const Value* v = Find(key);
  if (v == nullptr) return MissingKey(name_, key);
  int64_t out;
  if (!v->IsInteger()) return WrongType(name_, key, *v, "an integer");
  if (!AsInt(*v, &out)) {
    return InvalidArgument(QuotePath(name_) + ": metadata key " + Quote(key) + " = " +
                           ValueToString(*v) + " does not fit in int64");
  }
  return out;
}

Result<double> GgufFile::GetFloat(std::string_view key) const {
  const Value* v = Find(key);
  if (v == nullptr) return MissingKey(name_, key);
  double out;
  if (!(v->IsInteger() || v->IsFloat()) || !AsDouble(*v, &out)) {
    return WrongType(name_, key, *v, "a number");
  }
  return out;
}

Result<bool> GgufFile::GetBool(std::string_view key) const {
  const Value* v = Find(key);
  if (v == nullptr) return MissingKey(name_, key);
  const bool* b = std::get_if<bool>(&v->data);
  if (v->type != ValueType::kBool || b == nullptr) return WrongType(name_, key, *v, "bool");
  return *b;
}

Result<std::string> GgufFile::GetString(std::string_view key) const {
  const Value* v = Find(key);
  if (v == nullptr) return MissingKey(name_, key);
  const std::string* s = std::get_if<std::string>(&v->data);
  if (v->type != ValueType::kString || s == nullptr) return WrongType(name_, key, *v, "string");
  return *s;
}

Result<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  const Value* v = Find(key);
  if (v == nullptr) return MissingKey(name_, key);
  const auto* arr = std::get_if<std::vector<Value>>(&v->data);
  if (v->type != ValueType::kArray || v->array_type != ValueType::kString || arr == nullptr) {
    return WrongType(name_, key, *v, "array of string");
  }
  std::vector<std::string> out;
  out.reserve(arr->size());
  for (const Value& e : *arr) {
    const std::string* s = std::get_if<std::string>(&e.data);
    if (s == nullptr) return WrongType(name_, key, *v, "array of string");
    out.push_back(*s);
  }
  return out;
}

Result<std::vector<double>> GgufFile::GetFloatArray(std::string_view key) const {
  const Value* v = Find(key);
  if (v == nullptr) return MissingKey(name_, key);
  const auto* arr = std::get_if<std::vector<Value>>(&v->data);
  if (v->type != ValueType::kArray || arr == nullptr ||
      !(IsIntegerType(v->array_type) || v->array_type == ValueType::kFloat32 ||
        v->array_type == ValueType::kFloat64)) {
    return WrongType(name_, key, *v, "array of numbers");
  }
  std::vector<double> out(arr->size());
  for (size_t i = 0; i < arr->size(); ++i) {
    if (!AsDouble((*arr)[i], &out[i])) return WrongType(name_, key, *v, "array of numbers");
  }
  return out;
}

Result<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  const Value* v = Find(key);
  if (v == nullptr) return MissingKey(name_, key);
  const auto* arr = std::get_if<std::vector<Value>>(&v->data);
  if (v->type != ValueType::kArray || arr == nullptr || !IsIntegerType(v->array_type)) {
    return WrongType(name_, key, *v, "array of integers");
  }
  std::vector<int64_t> out(arr->size());
  for (size_t i = 0; i < arr->size(); ++i) {
    if (!AsInt((*arr)[i], &out[i])) {
      return InvalidArgument(QuotePath(name_) + ": metadata key " + Quote(key) + " element " +
                             Num(i) + " does not fit in int64");
    }
  }
  return out;
}

Result<uint64_t> GgufFile::GetUintOr(std::string_view key, uint64_t fallback) const {
  if (!Has(key)) return fallback;
  return GetUint(key);
}
Result<double> GgufFile::GetFloatOr(std::string_view key, double fallback) const {
  if (!Has(key)) return fallback;
  return GetFloat(key);
}
Result<bool> GgufFile::GetBoolOr(std::string_view key, bool fallback) const {
  if (!Has(key)) return fallback;
  return GetBool(key);
}
Result<std::string> GgufFile::GetStringOr(std::string_view key,
                                          const std::string& fallback) const {
  if (!Has(key)) return fallback;
  return GetString(key);
}

std::string GgufFile::ValueToString(const Value& v, size_t max_items) {
  if (const auto* arr = std::get_if<std::vector<Value>>(&v.data)) {
    std::string out = "[";
    for (size_t i = 0; i < arr->size() && i < max_items; ++i) {
      if (i > 0) out += ", ";
      out += ValueToString((*arr)[i], max_items);
    }
    if (arr->size() > max_items) {
      out += ", ... (" + Num(arr->size()) + " items)";
    }
    return out + "]";
  }
  if (const auto* s = std::get_if<std::string>(&v.data)) {
    // Quotes and backslashes escaped, then Printable(): a file's string may
    // hold NULs, terminal escapes or invalid UTF-8 (util/printable.h).
    std::string escaped;
    escaped.reserve(s->size());
    for (char ch : *s) {
      if (ch == '"' || ch == '\\') escaped += '\\';
      escaped += ch;
    }
    return "\"" + Printable(escaped, std::numeric_limits<size_t>::max()) + "\"";
  }
  if (const auto* b = std::get_if<bool>(&v.data)) return *b ? "true" : "false";
  if (const auto* u = std::get_if<uint64_t>(&v.data)) return Num(*u);
  if (const auto* i = std::get_if<int64_t>(&v.data)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v.data)) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.9g", *d);
    return buf;
  }
  return "?";
}

}  // namespace kvx::gguf
