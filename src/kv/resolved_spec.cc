#include "kv/resolved_spec.h"

#include <algorithm>
#include <string>

#include "kv/policy/policy.h"
#include "kv/sequence_kv.h"

namespace kvx::kv {
namespace {

// Positions a pre-RoPE cache can hold (SequenceKV keeps a dense cos/sin table).
constexpr int kMaxPreRopeContext = 1 << 22;

// The most a sequence of 1..n_ctx tokens holds. Not always the budget at
// n_ctx: a sealed codec holds its newest tokens in f16 staging pages, so a
// short sequence (all staging) can hold more than a longer one whose pages
// were packed (kivi2, page=32, residual=0: one token needs more than 64).
// Past the residual window and two pages only packed pages grow, so the
// peak is at n_ctx or within that window.
uint64_t PeakBudgetUpTo(const KVLayout& layout, std::span<const LayerCodec> layers, int n_ctx) {
  int window = 0;
  for (const LayerCodec& lc : layers) {
    if (lc.sealed) window = std::max(window, lc.residual + 2 * layout.page_tokens);
  }
  uint64_t peak = BudgetForContext(layout, layers, n_ctx);
  for (int k = 1; k <= std::min(window, n_ctx); ++k) peak = std::max(peak, BudgetForContext(layout, layers, k));
  return peak;
}

}  // namespace

ResolvedKVSpec::ResolvedKVSpec() = default;
ResolvedKVSpec::~ResolvedKVSpec() = default;
ResolvedKVSpec::ResolvedKVSpec(ResolvedKVSpec&&) noexcept = default;
ResolvedKVSpec& ResolvedKVSpec::operator=(ResolvedKVSpec&&) noexcept = default;

Result<ResolvedKVSpec> ResolveKVSpec(std::string_view text, const KVLayout& model_layout, int n_ctx, int n_seqs) {
  KVX_ASSIGN_OR_RETURN(KVSpec spec, ParseKVSpec(text));
  return ResolveKVSpec(spec, model_layout, n_ctx, n_seqs);
}

Result<ResolvedKVSpec> ResolveKVSpec(const KVSpec& spec, const KVLayout& model_layout, int n_ctx, int n_seqs) {
  ResolvedKVSpec r;
  r.spec = spec;
  r.layout = model_layout;
  r.layout.page_tokens = spec.page_tokens;
  const std::string what = "--kv '" + spec.ToString() + "'";
  KVX_RETURN_IF_ERROR(ValidateKVSpec(spec, r.layout));  // its messages name the spec and the fix
  if (n_ctx < 1) return InvalidArgument("context length must be at least 1 token (got " + std::to_string(n_ctx) + ")");
  if (spec.codec.pre_rope && n_ctx > kMaxPreRopeContext) {
    return InvalidArgument(what + ": pre-RoPE keys support contexts up to " + std::to_string(kMaxPreRopeContext) +
                           " tokens; lower -c");
  }
  if (n_seqs < 1) return InvalidArgument("sequence count must be at least 1");
  r.n_ctx = n_ctx;
  r.n_seqs = n_seqs;
  r.layers = ResolveLayers(r.layout, spec.codec);  // the one resolution: pool, sequences, sizes and policies use it
  uint64_t headroom = 0;  // what compressing a full sequence holds before it frees (KVPolicy)
  for (const PolicySpec& p : spec.policies) {  // an unknown policy or parameter is an error here, on every path
    KVX_ASSIGN_OR_RETURN(auto policy, PolicyRegistry::Global().Create(p.name, p.params));
    KVX_RETURN_IF_ERROR(policy->CheckSpec(r));
    headroom += policy->CompressionHeadroomBytes(r);
    r.policies.push_back(std::move(policy));
  }
  r.budget_bytes = spec.budget_bytes;
  if (r.budget_bytes == 0) {
    r.budget_bytes = (PeakBudgetUpTo(r.layout, r.layers, n_ctx) + headroom) * static_cast<uint64_t>(n_seqs);
  }
  // The smallest useful budget: one token of one sequence in every table.
  const uint64_t one_token = BudgetForContext(r.layout, r.layers, 1);
  if (r.budget_bytes < one_token) {
    return InvalidArgument(what + ": budget of " + std::to_string(r.budget_bytes) +
                           " bytes cannot hold one token (needs " + std::to_string(one_token) +
                           " bytes: a page per layer and kv head); raise budget=");
  }
  return r;
}

double SteadyStateBytesPerToken(const ResolvedKVSpec& resolved, std::span<const std::unique_ptr<KVPolicy>> policies,
                                int tokens) {
  double bytes = static_cast<double>(BytesPerToken(resolved.layout, resolved.layers));
  for (const auto& p : policies) bytes = p->KeptBytesPerToken(resolved, std::max(tokens, 1), bytes);
  return bytes;
}

}  // namespace kvx::kv
