// CodecConfig: everything the --kv spec says about how pages encode K and V
// (the `codec=` key and its companions), and its resolution into one
// LayerCodec per layer for a given KVLayout.
//
// The pieces compose freely:
//   codec      the packed encoding (codec_id.h): f32 f16 int8 int4 int2 kivi4 kivi2
//   bits       K/V bit widths for all layers (e.g. k4v2), overriding the codec's
//   bits.L     per-layer K/V bit widths (KVTuner, arXiv 2502.04420); 16 keeps a
//              layer in f16 (k16v16)
//   group      channels per (scale, zero point) group of a per-token row
//   sym        per-token groups keep only a scale (zero point fixed mid-range:
//              llama.cpp's q8_0/q4_0 style), 2 bytes less per group
//   clip       MSE-optimal clipping: each group's range is searched (shrunk by
//              up to 40%) for the least squared error; free in bytes
//   residual   the newest R tokens of each head stay in f16 staging pages (KIVI)
//   sinks      the first S tokens stay in f16 for ever (KVQuant / RotateKV sinks)
//   rotation   randomized Hadamard on K and V (or V only) before encoding (QuaRot/RotateKV)
//   pre_rope   keys cached before RoPE; attention applies it on read (KVQuant)
//   outliers   fraction of entries per page kept exactly (KVQuant dense-and-sparse)
// Granularity: residual and sinks act on whole pages — a page is sealed once
// every token in it is older than the newest `residual` tokens; sink pages are
// the first ceil(sinks / page_tokens) pages.
//
// Thread-safety: value types and pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kv/codec/codec_id.h"
#include "kv/layout.h"
#include "util/status.h"

namespace kvx::kv {

// Which tensors get the Hadamard rotation: none, keys and values, or values
// only (KIVI's per-channel keys are better left alone; per-token values gain).
enum class Rotation : uint8_t { kNone = 0, kHadamard = 1, kValues = 2 };

// K/V bit widths for layers first..last (inclusive).
struct LayerBits {
  int first = 0, last = 0;
  int k_bits = 0, v_bits = 0;
  bool operator==(const LayerBits&) const = default;
};

struct CodecConfig {
  static constexpr int kDefaultGroup = 32;
  static constexpr int kDefaultKiviResidual = 32;

  CodecId id = CodecId::kF16;
  int k_bits = 0, v_bits = 0;        // 0 = DefaultBits(id)
  std::vector<LayerBits> layer_bits; // sorted by first, non-overlapping
  int group = 0;                     // 0 = kDefaultGroup
  int residual = -1;                 // -1 = kDefaultKiviResidual for kivi*, else 0
  int sinks = 0;
  Rotation rotation = Rotation::kNone;
  bool pre_rope = false;
  double outliers = 0;               // fraction of entries, 0 <= f < 0.5
  bool sym = false;                  // symmetric per-token groups (scale only)
  bool clip = false;                 // MSE-optimal clipping of each group's range

  CodecConfig() = default;
  CodecConfig(CodecId codec) : id(codec) {}  // NOLINT(google-explicit-constructor): CodecId is a complete config
  bool operator==(const CodecConfig&) const = default;

  int EffectiveGroup() const { return group > 0 ? group : kDefaultGroup; }
  int EffectiveResidual() const { return residual >= 0 ? residual : (IsKivi(id) ? kDefaultKiviResidual : 0); }
  // Spec items, canonical order, defaults omitted except codec: "codec=kivi2,group=64".
  std::string ToString() const;
};

// How one layer's pages are encoded.
struct LayerCodec {
  CodecId id = CodecId::kF16;   // codec of packed pages (kF16/kF32 for full-precision layers)
  CodecParams params;
  bool sealed = false;          // tokens are staged in f16 pages, then sealed into `id`
  int residual = 0;             // newest tokens kept in staging pages (sealed layers)
  int sink_pages = 0;           // leading pages kept in f16
  size_t packed_page_bytes = 0; // one page in `id`
  size_t full_page_bytes = 0;   // one f16 page (staging, sinks)

  // Whether page `index` of a chain of `length` entries is in f16 (staging or
  // sink) rather than packed. Pages become packed in chain order and never
  // revert.
  bool IsFullPage(int index, int length) const {
    if (index < sink_pages) return true;
    if (!sealed) return false;
    return static_cast<int64_t>(index + 1) * params.page_tokens > static_cast<int64_t>(length) - residual;
  }
  size_t PageBytes(bool full) const { return full ? full_page_bytes : packed_page_bytes; }
};

// One LayerCodec per layer. Never fails: settings the layout cannot honour are
// adapted (group clamped to the largest power of two dividing head_dim;
// quantization falls back to f16 when head_dim % 8 != 0; out-of-range layer
// overrides are ignored). ValidateCodecConfig reports those cases as errors.
std::vector<LayerCodec> ResolveLayers(const KVLayout& layout, const CodecConfig& config);

// InvalidArgument naming the problem for a config that ResolveLayers would
// have to adapt, or that needs more distinct page sizes than the pool allows.
Status ValidateCodecConfig(const KVLayout& layout, const CodecConfig& config);

}  // namespace kvx::kv
