#include "gguf/gguf_writer.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

#include "util/check.h"
#include "util/output_file.h"

namespace kvx::gguf {
namespace {

constexpr char kAlignmentKey[] = "general.alignment";
constexpr uint32_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;
constexpr int kMaxNesting = 8;  // same limit as the reader
constexpr uint32_t kGgufVersion = 3;

bool ValidAlignment(uint64_t a) {
  return a != 0 && a <= std::numeric_limits<uint32_t>::max() && std::has_single_bit(a);
}

// Checks that `v` is internally consistent, so that encoding it cannot fail
// and the reader would accept the result.
Status CheckValue(const Value& v, int depth, const std::string& key) {
  auto bad = [&](const std::string& what) {
    return InvalidArgument("metadata value for '" + key + "': " + what);
  };
  auto fits_uint = [&](uint64_t max) -> Status {
    const uint64_t* u = std::get_if<uint64_t>(&v.data);
    if (u == nullptr) return bad(std::string(ValueTypeName(v.type)) + " must hold a uint64");
    if (*u > max) return bad(std::to_string(*u) + " does not fit in " + ValueTypeName(v.type));
    return Status::Ok();
  };
  auto fits_int = [&](int64_t lo, int64_t hi) -> Status {
    const int64_t* i = std::get_if<int64_t>(&v.data);
    if (i == nullptr) return bad(std::string(ValueTypeName(v.type)) + " must hold an int64");
    if (*i < lo || *i > hi) {
      return bad(std::to_string(*i) + " does not fit in " + ValueTypeName(v.type));
    }
    return Status::Ok();
  };
  switch (v.type) {
    case ValueType::kUint8: return fits_uint(UINT8_MAX);
    case ValueType::kUint16: return fits_uint(UINT16_MAX);
    case ValueType::kUint32: return fits_uint(UINT32_MAX);
    case ValueType::kUint64: return fits_uint(UINT64_MAX);
    case ValueType::kInt8: return fits_int(INT8_MIN, INT8_MAX);
    case ValueType::kInt16: return fits_int(INT16_MIN, INT16_MAX);
    case ValueType::kInt32: return fits_int(INT32_MIN, INT32_MAX);
    case ValueType::kInt64: return fits_int(INT64_MIN, INT64_MAX);
    case ValueType::kFloat32:
    case ValueType::kFloat64:
      return std::holds_alternative<double>(v.data) ? Status::Ok()
                                                    : bad("float must hold a double");
    case ValueType::kBool:
      return std::holds_alternative<bool>(v.data) ? Status::Ok() : bad("bool must hold a bool");
    case ValueType::kString:
      return std::holds_alternative<std::string>(v.data) ? Status::Ok()
                                                         : bad("string must hold a std::string");
    case ValueType::kArray: {
      const auto* arr = std::get_if<std::vector<Value>>(&v.data);
      if (arr == nullptr) return bad("array must hold a std::vector<Value>");
      if (static_cast<uint32_t>(v.array_type) > static_cast<uint32_t>(ValueType::kFloat64)) {
        return bad("unknown array element type id " +
                   std::to_string(static_cast<uint32_t>(v.array_type)));
      }
      if (v.array_type == ValueType::kArray && depth + 1 >= kMaxNesting) {
        return bad("arrays nested more than " + std::to_string(kMaxNesting) + " deep");
      }
      for (const Value& e : *arr) {
        if (e.type != v.array_type) {
          return bad(std::string("array of ") + ValueTypeName(v.array_type) +
                     " holds an element of type " + ValueTypeName(e.type));
        }
        KVX_RETURN_IF_ERROR(CheckValue(e, depth + 1, key));
      }
      return Status::Ok();
    }
  }
  return bad("unknown value type id " + std::to_string(static_cast<uint32_t>(v.type)));
}

// Little-endian encoder (the host is little-endian; see gguf_file.cc).
class Encoder {
 public:
  explicit Encoder(std::vector<uint8_t>* out) : out_(out) {}
  template <typename T>
  void Pod(T v) {
    const size_t at = out_->size();
    out_->resize(at + sizeof(T));
    std::memcpy(out_->data() + at, &v, sizeof(T));
  }
  // Writes the held value as its wire type. CheckValue guaranteed it fits.
  template <typename Wire, typename Held>
  void Narrow(const Value& v) {
    Pod<Wire>(static_cast<Wire>(std::get<Held>(v.data)));
  }
  void String(std::string_view s) {
    Pod<uint64_t>(s.size());
    out_->insert(out_->end(), s.begin(), s.end());
  }
  // The payload only; the type id is written by the caller (a key/value
  // entry writes it once, array elements never repeat it).
  void ValuePayload(const Value& v) {
    switch (v.type) {
      case ValueType::kUint8: Narrow<uint8_t, uint64_t>(v); break;
      case ValueType::kUint16: Narrow<uint16_t, uint64_t>(v); break;
      case ValueType::kUint32: Narrow<uint32_t, uint64_t>(v); break;
      case ValueType::kUint64: Narrow<uint64_t, uint64_t>(v); break;
      case ValueType::kInt8: Narrow<int8_t, int64_t>(v); break;
      case ValueType::kInt16: Narrow<int16_t, int64_t>(v); break;
      case ValueType::kInt32: Narrow<int32_t, int64_t>(v); break;
      case ValueType::kInt64: Narrow<int64_t, int64_t>(v); break;
      case ValueType::kFloat32: Narrow<float, double>(v); break;
      case ValueType::kFloat64: Narrow<double, double>(v); break;
      case ValueType::kBool: Pod<uint8_t>(std::get<bool>(v.data) ? 1 : 0); break;
      case ValueType::kString: String(std::get<std::string>(v.data)); break;
      case ValueType::kArray: {
        const auto& arr = std::get<std::vector<Value>>(v.data);
        Pod<uint32_t>(static_cast<uint32_t>(v.array_type));
        Pod<uint64_t>(arr.size());
        for (const Value& e : arr) ValuePayload(e);
        break;
      }
    }
  }
  void PadTo(uint64_t alignment) {
    out_->resize((out_->size() + alignment - 1) / alignment * alignment, 0);
  }

 private:
  std::vector<uint8_t>* out_;
};

uint64_t AlignUp(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

template <typename T>
Value MakeScalar(ValueType type, T v) {
  Value out;
  out.type = type;
  out.data = v;
  return out;
}

template <typename Elem, typename Conv>
Value MakeArray(ValueType elem_type, const std::vector<Elem>& items, Conv conv) {
  Value out;
  out.type = ValueType::kArray;
  out.array_type = elem_type;
  std::vector<Value> elems(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    elems[i].type = elem_type;
    elems[i].data = conv(items[i]);
  }
  out.data = std::move(elems);
  return out;
}

}  // namespace

GgufWriter::GgufWriter(GgufWriterOptions options) : alignment_(options.alignment) {
  KVX_CHECK_MSG(ValidAlignment(options.alignment),
                "GgufWriterOptions::alignment must be a power of two");
  if (alignment_ != kDefaultAlignment) SetUint32(kAlignmentKey, alignment_);
}

void GgufWriter::Set(const std::string& key, Value v) {
  if (key == kAlignmentKey) {
    const uint64_t* a = std::get_if<uint64_t>(&v.data);
    KVX_CHECK_MSG(v.type == ValueType::kUint32 && a != nullptr && ValidAlignment(*a),
                  "general.alignment must be a uint32 power of two");
    alignment_ = static_cast<uint32_t>(*a);
  }
  auto it = kv_index_.find(key);
  if (it != kv_index_.end()) {
    kv_[it->second].second = std::move(v);
    return;
  }
  kv_index_.emplace(key, kv_.size());
  kv_.emplace_back(key, std::move(v));
}

void GgufWriter::SetUint8(const std::string& k, uint8_t v) {
  Set(k, MakeScalar(ValueType::kUint8, uint64_t{v}));
}
void GgufWriter::SetInt8(const std::string& k, int8_t v) {
  Set(k, MakeScalar(ValueType::kInt8, int64_t{v}));
}
void GgufWriter::SetUint16(const std::string& k, uint16_t v) {
  Set(k, MakeScalar(ValueType::kUint16, uint64_t{v}));
}
void GgufWriter::SetInt16(const std::string& k, int16_t v) {
  Set(k, MakeScalar(ValueType::kInt16, int64_t{v}));
}
void GgufWriter::SetUint32(const std::string& k, uint32_t v) {
  Set(k, MakeScalar(ValueType::kUint32, uint64_t{v}));
}
void GgufWriter::SetInt32(const std::string& k, int32_t v) {
  Set(k, MakeScalar(ValueType::kInt32, int64_t{v}));
}
void GgufWriter::SetUint64(const std::string& k, uint64_t v) {
  Set(k, MakeScalar(ValueType::kUint64, v));
}
void GgufWriter::SetInt64(const std::string& k, int64_t v) {
  Set(k, MakeScalar(ValueType::kInt64, v));
}
void GgufWriter::SetFloat32(const std::string& k, float v) {
  Set(k, MakeScalar(ValueType::kFloat32, double{v}));
}
void GgufWriter::SetFloat64(const std::string& k, double v) {
  Set(k, MakeScalar(ValueType::kFloat64, v));
}
void GgufWriter::SetBool(const std::string& k, bool v) { Set(k, MakeScalar(ValueType::kBool, v)); }
void GgufWriter::SetString(const std::string& k, std::string v) {
  Set(k, MakeScalar(ValueType::kString, std::move(v)));
}
void GgufWriter::SetStringArray(const std::string& k, const std::vector<std::string>& v) {
  Set(k, MakeArray(ValueType::kString, v, [](const std::string& s) { return s; }));
}
void GgufWriter::SetFloat32Array(const std::string& k, const std::vector<float>& v) {
  Set(k, MakeArray(ValueType::kFloat32, v, [](float f) { return double{f}; }));
}
void GgufWriter::SetInt32Array(const std::string& k, const std::vector<int32_t>& v) {
  Set(k, MakeArray(ValueType::kInt32, v, [](int32_t i) { return int64_t{i}; }));
}
void GgufWriter::SetUint32Array(const std::string& k, const std::vector<uint32_t>& v) {
  Set(k, MakeArray(ValueType::kUint32, v, [](uint32_t u) { return uint64_t{u}; }));
}

Status GgufWriter::SetValue(const std::string& key, Value v) {
  KVX_RETURN_IF_ERROR(CheckValue(v, 0, key));
  if (key == kAlignmentKey) {
    const uint64_t* a = std::get_if<uint64_t>(&v.data);
    if (v.type != ValueType::kUint32 || a == nullptr || !ValidAlignment(*a)) {
      return InvalidArgument("'general.alignment' must be a uint32 nonzero power of two, got " +
                             GgufFile::ValueToString(v));
    }
  }
  Set(key, std::move(v));
  return Status::Ok();
}

bool GgufWriter::Remove(const std::string& key) {
  auto it = kv_index_.find(key);
  if (it == kv_index_.end()) return false;
  kv_.erase(kv_.begin() + static_cast<std::ptrdiff_t>(it->second));
  kv_index_.clear();
  for (size_t i = 0; i < kv_.size(); ++i) kv_index_.emplace(kv_[i].first, i);
  if (key == kAlignmentKey) alignment_ = kDefaultAlignment;
  return true;
}

Status GgufWriter::CheckTensor(const std::string& name, TensorType type,
                               const std::vector<uint64_t>& dims, size_t n_bytes) const {
  const std::string ctx = "tensor '" + name + "'";
  if (name.empty()) return InvalidArgument("tensor name is empty");
  if (tensor_index_.count(name) != 0) return InvalidArgument(ctx + " was already added");
  const TensorTypeTraits* traits = GetTensorTypeTraits(static_cast<uint32_t>(type));
  if (traits == nullptr) return InvalidArgument(ctx + ": unknown type " + TensorTypeName(type));
  if (dims.empty() || dims.size() > kMaxDims) {
    return InvalidArgument(ctx + " has " + std::to_string(dims.size()) + " dims; must be 1..4");
  }
  if (dims[0] % traits->block_size != 0) {
    return InvalidArgument(ctx + ": row length " + std::to_string(dims[0]) +
                           " is not a multiple of the " + traits->name + " block size " +
                           std::to_string(traits->block_size));
  }
  uint64_t n_elements = 1;
  for (uint64_t d : dims) {
    if (__builtin_mul_overflow(n_elements, d, &n_elements) ||
        n_elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return InvalidArgument(ctx + ": element count overflows");
    }
  }
  const uint64_t rows = dims[0] == 0 ? 0 : n_elements / dims[0];
  const uint64_t expected = RowBytes(type, dims[0]) * rows;
  if (expected != n_bytes) {
    return InvalidArgument(ctx + ": " + std::to_string(n_bytes) + " bytes given but " +
                           TensorTypeName(type) + " with these dims needs " +
                           std::to_string(expected));
  }
  return Status::Ok();
}

Status GgufWriter::AddTensor(const std::string& name, TensorType type, std::vector<uint64_t> dims,
                             std::vector<uint8_t> bytes) {
  KVX_RETURN_IF_ERROR(CheckTensor(name, type, dims, bytes.size()));
  PendingTensor t{name, type, std::move(dims), std::move(bytes), nullptr, 0};
  t.n_bytes = t.owned.size();
  tensor_index_.emplace(name, tensors_.size());
  tensors_.push_back(std::move(t));
  return Status::Ok();
}

Status GgufWriter::AddTensor(const std::string& name, TensorType type, std::vector<uint64_t> dims,
                             const void* data, size_t n_bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  return AddTensor(name, type, std::move(dims), std::vector<uint8_t>(p, p + n_bytes));
}

Status GgufWriter::AddTensorRef(const std::string& name, TensorType type,
                                std::vector<uint64_t> dims, const void* data, size_t n_bytes) {
  KVX_RETURN_IF_ERROR(CheckTensor(name, type, dims, n_bytes));
  PendingTensor t{name, type, std::move(dims), {}, static_cast<const uint8_t*>(data), n_bytes};
  tensor_index_.emplace(name, tensors_.size());
  tensors_.push_back(std::move(t));
  return Status::Ok();
}

std::vector<uint8_t> GgufWriter::EncodeHeader() const {
  std::vector<uint8_t> out;
  Encoder e(&out);
  out.insert(out.end(), {'G', 'G', 'U', 'F'});
  e.Pod<uint32_t>(kGgufVersion);
  e.Pod<uint64_t>(tensors_.size());
  e.Pod<uint64_t>(kv_.size());
  for (const auto& [key, value] : kv_) {
    e.String(key);
    e.Pod<uint32_t>(static_cast<uint32_t>(value.type));
    e.ValuePayload(value);
  }
  // Offsets are relative to the data section; each tensor starts aligned.
  uint64_t offset = 0;
  for (const PendingTensor& t : tensors_) {
    e.String(t.name);
    e.Pod<uint32_t>(static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) e.Pod<uint64_t>(d);
    e.Pod<uint32_t>(static_cast<uint32_t>(t.type));
    e.Pod<uint64_t>(offset);
    offset = AlignUp(offset + t.n_bytes, alignment_);
  }
  e.PadTo(alignment_);
  return out;
}

namespace {
const uint8_t* TensorBytes(const std::vector<uint8_t>& owned, const uint8_t* ref) {
  return owned.empty() ? ref : owned.data();
}
std::string_view AsChars(const uint8_t* p, size_t n) { return {reinterpret_cast<const char*>(p), n}; }
}  // namespace

std::vector<uint8_t> GgufWriter::WriteToBuffer() const {
  std::vector<uint8_t> out = EncodeHeader();
  for (const PendingTensor& t : tensors_) {
    const uint8_t* p = TensorBytes(t.owned, t.data);
    if (t.n_bytes > 0) out.insert(out.end(), p, p + t.n_bytes);
    out.resize(AlignUp(out.size(), alignment_), 0);
  }
  return out;
}

Status GgufWriter::WriteToFile(const std::string& path) const {
  KVX_ASSIGN_OR_RETURN(OutputFile out, OutputFile::Open(path));
  const std::vector<uint8_t> header = EncodeHeader();
  KVX_RETURN_IF_ERROR(out.Write(AsChars(header.data(), header.size())));
  static const uint8_t kZeros[256] = {};
  for (const PendingTensor& t : tensors_) {
    KVX_RETURN_IF_ERROR(out.Write(AsChars(TensorBytes(t.owned, t.data), t.n_bytes)));
    for (size_t pad = AlignUp(t.n_bytes, alignment_) - t.n_bytes; pad > 0;) {
      const size_t n = std::min(pad, sizeof(kZeros));
      KVX_RETURN_IF_ERROR(out.Write(AsChars(kZeros, n)));
      pad -= n;
    }
  }
  return out.Commit();
}

}  // namespace kvx::gguf
