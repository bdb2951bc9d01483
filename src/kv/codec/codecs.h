// All page codecs and the one runtime switch over them.
//
// DispatchCodec(id, fn) calls fn(Codec{}) with the codec struct for `id`, so a
// generic lambda `[&](auto codec) { using C = decltype(codec); ... }` gets a
// compile-time codec type; call it once per operation, never per element.
// Several ids share a struct (int8/int4/int2 -> TokenQuantCodec, kivi4/kivi2
// -> KiviCodec): the bit width lives in CodecParams and is switched once per
// page visit.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <utility>

#include "kv/codec/codec_id.h"
#include "kv/codec/f16_codec.h"
#include "kv/codec/f32_codec.h"
#include "kv/codec/quant_codec.h"
#include "util/check.h"

namespace kvx::kv {

template <typename Fn>
decltype(auto) DispatchCodec(CodecId id, Fn&& fn) {
  switch (id) {
    case CodecId::kF32: return std::forward<Fn>(fn)(F32Codec{});
    case CodecId::kF16: return std::forward<Fn>(fn)(F16Codec{});
    case CodecId::kInt8:
    case CodecId::kInt4:
    case CodecId::kInt2: return std::forward<Fn>(fn)(TokenQuantCodec{});
    case CodecId::kKivi4:
    case CodecId::kKivi2: return std::forward<Fn>(fn)(KiviCodec{});
  }
  KVX_CHECK_MSG(false, "unknown CodecId");
}

// Bytes of one page (position header + codec data, kPageAlign-rounded).
inline size_t CodecPageBytes(CodecId id, const CodecParams& params) {
  return DispatchCodec(id, [&](auto codec) { return PageBytesFor<decltype(codec)>(params); });
}

}  // namespace kvx::kv
