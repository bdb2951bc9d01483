// libFuzzer target for the --kv spec parser (user input from the CLI, later
// the server). Every input must parse to a spec or to an InvalidArgument;
// a parsed spec must print canonically (ToString) and parse back to itself,
// and resolving it against a few model layouts must not crash
// (ResolveLayers never fails; ValidateKVSpec may reject).
//
// Seed corpus: fuzz/corpus/kv/.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "kv/kv_spec.h"
#include "kv/sequence_kv.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto spec = kvx::kv::ParseKVSpec(text);
  if (!spec.ok()) {
    if (spec.status().code() != kvx::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  const std::string canonical = spec->ToString();
  auto again = kvx::kv::ParseKVSpec(canonical);
  if (!again.ok() || !(*again == *spec)) {
    std::fprintf(stderr, "kv_fuzz: '%s' does not round-trip\n", canonical.c_str());
    std::abort();
  }
  for (int head_dim : {8, 64, 96}) {
    const kvx::kv::KVLayout layout{3, 2, head_dim, spec->page_tokens};
    (void)kvx::kv::ValidateKVSpec(*spec, layout);
    (void)kvx::kv::BytesPerToken(layout, spec->codec);
    (void)kvx::kv::BytesForContext(layout, spec->codec, 100);
  }
  return 0;
}
