// SnapKV (Li et al., 2024; METHODS.md B5): each head's future attention is
// predicted by the prompt's last w queries (the observation window). Per
// query head, the votes are the window's attention summed per entry,
// smoothed by 1-D pooling (kernel 5, average, so an entry's neighbours
// survive with it: local clusters), then averaged over the GQA group
// (kvpress); the top entries plus the whole window are kept at their
// original positions. One-shot at the end of a prefill (mode=once), the
// setting kvpress measures with the question excluded and included.
// kvx: the window is the recorder's last `window` queries of the step that
// preceded the compression (a shorter last chunk blends with the previous
// window, observations.h); pooling averages the in-range neighbours only
// (no zero padding); 4 sinks are kept (METHODS.md pitfall 2).
#include "kv/policy/eviction_policies.h"

namespace kvx::kv {

class SnapKVScorer : public Scorer {
 public:
  SnapKVScorer(int window, int kernel, bool max_pool, GroupReduce reduce)
      : window_(window), kernel_(kernel), max_pool_(max_pool), reduce_(reduce) {}
  std::string_view name() const override { return "snapkv"; }
  ObservationNeeds needs() const override {
    ObservationNeeds n;
    n.probabilities = true;
    n.query_window = window_;
    n.fold_window = window_;
    return n;
  }
  void Score(const ScoringInput& in, std::vector<float>* scores) const override {
    // Pool per query head, then reduce the group.
    GroupStat(in, reduce_, [](const HeadStats& s, int32_t p) { return s.Sum(p); }, scores, kernel_, max_pool_);
  }
  PolicyParams Parameters() const override {
    return {{"window", std::to_string(window_)},
            {"kernel", std::to_string(kernel_)},
            {"pool", max_pool_ ? "max" : "avg"},
            {"reduce", std::string(GroupReduceName(reduce_))}};
  }

 private:
  int window_, kernel_;
  bool max_pool_;
  GroupReduce reduce_;
};

static ScorerMethod SnapKVMethod() {
  EvictionConfig d;
  d.window = 32;
  d.sinks = 4;
  d.continuous = false;
  return {"snapkv",
          [](PolicyParamReader& r) -> Result<std::unique_ptr<Scorer>> {
            int window = 32, kernel = 5;
            std::string pool = "avg", reduce = "mean";
            r.Int("window", &window, 1, 1 << 20).Int("kernel", &kernel, 1, 63).Choice("pool", &pool, {"avg", "max"});
            r.Choice("reduce", &reduce, {"mean", "max", "sum"});
            if (kernel % 2 == 0) return InvalidArgument("policy " + r.policy() + ": kernel=" + std::to_string(kernel) +
                                                        " must be odd (a centred pooling window), e.g. kernel=5");
            KVX_ASSIGN_OR_RETURN(GroupReduce g, ParseGroupReduce(reduce));
            return std::unique_ptr<Scorer>(new SnapKVScorer(window, kernel, pool == "max", g));
          },
          d};
}

namespace {
const ScorerRegistrar kRegistered(SnapKVMethod());
// PyramidKV: SnapKV's scores with PyramidKV's layer budgets.
const PolicyRegistrar kPyramidKV("pyramidkv",
                                 ScoredPolicyFactory("pyramidkv", "snapkv", [](EvictionConfig& d) { d.layers = "pyramid"; }));
}  // namespace

}  // namespace kvx::kv
