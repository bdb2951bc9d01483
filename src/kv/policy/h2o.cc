// H2O (Zhang et al., 2023; METHODS.md B2): a token's importance is the
// attention it accumulated from every query so far (prefill column sums,
// then each decode row); keep the heavy hitters plus the recent tokens.
// kvx: per query head sums, reduced over the GQA group (mean, as
// KVCache-Factory; reduce= to change); the paper's 50/50 heavy/recent split
// is the default window (half the kept entries); continuous by default (the
// paper evicts at every step), mode=once for prefill-only.
#include "kv/policy/eviction_policies.h"

namespace kvx::kv {
namespace {

class H2OScorer : public Scorer {
 public:
  explicit H2OScorer(GroupReduce reduce) : reduce_(reduce) {}
  std::string_view name() const override { return "h2o"; }
  ObservationNeeds needs() const override {
    ObservationNeeds n;
    n.probabilities = true;
    n.query_window = 0;  // every query
    n.fold_window = 0;   // accumulate over all steps
    return n;
  }
  void Score(const ScoringInput& in, std::vector<float>* scores) const override {
    GroupStat(in, reduce_, [](const HeadStats& s, int32_t p) { return s.Sum(p); }, scores);
  }
  PolicyParams Parameters() const override { return {{"reduce", std::string(GroupReduceName(reduce_))}}; }

 private:
  GroupReduce reduce_;
};

}  // namespace

static ScorerMethod H2OMethod() {
  EvictionConfig d;
  d.window_fraction = 0.5;
  d.sinks = 4;
  d.continuous = true;
  return {"h2o",
          [](PolicyParamReader& r) -> Result<std::unique_ptr<Scorer>> {
            std::string reduce = "mean";
            r.Choice("reduce", &reduce, {"mean", "max", "sum"});
            KVX_ASSIGN_OR_RETURN(GroupReduce g, ParseGroupReduce(reduce));
            return std::unique_ptr<Scorer>(new H2OScorer(g));
          },
          d};
}

namespace {
const ScorerRegistrar kRegistered(H2OMethod());
}  // namespace

}  // namespace kvx::kv
