// CAKE (Qin et al., 2025; METHODS.md B7): per-input layer budgets from two
// statistics of the observation window — spatial dispersion (the attention
// entropy H_l) and temporal shift (the variance over the window's queries,
// V_l) — as preferences P_l = H_l^(1/tau1) V_l^(1/tau2) (budget.h), and a
// token indicator mean_i A + gamma * var_i A over the window, average-pooled
// (kernel 5) and averaged over the GQA group.
// kvx: one-shot after the prefill (mode=once), not the paper's cascade
// during prefill (which trims earlier layers as later ones finish to cap the
// peak: kvx's peak is the full prompt's cache); tau1 = tau2 = 1 by default
// (the paper tunes them per model); the entropy sums every observed entry,
// window included.
#include "kv/policy/eviction_policies.h"

namespace kvx::kv {
namespace {

class CakeScorer : public Scorer {
 public:
  CakeScorer(int window, int kernel, double gamma) : window_(window), kernel_(kernel), gamma_(gamma) {}
  std::string_view name() const override { return "cake"; }
  ObservationNeeds needs() const override {
    ObservationNeeds n;
    n.probabilities = true;
    n.query_window = window_;
    n.fold_window = window_;
    n.squares = true;
    n.entropy = true;
    return n;
  }
  void Score(const ScoringInput& in, std::vector<float>* scores) const override {
    const double gamma = gamma_;
    const auto indicator = [gamma](const HeadStats& s, int32_t p) {
      if (s.queries <= 0) return 0.0f;
      const double q = static_cast<double>(s.queries);
      const double mean = s.Sum(p) / q, sq = s.Sq(p) / q;
      return static_cast<float>(mean + gamma * std::max(0.0, sq - mean * mean));
    };
    GroupStat(in, GroupReduce::kMean, indicator, scores, kernel_, /*max_pool=*/false);
  }
  PolicyParams Parameters() const override {
    return {{"window", std::to_string(window_)}, {"kernel", std::to_string(kernel_)}, {"gamma", std::to_string(gamma_)}};
  }

 private:
  int window_, kernel_;
  double gamma_;
};

}  // namespace

static ScorerMethod CakeMethod() {
  EvictionConfig d;
  d.window = 32;
  d.sinks = 4;
  d.layers = "cake";
  d.continuous = false;
  return {"cake",
          [](PolicyParamReader& r) -> Result<std::unique_ptr<Scorer>> {
            int window = 32, kernel = 5;
            double gamma = 200.0;
            r.Int("window", &window, 1, 1 << 20).Int("kernel", &kernel, 1, 63).Double("gamma", &gamma, 0.0, 1e6);
            if (kernel % 2 == 0) return InvalidArgument("policy " + r.policy() + ": kernel must be odd, e.g. kernel=5");
            return std::unique_ptr<Scorer>(new CakeScorer(window, kernel, gamma));
          },
          d};
}

namespace {
const ScorerRegistrar kRegistered(CakeMethod());
}  // namespace

}  // namespace kvx::kv
