#include "gguf/tensor_type.h"

#include <array>
#include <cctype>

#include "util/check.h"

namespace kvx::gguf {
namespace {

// Block geometry of every ggml type id. K-quants and most i-quants use
// 256-element super-blocks (QK_K); the legacy quants and iq4_nl use 32.
// Bytes per block follow from ggml's block structs, e.g. q8_0 = fp16 scale +
// 32 int8 = 34 bytes; q6_K = 128 (low 4 bits) + 64 (high 2 bits) + 16 int8
// scales + fp16 d = 210 bytes. Ids 4, 5 (q4_2, q4_3) and 31..33 (the
// repacked q4_0_4_4/4_8/8_8) were removed from ggml and stay unknown here.
constexpr uint32_t kMaxTypeId = 35;
struct Entry {
  uint32_t id;
  TensorTypeTraits traits;
};
constexpr Entry kEntries[] = {
    {0, {"f32", 1, 4}},         {1, {"f16", 1, 2}},
    {2, {"q4_0", 32, 18}},      {3, {"q4_1", 32, 20}},
    {6, {"q5_0", 32, 22}},      {7, {"q5_1", 32, 24}},
    {8, {"q8_0", 32, 34}},      {9, {"q8_1", 32, 36}},
    {10, {"q2_K", 256, 84}},    {11, {"q3_K", 256, 110}},
    {12, {"q4_K", 256, 144}},   {13, {"q5_K", 256, 176}},
    {14, {"q6_K", 256, 210}},   {15, {"q8_K", 256, 292}},
    {16, {"iq2_xxs", 256, 66}}, {17, {"iq2_xs", 256, 74}},
    {18, {"iq3_xxs", 256, 98}}, {19, {"iq1_s", 256, 50}},
    {20, {"iq4_nl", 32, 18}},   {21, {"iq3_s", 256, 110}},
    {22, {"iq2_s", 256, 82}},   {23, {"iq4_xs", 256, 136}},
    {24, {"i8", 1, 1}},         {25, {"i16", 1, 2}},
    {26, {"i32", 1, 4}},        {27, {"i64", 1, 8}},
    {28, {"f64", 1, 8}},        {29, {"iq1_m", 256, 56}},
    {30, {"bf16", 1, 2}},       {34, {"tq1_0", 256, 54}},
    {35, {"tq2_0", 256, 66}},
};

// Dense lookup table indexed by type id (nullptr = unknown id).
constexpr std::array<const TensorTypeTraits*, kMaxTypeId + 1> MakeTable() {
  std::array<const TensorTypeTraits*, kMaxTypeId + 1> t{};
  for (const Entry& e : kEntries) t[e.id] = &e.traits;
  return t;
}
constexpr auto kTable = MakeTable();

constexpr TensorType kSupported[] = {
    TensorType::kF32,  TensorType::kF16,  TensorType::kBF16, TensorType::kQ8_0,
    TensorType::kQ4_0, TensorType::kQ4_K, TensorType::kQ5_K, TensorType::kQ6_K,
};

bool EqualsIgnoreCase(const std::string& a, const char* b) {
  size_t i = 0;
  for (; i < a.size() && b[i] != '\0'; ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return i == a.size() && b[i] == '\0';
}

}  // namespace

const TensorTypeTraits* GetTensorTypeTraits(uint32_t type_id) {
  return type_id <= kMaxTypeId ? kTable[type_id] : nullptr;
}

std::string TensorTypeName(TensorType type) {
  const TensorTypeTraits* t = GetTensorTypeTraits(static_cast<uint32_t>(type));
  if (t == nullptr) return "type#" + std::to_string(static_cast<uint32_t>(type));
  return t->name;
}

bool IsSupportedWeightType(TensorType type) {
  for (TensorType s : kSupported) {
    if (s == type) return true;
  }
  return false;
}

std::string SupportedWeightTypesList() {
  std::string out;
  for (TensorType s : kSupported) {
    if (!out.empty()) out += ", ";
    out += TensorTypeName(s);
  }
  return out;
}

bool ParseTensorType(const std::string& name, TensorType* out) {
  for (const Entry& e : kEntries) {
    if (EqualsIgnoreCase(name, e.traits.name)) {
      *out = static_cast<TensorType>(e.id);
      return true;
    }
  }
  return false;
}

uint64_t RowBytes(TensorType type, uint64_t n) {
  const TensorTypeTraits* t = GetTensorTypeTraits(static_cast<uint32_t>(type));
  KVX_CHECK_MSG(t != nullptr, "RowBytes of an unknown tensor type");
  KVX_CHECK_MSG(n % t->block_size == 0, "RowBytes: n is not a multiple of the block size");
  return n / t->block_size * t->type_size;
}

}  // namespace kvx::gguf
