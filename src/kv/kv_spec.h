// KVSpec: the one textual description of a KV-cache configuration, used by the
// `--kv` flag, the server's JSON field and eval reports. Parse it with
// ParseKVSpec; ToString() gives the canonical form (ParseKVSpec(s.ToString())
// == s).
//
// Grammar:
//   spec  := group (';' group)*          empty spec = all defaults
//   group := item (',' item)*            empty groups/items are ignored
//   item  := key '=' value               whitespace around tokens is trimmed
// Keys (each at most once in the whole spec):
//   codec     page codec: f32 | f16 | int8 | int4 | int2 | kivi4 | kivi2   default f16
//             int8/int4/int2: K and V quantized per token in channel groups
//             (asymmetric: f16 scale + zero point per group), the counterparts
//             of llama.cpp's q8_0/q4_0. kivi4/kivi2: KIVI — keys per channel
//             over each page's tokens, values per token (use page=32..128).
//   page      tokens per page, a power of two in 1..256              default 16
//             A codec named without page, group, residual, rotate and
//             prerope takes its own default setting for every key not named:
//             kivi2 and kivi4 page=128,group=64,residual=0,rotate=hadamard,
//             prerope=1, int4 rotate=hadamard, int2 clip=1
//             (docs/kv-quantization.md, "Codec defaults"); a default
//             rotate=hadamard or prerope=1 is left out when a policy prunes
//             key channels (think). Naming any of the five keeps the per-key
//             defaults below for the others (codec=int4,rotate=none is the
//             plain per-token int4), and every canonical form names page, so a
//             string means what it meant when it was written.
//   budget    pool bytes: integer with optional suffix K, M, G (binary, also
//             KiB, MiB, GiB; case-insensitive; B = bytes: ParseByteSize,
//             util/byte_size.h, as every size kvx reads). 0 = size the pool
//             from the context length.                               default 0
// Quantized codecs only:
//   bits      K/V bit widths for every layer, kXvY with X, Y in {2, 4, 8}
//             (e.g. k4v2; "4" means k4v4)                  default: the codec's
//   bits.L    (or bits.A-B) per-layer K/V bits overriding `bits` for layer L
//             (layers A..B), KVTuner-style; k16v16 keeps that layer in f16
//   group     channels per (scale, zero point) group of a per-token row, a
//             power of two in 8..1024, clamped to the largest power of two
//             dividing head_dim                                      default 32
//   sym       0 | 1: per-token groups keep only an f16 scale, the zero point
//             is fixed mid-range (llama.cpp's q8_0/q4_0 style; 2 bytes less
//             per group; KIVI keys stay asymmetric per channel)     default 0
//   clip      0 | 1: MSE-optimal clipping — each group's range is searched
//             (shrunk by up to 40%) for the least squared error; costs no
//             bytes, only encoding time        default 0 (int2 alone: 1)
//   residual  newest tokens per head kept in f16 before their page is sealed
//             (KIVI's residual window; pages seal whole)  default 32 for kivi*, else 0
//   sinks     first tokens kept in f16 for ever (attention sinks), rounded up
//             to whole pages                                          default 0
//   outliers  fraction of each page's K and V entries kept exactly in side
//             storage (KVQuant dense-and-sparse), 0 <= f < 0.5, e.g. 0.01 or 1%
//                                                                     default 0
// Any codec:
//   rotate    none | hadamard | values: randomized Hadamard rotation of K and V
//             (values: V only) per head before encoding (QuaRot/RotateKV)
//                                    default none (int4, kivi* alone: hadamard)
//   prerope   0 | 1: cache keys before RoPE, apply it on read (KVQuant)   default 0
// Example: "codec=kivi2,page=128,group=64,residual=32;budget=256M".
// Policy groups: policy=NAME configures an eviction/merging policy
// (kv/policy/), and every item AFTER it in its group belongs to the policy
// (so budget= there means tokens per head, not pool bytes, and sinks= the
// policy's sinks, not the codec's), which is why groups exist; items before
// it in the same group are the codec's. Both
// "codec=kivi4,policy=snapkv,ratio=0.75,window=32" and
// "codec=kivi4;policy=snapkv,ratio=0.75,window=32" mean the same. One
// policy per group; several policy groups (';') apply in order.
//
// Thread-safety: value type; ParseKVSpec is a pure function.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kv/codec/codec_config.h"
#include "kv/codec/codec_id.h"
#include "util/status.h"

namespace kvx::kv {

// A policy group: "policy=NAME,key=value,...". The keys are the policy's
// own (kv/policy/), checked by the policy when it is created.
struct PolicySpec {
  std::string name;
  std::map<std::string, std::string, std::less<>> params;
  bool operator==(const PolicySpec&) const = default;
};

struct KVSpec {
  CodecConfig codec;          // codec= and its companions (bits, group, residual, ...)
  int page_tokens = 16;
  uint64_t budget_bytes = 0;  // 0 = size from context
  std::vector<PolicySpec> policies;  // policy groups, applied in order after every step

  // Canonical form, e.g. "codec=f16,page=16", "codec=f32,page=32,budget=256MiB",
  // "codec=kivi2,page=128,group=64,residual=32".
  std::string ToString() const;
  bool operator==(const KVSpec&) const = default;
};

// Parses a spec. InvalidArgument naming the offending part and the valid
// choices for: unknown key, unknown codec, bad or out-of-range number,
// duplicate key, item without '=', a quantizer key with f32/f16, overlapping
// layer ranges.
Result<KVSpec> ParseKVSpec(std::string_view text);

// Layout-dependent checks of a parsed spec against a model's KV shape
// (ValidateCodecConfig: head_dim, layer ranges, page sizes).
Status ValidateKVSpec(const KVSpec& spec, const KVLayout& layout);

// The --kv argument of every command: a spec, or "@FILE", a JSON object
// whose string member kSpecFileKey holds the spec (what `kvx tune -o FILE`
// writes, with its provenance beside it). Returns the spec text: `arg`
// itself, or the file's spec once it parses. InvalidArgument naming the
// file for a missing or unreadable file, malformed JSON, no "spec" string,
// or a spec that does not parse.
inline constexpr const char* kSpecFileKey = "spec";
Result<std::string> ExpandKVSpecArg(std::string_view arg);

}  // namespace kvx::kv
