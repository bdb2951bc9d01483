// Page codecs: how one page's cache entries are encoded in memory.
//
// Every page, whatever its codec, has the same frame:
//
//   offset 0                      int32 pos[page_tokens]   original token positions
//   offset PageDataOffset(T)      codec data               Codec::DataBytes(params)
//   total  PageBytesFor(...)      rounded up to kPageAlign bytes
//
// A codec is a stateless struct of static functions (see the PageCodec concept
// below) that take the layer's CodecParams (bits, group size, outlier count,
// resolved from the --kv spec by codec_config.h). The attention hot loop is a
// template instantiated per codec (kv/attention.cc), so there is no virtual
// call per element; the only runtime switch is one DispatchCodec() per
// Attention/Append call (codecs.h) plus one switch on the bit width per page.
//
// Two ways a page gets written (SequenceKV decides, see sequence_kv.h):
//   * row-wise codecs (kRowWise: f32, f16, per-token int8/int4/int2 without
//     outliers) encode each token into its slot as it arrives (EncodeRow),
//     like llama.cpp's q8_0/q4_0 caches;
//   * page codecs (KIVI keys are quantized per channel over the page's
//     tokens; outlier selection looks at the whole page) are "sealed": the
//     page's tokens are first written to an f16 staging page and, once the page
//     is full (and outside the full-precision residual window), encoded at once
//     (EncodePage) into a page of the codec's own, smaller size.
//
// Thread-safety: pure functions; concurrent reads of one page are safe.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace kvx::kv {

// The page encodings selectable with `codec=` (plus per-layer `bits.L=`).
//   f32, f16        full precision
//   int8/int4/int2  per-token asymmetric groups (scale + zero point per group
//                   of `group` channels), keys and values alike
//   kivi4/kivi2     KIVI: keys per channel over the page's tokens, values per
//                   token; always sealed, usually with a residual window
enum class CodecId : uint8_t { kF32 = 0, kF16 = 1, kInt8 = 2, kInt4 = 3, kInt2 = 4, kKivi4 = 5, kKivi2 = 6 };

inline constexpr CodecId kAllCodecs[] = {CodecId::kF32,  CodecId::kF16,   CodecId::kInt8,  CodecId::kInt4,
                                         CodecId::kInt2, CodecId::kKivi4, CodecId::kKivi2};
// For error messages: the spellings ParseCodecName accepts.
inline constexpr std::string_view kCodecChoices = "f32, f16, int8, int4, int2, kivi4, kivi2";

inline constexpr std::string_view CodecName(CodecId id) {
  switch (id) {
    case CodecId::kF32: return "f32";
    case CodecId::kF16: return "f16";
    case CodecId::kInt8: return "int8";
    case CodecId::kInt4: return "int4";
    case CodecId::kInt2: return "int2";
    case CodecId::kKivi4: return "kivi4";
    case CodecId::kKivi2: return "kivi2";
  }
  return "?";
}

inline std::optional<CodecId> ParseCodecName(std::string_view name) {
  for (CodecId id : kAllCodecs) {
    if (CodecName(id) == name) return id;
  }
  return std::nullopt;
}

inline constexpr bool IsQuantized(CodecId id) { return id != CodecId::kF32 && id != CodecId::kF16; }
inline constexpr bool IsKivi(CodecId id) { return id == CodecId::kKivi4 || id == CodecId::kKivi2; }
// The bit width a quantized codec uses for K and V unless `bits=` says otherwise.
inline constexpr int DefaultBits(CodecId id) {
  switch (id) {
    case CodecId::kInt8: return 8;
    case CodecId::kInt4: case CodecId::kKivi4: return 4;
    case CodecId::kInt2: case CodecId::kKivi2: return 2;
    default: return 16;
  }
}

// Pages start at kPageAlign-aligned addresses and their sizes are multiples of it
// (one cache line: no false sharing between pages, aligned SIMD loads).
inline constexpr size_t kPageAlign = 64;

inline constexpr size_t AlignUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

// Byte offset of the codec data inside a page of `page_tokens` slots.
inline constexpr size_t PageDataOffset(int page_tokens) {
  return AlignUp(sizeof(int32_t) * static_cast<size_t>(page_tokens), kPageAlign);
}

inline int32_t* PagePositions(uint8_t* page) { return reinterpret_cast<int32_t*>(page); }
inline const int32_t* PagePositions(const uint8_t* page) { return reinterpret_cast<const int32_t*>(page); }

// Everything a codec's page functions need about one layer's encoding.
struct CodecParams {
  int page_tokens = 16;  // T, slots per page
  int head_dim = 0;      // d, channels per key/value vector
  int k_bits = 16;       // quantized codecs: 2, 4 or 8
  int v_bits = 16;
  int group = 0;         // channels per (scale, zero point) group of a per-token row; a power of two dividing d
  int outliers = 0;      // entries per page kept exactly, for K and for V each (0 = none)
  bool sym = false;      // per-token groups store only a scale (zero point fixed at 2^(b-1))
  bool clip = false;     // search each group's range for the least squared error
  bool operator==(const CodecParams&) const = default;
};

// What a codec provides. `data` points at the codec data of one page (page +
// PageDataOffset), rows are [n][head_dim] floats, slots are 0..T-1.
//   kRowWise                      EncodeRow is supported (else only EncodePage)
//   DataBytes(p)                  bytes of codec data for one page
//   EncodeRow(p, data, slot, k, v)     stores one entry in `slot`
//   EncodePage(p, data, n, k, v)       stores entries 0..n-1 at once (n == T
//                                      for page codecs)
//   DecodeKeys(p, data, n, k) / DecodeValues(p, data, n, v)
//                                      entries 0..n-1 back as floats
//   Scores(p, data, n, q, nq, s, ss)   s[r*ss + j] = q_r . K_j for r < nq,
//                                      j < n; q is [nq][head_dim] (unscaled)
//   AccumulateValues(p, data, n, w, nq, ws, acc)
//                                      acc[r][c] += sum_{j<n} w[r*ws + j] V_j[c]
// Scores and AccumulateValues are the two inner loops of attention; they read
// the encoding directly (dequantization happens in registers, never into a
// dense copy) and process up to kMaxQueryRows query rows per page visit, so a
// GQA group reads each page once. They must be deterministic (same inputs ->
// same bits), independent of threads.
inline constexpr int kMaxQueryRows = 8;

// Online softmax (attention's page-by-page pass) keeps a reference max per
// query row and rescales the row's sum and accumulator only when a block of
// scores exceeds it by more than kSoftmaxSlack; the reference then becomes
// that block's max. Softmax does not depend on the reference, so this changes
// only rounding, while most rises of the true max (frequent at the start of
// every context chunk) cost nothing: a rise is a reduction, an exp and a
// rescale of the accumulator, and with eager rescaling they took ~5% of
// decode attention at 8k context (kv_bench AllLayers f16, 1 thread). Weights
// exp(s - reference) stay below e^8, so sums cannot overflow.
inline constexpr float kSoftmaxSlack = 8.0f;

// Where attention's kernels also leave the softmax weights they compute, so
// that an observer's column sums (H2O's, the SnapKV/TOVA window's) come from
// them without a second exp pass (attention.cc, AddColumnSums): the weight of
// row r at item-local entry k is w[r * stride + k] = exp(s - ref), relative
// to the row's reference max at that moment, ref[r * (stride / group) + k /
// group]; entries of a group share one reference. Refs of groups never
// visited stay -inf. page_offset[i]: the item-local index of the first entry
// of the i-th page of a fused run.
struct WeightTap {
  float* w = nullptr;
  float* ref = nullptr;
  int stride = 0;
  int group = 16;
  const int* page_offset = nullptr;
};

template <class C>
concept PageCodec = requires(const CodecParams& p, uint8_t* w, const uint8_t* r, int slot, int n, const float* f,
                             float* o) {
  { C::kRowWise } -> std::convertible_to<bool>;
  { C::DataBytes(p) } -> std::same_as<size_t>;
  C::EncodeRow(p, w, slot, f, f);
  C::EncodePage(p, w, n, f, f);
  C::DecodeKeys(p, r, n, o);
  C::DecodeValues(p, r, n, o);
  C::Scores(p, r, n, f, n, o, n);
  C::AccumulateValues(p, r, n, f, n, n, o);
};

template <PageCodec C>
size_t PageBytesFor(const CodecParams& p) {
  return AlignUp(PageDataOffset(p.page_tokens) + C::DataBytes(p), kPageAlign);
}

}  // namespace kvx::kv
