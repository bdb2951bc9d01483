// Page codecs: how one page's cache entries are encoded in memory.
//
// Every page, whatever its codec, has the same frame:
//
//   offset 0                      int32 pos[page_tokens]   original token positions
//   offset PageDataOffset(T)      codec data               Codec::DataBytes(T, head_dim)
//   total  PageBytesFor(...)      rounded up to kPageAlign bytes
//
// A codec is a stateless struct of static functions (see the PageCodec concept
// below). The attention hot loop is a template instantiated per codec
// (kv/attention.cc), so there is no virtual call per element; the only runtime
// switch is one DispatchCodec() per Attention/Append call (codecs.h).
//
// Adding a codec (int8, int4, KIVI, ...): write codec/<name>_codec.h with the
// PageCodec functions, add a CodecId, a name in kCodecNames and a case in
// DispatchCodec. Codecs that need per-page state (scales, zero points) keep it in
// their data region; codecs that quantize a group of tokens at once (KIVI keys)
// will get a "page sealed" hook called by SequenceKV when a page fills.
//
// Thread-safety: pure functions; concurrent reads of one page are safe.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace kvx::kv {

enum class CodecId : uint8_t { kF32 = 0, kF16 = 1 };

inline constexpr CodecId kAllCodecs[] = {CodecId::kF32, CodecId::kF16};
// For error messages: the spellings ParseCodecName accepts.
inline constexpr std::string_view kCodecChoices = "f32, f16";

inline constexpr std::string_view CodecName(CodecId id) {
  switch (id) {
    case CodecId::kF32: return "f32";
    case CodecId::kF16: return "f16";
  }
  return "?";
}

inline std::optional<CodecId> ParseCodecName(std::string_view name) {
  for (CodecId id : kAllCodecs) {
    if (CodecName(id) == name) return id;
  }
  return std::nullopt;
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

// What a codec provides. `data` points at the codec data of one page (page +
// PageDataOffset), T = page_tokens, d = head_dim, slots are 0..T-1.
//   kId                         its CodecId
//   DataBytes(T, d)             bytes of codec data for one page
//   Encode(data, T, d, slot, k, v)   stores one entry (k[d], v[d] floats) in `slot`
//   Decode(data, T, d, slot, k, v)   reads it back as floats (tests, debugging, tiers)
//   Scores(data, T, d, n, q, s)      s[j] = q . K_j for slots j < n (unscaled)
//   AccumulateValues(data, T, d, n, p, acc)   acc[c] += sum_{j<n} p[j] * V_j[c]
// Scores and AccumulateValues are the two inner loops of attention; they must
// be deterministic (same inputs -> same bits), independent of threads.
template <class C>
concept PageCodec = requires(uint8_t* w, const uint8_t* r, int t, int d, int slot, int n, const float* f,
                             float* o) {
  { C::kId } -> std::convertible_to<CodecId>;
  { C::DataBytes(t, d) } -> std::same_as<size_t>;
  C::Encode(w, t, d, slot, f, f);
  C::Decode(r, t, d, slot, o, o);
  C::Scores(r, t, d, n, f, o);
  C::AccumulateValues(r, t, d, n, f, o);
};

template <PageCodec C>
constexpr size_t PageBytesFor(int page_tokens, int head_dim) {
  return AlignUp(PageDataOffset(page_tokens) + C::DataBytes(page_tokens, head_dim), kPageAlign);
}

}  // namespace kvx::kv
