// The spec path: text -> KVSpec (ParseKVSpec, kv_spec.h: the grammar) ->
// ResolvedKVSpec (ResolveKVSpec, here: every check against the model's KV
// shape, the per-layer codecs, the pool budget, and the policies built)
// -> KVManager::Create (kv_manager.h), which adopts all of it. Each step runs
// once per engine: a command parses its --kv text once (EngineOptions
// carries the KVSpec), the engine resolves it once, and each policy group is
// instantiated once (a policy that reads a file, heads=FILE, reads it once).
// Sequences are made from the resolved layers, never re-resolved.
//
// Thread-safety: ResolveKVSpec is a pure function of its arguments (the
// policy registry is only read).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "kv/codec/codec_config.h"
#include "kv/kv_spec.h"
#include "kv/layout.h"
#include "util/status.h"

namespace kvx::kv {

class KVPolicy;

// A KV spec resolved against a model's KV shape: everything the pool, the
// sequences and the policies are made from, checked once so that no command
// can run a spec `kvx inspect` would reject. Move-only (it owns the
// policies).
struct ResolvedKVSpec {
  KVSpec spec;
  KVLayout layout;                 // the model's shape with spec.page_tokens
  std::vector<LayerCodec> layers;  // ResolveLayers(layout, spec.codec), one per layer
  int n_ctx = 0;                   // tokens one sequence may hold
  int n_seqs = 1;                  // sequences the budget was sized for
  uint64_t budget_bytes = 0;       // the pool's (spec.budget_bytes or sized from n_ctx * n_seqs)
  // spec.policies in order, each built once from the registry and checked
  // against the spec (KVPolicy::CheckSpec). KVManager::Create takes them
  // over: a manager's spec() holds none, its policies() holds them.
  std::vector<std::unique_ptr<KVPolicy>> policies;

  ResolvedKVSpec();
  ~ResolvedKVSpec();
  ResolvedKVSpec(ResolvedKVSpec&&) noexcept;
  ResolvedKVSpec& operator=(ResolvedKVSpec&&) noexcept;
};

// Parses `text` (when given as text) and validates it against `model_layout`
// (its page_tokens is ignored): the layout, every codec check
// (ValidateCodecConfig: head_dim, layer ranges, page sizes, bits), the
// policies (an unknown name or parameter, KVPolicy::CheckSpec), the context
// length (>= 1; pre-RoPE keys bound the positions) and a budget that holds
// at least one token of one sequence. InvalidArgument naming the problem and
// what to change otherwise.
Result<ResolvedKVSpec> ResolveKVSpec(std::string_view text, const KVLayout& model_layout, int n_ctx, int n_seqs);

// Bytes per token a `tokens`-token sequence holds at steady state: the
// codecs' (BytesPerToken), then each policy's KVPolicy::KeptBytesPerToken in
// order (eviction keeps its budget, demotion adds the demoted copies, Quest
// its bounds). What kvx plan sizes a sequence by.
double SteadyStateBytesPerToken(const ResolvedKVSpec& resolved, std::span<const std::unique_ptr<KVPolicy>> policies,
                                int tokens);
Result<ResolvedKVSpec> ResolveKVSpec(const KVSpec& spec, const KVLayout& model_layout, int n_ctx, int n_seqs);

}  // namespace kvx::kv
