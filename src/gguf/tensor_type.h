// Tensor element types as stored in GGUF files (ggml's type ids), with the
// block geometry needed to size rows. Types kvx can compute with are marked
// by IsSupportedWeightType(); the others are known so that errors can name
// them.
// Thread-safety: pure functions and constants.
#pragma once

#include <cstdint>
#include <string>

namespace kvx::gguf {

enum class TensorType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
};

struct TensorTypeTraits {
  const char* name;     // "q8_0", as llama.cpp spells it
  uint32_t block_size;  // elements per block (1 for plain types)
  uint32_t type_size;   // bytes per block
};

// Traits for a known type; nullptr for an id kvx does not know at all.
const TensorTypeTraits* GetTensorTypeTraits(uint32_t type_id);
// "q8_0", or "type#N" for unknown ids.
std::string TensorTypeName(TensorType type);
// True for the weight types kvx can dequantize and multiply:
// F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K.
bool IsSupportedWeightType(TensorType type);
// "f32, f16, bf16, q8_0, q4_0, q4_K, q5_K, q6_K" (for error messages).
std::string SupportedWeightTypesList();
// Parses a type name, case-insensitively ("q8_0", "Q8_0", "q4_k", "f16");
// false if unknown.
bool ParseTensorType(const std::string& name, TensorType* out);
// Bytes of a row of n elements. REQUIRES: known type, n % block_size == 0.
uint64_t RowBytes(TensorType type, uint64_t n);

}  // namespace kvx::gguf
