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
//   codec   page codec: f32 | f16                                 default f16
//   page    tokens per page, a power of two in 1..256              default 16
//   budget  pool bytes: integer with optional suffix K, M, G (binary, also
//           KiB, MiB, GiB; case-insensitive; B = bytes). 0 = size the pool
//           from the context length.                               default 0
// Example: "codec=f16,page=16;budget=256M".
// Later issues add codecs (int8, int4, kivi2, kivi4, ...) with their own keys
// (residual=...), and a policy group "policy=snapkv,budget=1024,window=32":
// inside a group opened by policy=, keys belong to the policy (so budget=
// there means tokens per head), which is why groups exist.
//
// Thread-safety: value type; ParseKVSpec is a pure function.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kv/codec/codec_id.h"
#include "util/status.h"

namespace kvx::kv {

struct KVSpec {
  CodecId codec = CodecId::kF16;
  int page_tokens = 16;
  uint64_t budget_bytes = 0;  // 0 = size from context

  // Canonical form, e.g. "codec=f16,page=16" or "codec=f32,page=32,budget=256MiB".
  std::string ToString() const;
  bool operator==(const KVSpec&) const = default;
};

// Parses a spec. InvalidArgument naming the offending part and the valid
// choices for: unknown key, unknown codec, bad or out-of-range number,
// duplicate key, item without '='.
Result<KVSpec> ParseKVSpec(std::string_view text);

}  // namespace kvx::kv
