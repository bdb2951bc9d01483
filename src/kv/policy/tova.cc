// TOVA (Oren et al., 2024; METHODS.md B4): when over budget, drop the
// entries the CURRENT query attends to least, its attention averaged over
// every query head of the layer, so all kv heads of a layer keep the same
// tokens. kvx: the recorder keeps the last query only (window 1); one-shot
// on a prompt (mode=once) keeps the top by the last prompt query, as
// kvpress; the last token is forced in (window=1), no sinks (the paper has
// none). Continuous by default.
#include "kv/policy/eviction_policies.h"

namespace kvx::kv {
namespace {

class TovaScorer : public Scorer {
 public:
  std::string_view name() const override { return "tova"; }
  ObservationNeeds needs() const override {
    ObservationNeeds n;
    n.probabilities = true;
    n.query_window = 1;
    n.fold_window = 1;
    return n;
  }
  void Score(const ScoringInput& in, std::vector<float>* scores) const override {
    scores->assign(in.positions.size(), 0.0f);
    if (in.obs == nullptr || in.obs->n_heads() == 0) return;
    const int heads = in.obs->n_heads();
    for (int h = 0; h < heads; ++h) {  // every query head of the layer, not only the group
      const HeadStats* hs = in.obs->head(in.layer, h);
      if (hs == nullptr) continue;
      for (size_t i = 0; i < in.positions.size(); ++i) (*scores)[i] += hs->Sum(in.positions[i]) / heads;
    }
  }
};

}  // namespace

static ScorerMethod TovaMethod() {
  EvictionConfig d;
  d.window = 1;
  d.sinks = 0;
  d.continuous = true;
  return {"tova", [](PolicyParamReader&) -> Result<std::unique_ptr<Scorer>> { return std::unique_ptr<Scorer>(new TovaScorer()); },
          d};
}

namespace {
const ScorerRegistrar kRegistered(TovaMethod());
}  // namespace

}  // namespace kvx::kv
