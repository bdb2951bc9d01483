// Key-norm baseline (Devoto et al., 2024, "A Simple and Effective L2
// Norm-Based Strategy for KV Cache Compression"; kvpress KnormPress): keys
// with a LOW L2 norm tend to receive high attention, so the score is
// -||k||. Needs no attention probabilities (the fast kernels stay on).
// kvx: the norm of the stored key as decoded (RoPE and the Hadamard
// rotation preserve norms, so pre- and post-RoPE caches agree up to the
// codec's error); no sinks or window, as kvpress. One-shot by default.
#include <cmath>

#include "kv/policy/eviction_policies.h"

namespace kvx::kv {
namespace {

class KeyNormScorer : public Scorer {
 public:
  std::string_view name() const override { return "knorm"; }
  ObservationNeeds needs() const override { return ObservationNeeds{}; }
  void Score(const ScoringInput& in, std::vector<float>* scores) const override {
    std::vector<float> k, v;
    std::vector<int32_t> pos;
    in.kv.ReadChain(in.layer, in.kv_head, &k, &v, &pos);
    const int D = in.kv.layout().head_dim;
    scores->resize(in.slots.size());
    for (size_t i = 0; i < in.slots.size(); ++i) {
      const float* key = &k[static_cast<size_t>(in.slots[i]) * D];
      double s = 0.0;
      for (int d = 0; d < D; ++d) s += static_cast<double>(key[d]) * key[d];
      (*scores)[i] = -static_cast<float>(std::sqrt(s));
    }
  }
};

}  // namespace

static ScorerMethod KeyNormMethod() {
  EvictionConfig d;
  d.window = 0;
  d.sinks = 0;
  return {"knorm", [](PolicyParamReader&) -> Result<std::unique_ptr<Scorer>> { return std::unique_ptr<Scorer>(new KeyNormScorer()); },
          d};
}

namespace {
const ScorerRegistrar kRegistered(KeyNormMethod());
}  // namespace

}  // namespace kvx::kv
