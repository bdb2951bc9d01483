// GgufFile tests: writer -> reader round trips of every value type, the
// typed getters, and one test per validation error (hand-built byte
// streams, so each hostile field is exactly where the test puts it), and
// facts about the real models in ../shared.
#include "gguf/gguf_file.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "gguf/gguf_writer.h"
#include "gguf/tensor_type.h"
#include "support/test_data.h"

namespace kvx::gguf {
namespace {

// gtest only (gmock is not linked): substring check with a useful message.
#define EXPECT_CONTAINS(haystack, needle)                                       \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos)              \
      << "expected to find \"" << (needle) << "\" in: " << (haystack)

// ---- tensor types ----

TEST(TensorTypeTest, TraitsMatchGgml) {
  struct Want { TensorType t; const char* name; uint32_t bs, ts; };
  const Want wants[] = {
      {TensorType::kF32, "f32", 1, 4},       {TensorType::kF16, "f16", 1, 2},
      {TensorType::kBF16, "bf16", 1, 2},     {TensorType::kQ4_0, "q4_0", 32, 18},
      {TensorType::kQ4_1, "q4_1", 32, 20},   {TensorType::kQ5_0, "q5_0", 32, 22},
      {TensorType::kQ5_1, "q5_1", 32, 24},   {TensorType::kQ8_0, "q8_0", 32, 34},
      {TensorType::kQ8_1, "q8_1", 32, 36},   {TensorType::kQ2_K, "q2_K", 256, 84},
      {TensorType::kQ3_K, "q3_K", 256, 110}, {TensorType::kQ4_K, "q4_K", 256, 144},
      {TensorType::kQ5_K, "q5_K", 256, 176}, {TensorType::kQ6_K, "q6_K", 256, 210},
      {TensorType::kQ8_K, "q8_K", 256, 292}, {TensorType::kI8, "i8", 1, 1},
      {TensorType::kI16, "i16", 1, 2},       {TensorType::kI32, "i32", 1, 4},
      {TensorType::kI64, "i64", 1, 8},       {TensorType::kF64, "f64", 1, 8},
      {TensorType::kIQ4_NL, "iq4_nl", 32, 18}, {TensorType::kIQ4_XS, "iq4_xs", 256, 136},
  };
  for (const Want& w : wants) {
    const TensorTypeTraits* t = GetTensorTypeTraits(static_cast<uint32_t>(w.t));
    ASSERT_NE(t, nullptr) << w.name;
    EXPECT_STREQ(t->name, w.name);
    EXPECT_EQ(t->block_size, w.bs) << w.name;
    EXPECT_EQ(t->type_size, w.ts) << w.name;
    EXPECT_EQ(TensorTypeName(w.t), w.name);
  }
  // Every enumerator is known.
  for (uint32_t id = 0; id <= 35; ++id) {
    const bool removed = id == 4 || id == 5 || (id >= 31 && id <= 33);
    EXPECT_EQ(GetTensorTypeTraits(id) == nullptr, removed) << id;
  }
  EXPECT_EQ(GetTensorTypeTraits(36), nullptr);
  EXPECT_EQ(GetTensorTypeTraits(0xFFFFFFFFu), nullptr);
  EXPECT_EQ(TensorTypeName(static_cast<TensorType>(4)), "type#4");
}

TEST(TensorTypeTest, ParseIsCaseInsensitive) {
  TensorType t;
  ASSERT_TRUE(ParseTensorType("Q8_0", &t));
  EXPECT_EQ(t, TensorType::kQ8_0);
  ASSERT_TRUE(ParseTensorType("q4_k", &t));
  EXPECT_EQ(t, TensorType::kQ4_K);
  ASSERT_TRUE(ParseTensorType("BF16", &t));
  EXPECT_EQ(t, TensorType::kBF16);
  ASSERT_TRUE(ParseTensorType("iq2_xxs", &t));
  EXPECT_EQ(t, TensorType::kIQ2_XXS);
  EXPECT_FALSE(ParseTensorType("q8", &t));
  EXPECT_FALSE(ParseTensorType("q8_0x", &t));
  EXPECT_FALSE(ParseTensorType("", &t));
}

TEST(TensorTypeTest, SupportAndRowBytes) {
  EXPECT_TRUE(IsSupportedWeightType(TensorType::kQ6_K));
  EXPECT_TRUE(IsSupportedWeightType(TensorType::kBF16));
  EXPECT_FALSE(IsSupportedWeightType(TensorType::kQ4_1));
  EXPECT_FALSE(IsSupportedWeightType(TensorType::kIQ2_XXS));
  EXPECT_EQ(SupportedWeightTypesList(), "f32, f16, bf16, q8_0, q4_0, q4_K, q5_K, q6_K");
  EXPECT_EQ(RowBytes(TensorType::kF32, 10), 40u);
  EXPECT_EQ(RowBytes(TensorType::kQ8_0, 4096), 128u * 34);
  EXPECT_EQ(RowBytes(TensorType::kQ4_K, 512), 2u * 144);
}

// ---- round trips ----

Value Scalar(ValueType t, std::variant<uint64_t, int64_t, double, bool, std::string> d) {
  Value v;
  v.type = t;
  std::visit([&](auto&& x) { v.data = x; }, d);
  return v;
}
Value Array(ValueType elem, std::vector<Value> items) {
  Value v;
  v.type = ValueType::kArray;
  v.array_type = elem;
  v.data = std::move(items);
  return v;
}

std::unique_ptr<GgufFile> ParseOk(const std::vector<uint8_t>& buf) {
  auto f = GgufFile::Parse(buf.data(), buf.size(), "test.gguf");
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  return f.ok() ? std::move(f).value() : nullptr;
}

TEST(GgufRoundTripTest, EveryScalarType) {
  GgufWriter w;
  w.SetUint8("u8", 255);
  w.SetInt8("i8", -128);
  w.SetUint16("u16", 65535);
  w.SetInt16("i16", -32768);
  w.SetUint32("u32", 0xFFFFFFFFu);
  w.SetInt32("i32", std::numeric_limits<int32_t>::min());
  w.SetUint64("u64", std::numeric_limits<uint64_t>::max());
  w.SetInt64("i64", std::numeric_limits<int64_t>::min());
  w.SetFloat32("f32", 1e-5f);
  w.SetFloat64("f64", 3.141592653589793);
  w.SetBool("t", true);
  w.SetBool("f", false);
  w.SetString("s", std::string("a\0b\xff", 4));
  w.SetString("empty", "");
  auto f = ParseOk(w.WriteToBuffer());
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->metadata().size(), 14u);
  EXPECT_EQ(f->metadata()[0].first, "u8");  // file order kept
  EXPECT_EQ(f->Find("u8")->type, ValueType::kUint8);
  EXPECT_EQ(f->GetUint("u8").value(), 255u);
  EXPECT_EQ(f->GetInt("i8").value(), -128);
  EXPECT_EQ(f->GetUint("u16").value(), 65535u);
  EXPECT_EQ(f->GetInt("i16").value(), -32768);
  EXPECT_EQ(f->GetUint("u32").value(), 0xFFFFFFFFu);
  EXPECT_EQ(f->GetInt("i32").value(), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(f->GetUint("u64").value(), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(f->GetInt("i64").value(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f->Find("f32")->type, ValueType::kFloat32);
  EXPECT_EQ(f->GetFloat("f32").value(), static_cast<double>(1e-5f));
  EXPECT_EQ(f->GetFloat("f64").value(), 3.141592653589793);
  EXPECT_TRUE(f->GetBool("t").value());
  EXPECT_FALSE(f->GetBool("f").value());
  EXPECT_EQ(f->GetString("s").value(), std::string("a\0b\xff", 4));
  EXPECT_EQ(f->GetString("empty").value(), "");
  EXPECT_TRUE(f->tensors().empty());
}

TEST(GgufRoundTripTest, ArraysOfEveryTypeAndNesting) {
  GgufWriter w;
  w.SetStringArray("strs", {"a", "", "hello"});
  w.SetFloat32Array("floats", {1.5f, -2.0f});
  w.SetInt32Array("ints", {-1, 2, 3});
  w.SetUint32Array("uints", {7});
  w.SetStringArray("none", {});
  const ValueType scalar_types[] = {ValueType::kUint8, ValueType::kInt8, ValueType::kUint16,
                                    ValueType::kInt16, ValueType::kUint64, ValueType::kInt64,
                                    ValueType::kFloat64, ValueType::kBool};
  for (ValueType t : scalar_types) {
    Value e;
    e.type = t;
    const bool is_signed =
        t == ValueType::kInt8 || t == ValueType::kInt16 || t == ValueType::kInt64;
    if (t == ValueType::kFloat64) {
      e.data = 0.25;
    } else if (t == ValueType::kBool) {
      e.data = true;
    } else if (is_signed) {
      e.data = int64_t{-5};
    } else {
      e.data = uint64_t{200};
    }
    ASSERT_TRUE(w.SetValue(std::string("arr.") + ValueTypeName(t), Array(t, {e, e})).ok());
  }
  // [[["x"], []], [["y", "z"]]]: arrays of arrays of arrays of strings.
  Value s = Scalar(ValueType::kString, std::string("x"));
  Value inner1 = Array(ValueType::kString, {s});
  Value inner2 = Array(ValueType::kString, {});
  Value inner3 = Array(ValueType::kString, {Scalar(ValueType::kString, std::string("y")),
                                            Scalar(ValueType::kString, std::string("z"))});
  Value nested = Array(ValueType::kArray, {Array(ValueType::kArray, {inner1, inner2}),
                                           Array(ValueType::kArray, {inner3})});
  ASSERT_TRUE(w.SetValue("nested", nested).ok());
  auto f = ParseOk(w.WriteToBuffer());
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->GetStringArray("strs").value(), (std::vector<std::string>{"a", "", "hello"}));
  EXPECT_EQ(f->GetFloatArray("floats").value(), (std::vector<double>{1.5, -2.0}));
  EXPECT_EQ(f->GetIntArray("ints").value(), (std::vector<int64_t>{-1, 2, 3}));
  EXPECT_EQ(f->GetIntArray("uints").value(), (std::vector<int64_t>{7}));
  EXPECT_TRUE(f->GetStringArray("none").value().empty());
  for (ValueType t : scalar_types) {
    const Value* v = f->Find(std::string("arr.") + ValueTypeName(t));
    ASSERT_NE(v, nullptr);
    EXPECT_EQ(v->array_type, t);
    const auto& arr = std::get<std::vector<Value>>(v->data);
    ASSERT_EQ(arr.size(), 2u);
    EXPECT_EQ(arr[1].type, t);
  }
  EXPECT_EQ(f->GetIntArray("arr.int64").value(), (std::vector<int64_t>{-5, -5}));
  EXPECT_EQ(f->GetFloatArray("arr.uint16").value(), (std::vector<double>{200, 200}));
  const Value* n = f->Find("nested");
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->array_type, ValueType::kArray);
  EXPECT_EQ(GgufFile::ValueToString(*n), R"([[["x"], []], [["y", "z"]]])");
  // The parsed value re-encodes to the same bytes.
  GgufWriter w2;
  ASSERT_TRUE(w2.SetValue("nested", *n).ok());
  GgufWriter w3;
  ASSERT_TRUE(w3.SetValue("nested", nested).ok());
  EXPECT_EQ(w2.WriteToBuffer(), w3.WriteToBuffer());
}

TEST(GgufRoundTripTest, TensorsAreAlignedAndExact) {
  for (uint32_t alignment : {1u, 8u, 32u, 64u, 4096u}) {
    GgufWriter w(GgufWriterOptions{.alignment = alignment});
    w.SetString("general.architecture", "llama");
    std::vector<float> a = {1, 2, 3, 4, 5, 6};
    std::vector<uint8_t> q(34 * 2 * 3);
    for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<uint8_t>(i * 7);
    std::vector<uint8_t> h(2 * 5);
    ASSERT_TRUE(w.AddTensor("a", TensorType::kF32, {3, 2}, a.data(), a.size() * 4).ok());
    ASSERT_TRUE(w.AddTensor("q", TensorType::kQ8_0, {64, 3}, q).ok());
    ASSERT_TRUE(w.AddTensorRef("h", TensorType::kF16, {5}, h.data(), h.size()).ok());
    ASSERT_TRUE(w.AddTensor("empty", TensorType::kF32, {0, 4}, std::vector<uint8_t>{}).ok());
    const std::vector<uint8_t> buf = w.WriteToBuffer();
    EXPECT_EQ(buf.size() % alignment, 0u);
    auto f = ParseOk(buf);
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(f->alignment(), alignment);
    EXPECT_EQ(f->Has("general.alignment"), alignment != 32);
    EXPECT_EQ(f->data_offset() % alignment, 0u);
    ASSERT_EQ(f->tensors().size(), 4u);
    const TensorInfo* ta = f->FindTensor("a");
    ASSERT_NE(ta, nullptr);
    EXPECT_EQ(ta->dims, (std::vector<uint64_t>{3, 2}));
    EXPECT_EQ(ta->n_elements, 6u);
    EXPECT_EQ(ta->n_bytes, 24u);
    EXPECT_EQ(std::memcmp(ta->data, a.data(), 24), 0);
    const TensorInfo* tq = f->FindTensor("q");
    ASSERT_NE(tq, nullptr);
    EXPECT_EQ(tq->type, TensorType::kQ8_0);
    ASSERT_EQ(tq->n_bytes, q.size());
    EXPECT_EQ(std::memcmp(tq->data, q.data(), q.size()), 0);
    EXPECT_EQ(f->FindTensor("h")->n_bytes, 10u);
    EXPECT_EQ(f->FindTensor("empty")->n_bytes, 0u);
    EXPECT_EQ(f->FindTensor("missing"), nullptr);
    for (const TensorInfo& t : f->tensors()) {
      EXPECT_EQ(t.offset % alignment, 0u) << t.name;
      EXPECT_EQ(static_cast<size_t>(t.data - buf.data()), f->data_offset() + t.offset);
    }
  }
}

// ---- getters ----

TEST(GgufGetterTest, TypeChecksAndFallbacks) {
  GgufWriter w;
  w.SetInt32("neg", -3);
  w.SetUint64("big", std::numeric_limits<uint64_t>::max());
  w.SetString("s", "x");
  w.SetUint32("n", 12);
  w.SetStringArray("strs", {"a"});
  Value nested = Array(ValueType::kArray, {Array(ValueType::kInt32, {})});
  ASSERT_TRUE(w.SetValue("nested", nested).ok());
  auto f = ParseOk(w.WriteToBuffer());
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->GetUint("missing").status().code(), StatusCode::kNotFound);
  EXPECT_CONTAINS(f->GetUint("missing").status().message(), "'missing' is missing");
  EXPECT_EQ(f->GetUint("neg").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f->GetInt("neg").value(), -3);
  EXPECT_EQ(f->GetInt("big").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f->GetFloat("n").value(), 12.0);
  EXPECT_EQ(f->GetUint("s").status().code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(f->GetUint("s").status().message(), "'s' has type string");
  EXPECT_EQ(f->GetString("n").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f->GetBool("n").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f->GetStringArray("n").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f->GetIntArray("strs").status().code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(f->GetIntArray("strs").status().message(), "array of string");
  EXPECT_EQ(f->GetFloatArray("nested").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f->GetStringArray("nested").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f->GetUintOr("missing", 7).value(), 7u);
  EXPECT_EQ(f->GetUintOr("n", 7).value(), 12u);
  EXPECT_FALSE(f->GetUintOr("s", 7).ok());  // present but wrong type
  EXPECT_EQ(f->GetFloatOr("missing", 0.5).value(), 0.5);
  EXPECT_TRUE(f->GetBoolOr("missing", true).value());
  EXPECT_EQ(f->GetStringOr("missing", "d").value(), "d");
  EXPECT_EQ(f->GetStringOr("s", "d").value(), "x");
}

TEST(GgufGetterTest, ValueToStringAbbreviates) {
  std::vector<Value> items;
  for (int i = 0; i < 20; ++i) items.push_back(Scalar(ValueType::kInt32, int64_t{i}));
  EXPECT_EQ(GgufFile::ValueToString(Array(ValueType::kInt32, items), 3),
            "[0, 1, 2, ... (20 items)]");
  EXPECT_EQ(GgufFile::ValueToString(Scalar(ValueType::kString, std::string("a\"\n"))),
            R"("a\"\x0A")");
  EXPECT_EQ(GgufFile::ValueToString(Scalar(ValueType::kBool, true)), "true");
  EXPECT_EQ(GgufFile::ValueToString(Scalar(ValueType::kFloat32, 0.5)), "0.5");
}

// ---- hand-built files for the error paths ----

// Appends little-endian fields; the tests assemble exact byte streams.
class Bytes {
 public:
  Bytes& U8(uint8_t v) { return Raw(&v, 1); }
  Bytes& U32(uint32_t v) { return Raw(&v, 4); }
  Bytes& U64(uint64_t v) { return Raw(&v, 8); }
  Bytes& Str(const std::string& s) { U64(s.size()); return Raw(s.data(), s.size()); }
  Bytes& Header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    Raw("GGUF", 4);
    U32(version);
    U64(n_tensors);
    return U64(n_kv);
  }
  Bytes& KvU32(const std::string& key, uint32_t v) { Str(key); U32(4); return U32(v); }
  // name, dims, type, offset.
  Bytes& Tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type, uint64_t off) {
    Str(name);
    U32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) U64(d);
    U32(type);
    return U64(off);
  }
  Bytes& Pad(size_t a) { b_.resize((b_.size() + a - 1) / a * a, 0); return *this; }
  Bytes& Zeros(size_t n) { b_.resize(b_.size() + n, 0); return *this; }
  Bytes& Raw(const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    b_.insert(b_.end(), c, c + n);
    return *this;
  }
  const std::vector<uint8_t>& get() const { return b_; }

 private:
  std::vector<uint8_t> b_;
};

Status ParseStatus(const std::vector<uint8_t>& b) {
  // An exact-size heap copy, so ASan flags any read past the end.
  std::vector<uint8_t> copy(b);
  auto f = GgufFile::Parse(copy.empty() ? nullptr : copy.data(), copy.size(), "bad.gguf");
  return f.ok() ? Status::Ok() : f.status();
}

#define EXPECT_PARSE_ERROR(bytes, want_code, substr)                  \
  do {                                                           \
    const Status s_ = ParseStatus((bytes).get());                \
    EXPECT_EQ(s_.code(), (want_code)) << s_.ToString();               \
    EXPECT_CONTAINS(s_.message(), substr) << s_.ToString(); \
  } while (0)

TEST(GgufErrorTest, HeaderErrors) {
  EXPECT_PARSE_ERROR(Bytes(), StatusCode::kInvalidArgument, "not a GGUF file");
  EXPECT_PARSE_ERROR(Bytes().Raw("GGML", 4).U32(3), StatusCode::kInvalidArgument,
                     "starts with \"GGML\"");
  EXPECT_PARSE_ERROR(Bytes().Raw("GGUF", 4).U8(3), StatusCode::kDataLoss,
                     "unexpected end of file at offset 4 while reading version");
  EXPECT_PARSE_ERROR(Bytes().Header(0, 0, 1), StatusCode::kUnimplemented,
                     "unsupported old GGUF version 1");
  EXPECT_PARSE_ERROR(Bytes().Header(0, 0, 4), StatusCode::kUnimplemented,
                     "unsupported GGUF version 4");
  EXPECT_PARSE_ERROR(Bytes().Header(0, 0, 0x03000000), StatusCode::kUnimplemented,
                     "big-endian GGUF file (version 3");
  EXPECT_PARSE_ERROR(Bytes().Raw("GGUF", 4).U32(3).U64(0), StatusCode::kDataLoss,
                     "metadata count");
  EXPECT_PARSE_ERROR(Bytes().Header(0, ~0ull), StatusCode::kDataLoss,
                     "claims 18446744073709551615 metadata entries");
  EXPECT_PARSE_ERROR(Bytes().Header(1ull << 60, 0), StatusCode::kDataLoss, "tensors but only");
  // v2 is accepted; an empty file is fine.
  EXPECT_TRUE(ParseStatus(Bytes().Header(0, 0, 2).get()).ok());
  EXPECT_TRUE(ParseStatus(Bytes().Header(0, 0, 3).get()).ok());
}

TEST(GgufErrorTest, MetadataErrors) {
  EXPECT_PARSE_ERROR(Bytes().Header(0, 1).U64(1000).Raw("abc", 3).Zeros(20),
                     StatusCode::kDataLoss, "claims a length of 1000 bytes but only 23 are left");
  EXPECT_PARSE_ERROR(Bytes().Header(0, 1).Str("k").U32(13).U32(0), StatusCode::kDataLoss,
                     "'k' (offset 24): unknown value type id 13");
  EXPECT_PARSE_ERROR(Bytes().Header(0, 1).Str("k").U32(8).U64(~0ull).Zeros(8),
                     StatusCode::kDataLoss, "string value at offset");
  EXPECT_PARSE_ERROR(Bytes().Header(0, 1).Str("k").U32(9).U32(77).U64(0), StatusCode::kDataLoss,
                     "unknown element type id 77");
  EXPECT_PARSE_ERROR(Bytes().Header(0, 1).Str("k").U32(9).U32(4).U64(1ull << 62).Zeros(16),
                     StatusCode::kDataLoss, "claims 4611686018427387904 elements of type uint32");
  EXPECT_PARSE_ERROR(Bytes().Header(0, 1).Str("k").U32(9).U32(8).U64(2).Str("").U64(5).U8(1).U8(2),
                     StatusCode::kDataLoss, "claims a length of 5 bytes but only 2 are left");
  EXPECT_PARSE_ERROR(Bytes().Header(0, 1).Str("k").U32(7).U8(2), StatusCode::kDataLoss,
                     "bool value at offset 37 is 2");
  EXPECT_PARSE_ERROR(Bytes().Header(0, 2).KvU32("k", 1).KvU32("k", 2), StatusCode::kDataLoss,
                     "'k' (offset 41): duplicate key");
  // 8 nested arrays are the limit; the 9th level is refused.
  auto nested = [](int levels) {
    Bytes b;
    b.Header(0, 1).Str("k").U32(9);
    for (int i = 0; i < levels - 1; ++i) b.U32(9).U64(1);
    return b.U32(4).U64(0);
  };
  EXPECT_TRUE(ParseStatus(nested(8).get()).ok());
  // More than 2^24 values are refused before anything is allocated (an array
  // of 2^24 + 1 bools; the file holds every byte it claims).
  Bytes big;
  big.Header(0, 1).Str("a").U32(9).U32(7).U64((1u << 24) + 1).Zeros((1u << 24) + 1);
  EXPECT_PARSE_ERROR(big, StatusCode::kResourceExhausted, "more than 16777216 values");
  EXPECT_PARSE_ERROR(nested(9), StatusCode::kDataLoss, "nested more than 8 deep");
}

TEST(GgufErrorTest, AlignmentErrors) {
  EXPECT_PARSE_ERROR(Bytes().Header(0, 1).Str("general.alignment").U32(10).U64(64),
                     StatusCode::kDataLoss, "'general.alignment' has type uint64");
  EXPECT_PARSE_ERROR(Bytes().Header(0, 1).KvU32("general.alignment", 0), StatusCode::kDataLoss,
                     "is 0 but must be a nonzero power of two");
  EXPECT_PARSE_ERROR(Bytes().Header(0, 1).KvU32("general.alignment", 48), StatusCode::kDataLoss,
                     "is 48 but must be a nonzero power of two");
  // Offsets must be multiples of the alignment.
  EXPECT_PARSE_ERROR(Bytes().Header(1, 1).KvU32("general.alignment", 64)
                         .Tensor("t", {4}, 0, 32).Pad(64).Zeros(128),
                     StatusCode::kDataLoss, "data offset 32 is not a multiple of the alignment 64");
}

TEST(GgufErrorTest, TensorInfoErrors) {
  auto one = [](std::vector<uint64_t> dims, uint32_t type, uint64_t off = 0) {
    Bytes b;
    b.Header(1, 0).Tensor("blk.0.attn_q.weight", std::move(dims), type, off).Pad(32).Zeros(64);
    return b;
  };
  EXPECT_TRUE(ParseStatus(one({4, 2}, 0).get()).ok());
  EXPECT_PARSE_ERROR(one({}, 0), StatusCode::kDataLoss, "has 0 dimensions (must be 1..4)");
  EXPECT_PARSE_ERROR(one({1, 1, 1, 1, 1}, 0), StatusCode::kDataLoss, "has 5 dimensions");
  EXPECT_PARSE_ERROR(one({1ull << 32, 1ull << 32}, 0), StatusCode::kDataLoss,
                     "makes the element count overflow");
  EXPECT_PARSE_ERROR(one({1ull << 63}, 0), StatusCode::kDataLoss, "overflow");
  EXPECT_PARSE_ERROR(one({32}, 4), StatusCode::kUnimplemented, "unknown tensor type id 4");
  EXPECT_PARSE_ERROR(one({32}, 1000), StatusCode::kUnimplemented, "unknown tensor type id 1000");
  EXPECT_PARSE_ERROR(one({33}, 8), StatusCode::kDataLoss,
                     "row length 33 is not a multiple of the q8_0 block size 32");
  EXPECT_PARSE_ERROR(one({4}, 0, 7), StatusCode::kDataLoss, "data offset 7 is not a multiple");
  EXPECT_PARSE_ERROR(one({4, 1000}, 0), StatusCode::kDataLoss,
                     "tensor 'blk.0.attn_q.weight' data [offset 96, 16000 bytes] extends past end "
                     "of file (size 160): the file is truncated");
  EXPECT_PARSE_ERROR(one({4}, 0, 1ull << 62), StatusCode::kDataLoss, "extends past end of file");
  EXPECT_PARSE_ERROR(Bytes().Header(1, 0).Tensor("", {4}, 0, 0).Pad(32).Zeros(16),
                     StatusCode::kDataLoss, "empty tensor name");
  EXPECT_PARSE_ERROR(Bytes().Header(2, 0).Tensor("t", {4}, 0, 0).Tensor("t", {4}, 0, 32)
                         .Pad(32).Zeros(64),
                     StatusCode::kDataLoss, "duplicate tensor name");
  EXPECT_PARSE_ERROR(Bytes().Header(2, 0).Tensor("a", {16}, 0, 0).Tensor("b", {4}, 0, 32)
                         .Pad(32).Zeros(64),
                     StatusCode::kDataLoss, "tensors 'a' and 'b' overlap");
  // Tensor infos present but the file ends before the data section.
  EXPECT_PARSE_ERROR(Bytes().Header(1, 0).Tensor("t", {0}, 0, 0), StatusCode::kDataLoss,
                     "data section would start at offset 64");
  const std::string long_name(25, 'x');
  EXPECT_PARSE_ERROR(Bytes().Header(1, 0).Str(long_name).U32(1).U64(4), StatusCode::kDataLoss,
                     "(info 0, offset 24): unexpected end of file at offset 69 while reading "
                     "tensor type");
}

TEST(GgufErrorTest, OpenReportsPath) {
  auto f = GgufFile::Open("/nonexistent/dir/model.gguf");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
  EXPECT_CONTAINS(f.status().message(), "/nonexistent/dir/model.gguf");
}

// ---- the real models in ../shared (skipped when absent) ----

std::unique_ptr<GgufFile> OpenShared(const std::string& rel) {
  auto f = GgufFile::Open(testing::SharedPath(rel));
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  return f.ok() ? std::move(f).value() : nullptr;
}

// Checks what every llama model file must satisfy.
void CheckLlamaModel(const GgufFile& f, uint64_t n_layers, uint64_t n_embd, size_t n_vocab,
                     TensorType weight_type) {
  EXPECT_EQ(f.GetString("general.architecture").value(), "llama");
  EXPECT_EQ(f.GetUint("llama.block_count").value(), n_layers);
  EXPECT_EQ(f.GetUint("llama.embedding_length").value(), n_embd);
  auto tokens = f.GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok()) << tokens.status().ToString();
  EXPECT_EQ(tokens->size(), n_vocab);
  // Each layer has 9 tensors (2 norms, q/k/v/o, gate/up/down), plus the token
  // embedding and the output norm; an untied output adds output.weight.
  const size_t base = 9 * n_layers + 2;
  const bool tied = f.FindTensor("output.weight") == nullptr;
  EXPECT_EQ(f.tensors().size(), base + (tied ? 0 : 1));
  const TensorInfo* emb = f.FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  ASSERT_EQ(emb->dims.size(), 2u);
  EXPECT_EQ(emb->dims[0], n_embd);
  EXPECT_EQ(emb->dims[1], n_vocab);
  const TensorInfo* q = f.FindTensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, weight_type);
  EXPECT_EQ(q->n_bytes, RowBytes(q->type, q->dims[0]) * q->dims[1]);
  for (const TensorInfo& t : f.tensors()) {
    EXPECT_NE(t.data, nullptr) << t.name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % f.alignment(), 0u) << t.name;
  }
}

TEST(GgufRealModelTest, Stories260K) {
  KVX_REQUIRE_SHARED();
  auto f = OpenShared("models/stories260K/stories260K-F32.gguf");
  ASSERT_NE(f, nullptr);
  CheckLlamaModel(*f, 5, 64, 512, TensorType::kF32);
  EXPECT_EQ(f->GetUint("llama.attention.head_count").value(), 8u);
  EXPECT_EQ(f->GetUint("llama.attention.head_count_kv").value(), 4u);
  EXPECT_EQ(f->GetUint("llama.context_length").value(), 512u);
}

TEST(GgufRealModelTest, TinyStories656K) {
  KVX_REQUIRE_SHARED();
  auto f = OpenShared("models/tinystories656K/TinyStories-656K-F32.gguf");
  ASSERT_NE(f, nullptr);
  CheckLlamaModel(*f, 2, 128, 2048, TensorType::kF32);
  EXPECT_EQ(f->FindTensor("output.weight"), nullptr);  // tied embeddings
  EXPECT_EQ(f->GetUint("tokenizer.ggml.bos_token_id").value(), 1u);
  EXPECT_EQ(f->GetUint("tokenizer.ggml.eos_token_id").value(), 2u);
}

TEST(GgufRealModelTest, ProbeF32AndF16) {
  KVX_REQUIRE_SHARED();
  auto f32 = OpenShared("models/probe/probe-llama-6L-d256-f32.gguf");
  auto f16 = OpenShared("models/probe/probe-llama-6L-d256-f16.gguf");
  ASSERT_NE(f32, nullptr);
  ASSERT_NE(f16, nullptr);
  CheckLlamaModel(*f32, 6, 256, 4096, TensorType::kF32);
  CheckLlamaModel(*f16, 6, 256, 4096, TensorType::kF16);
  EXPECT_NE(f32->FindTensor("output.weight"), nullptr);  // untied output
  EXPECT_EQ(f32->GetUint("llama.context_length").value(), 2048u);
  EXPECT_EQ(f32->GetUint("llama.attention.head_count_kv").value(), 2u);
  ASSERT_EQ(f32->tensors().size(), f16->tensors().size());
  for (size_t i = 0; i < f32->tensors().size(); ++i) {
    EXPECT_EQ(f32->tensors()[i].name, f16->tensors()[i].name);
    EXPECT_EQ(f32->tensors()[i].dims, f16->tensors()[i].dims);
  }
}

TEST(GgufRealModelTest, VocabOnlyFiles) {
  KVX_REQUIRE_SHARED();
  for (const char* name : {"llama-spm", "gpt-2", "phi-3"}) {
    auto f = OpenShared(std::string("models/vocab/ggml-vocab-") + name + ".gguf");
    ASSERT_NE(f, nullptr) << name;
    auto tokens = f->GetStringArray("tokenizer.ggml.tokens");
    ASSERT_TRUE(tokens.ok()) << tokens.status().ToString();
    EXPECT_GT(tokens->size(), 30000u) << name;
    EXPECT_TRUE(f->GetString("tokenizer.ggml.model").ok()) << name;
  }
}

}  // namespace
}  // namespace kvx::gguf
