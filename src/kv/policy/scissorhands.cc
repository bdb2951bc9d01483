// Scissorhands (Liu et al., 2023; METHODS.md B3): "persistence of
// importance". Over a history of the last `history` queries, count per
// entry how often its attention was low (below 1/visible entries); entries
// with the most low hits go first. kvx: the history is the recorder's
// sliding window (observations.h); the GQA group is combined with the
// minimum count (an entry stays if any head of the group needs it: the
// safe choice, METHODS.md), ties broken by the attention received;
// continuous by default (the paper holds a fixed budget during decode; it
// drops every m steps, kvx at every step). ring=1 keeps the paper's exact
// history window (the last `history` queries' statistics, ~history * n
// floats per head) instead of the recorder's exponential blend; the two
// differ only after steps shorter than the history (decode steps, a
// question), so only in continuous mode.
#include "kv/policy/eviction_policies.h"

namespace kvx::kv {
namespace {

class ScissorhandsScorer : public Scorer {
 public:
  ScissorhandsScorer(int history, bool ring) : history_(history), ring_(ring) {}
  std::string_view name() const override { return "scissorhands"; }
  ObservationNeeds needs() const override {
    ObservationNeeds n;
    n.probabilities = true;
    n.query_window = history_;
    n.fold_window = history_;
    n.low_hits = true;
    n.exact_window = ring_;
    return n;
  }
  void Score(const ScoringInput& in, std::vector<float>* scores) const override {
    std::vector<float> attention;
    GroupStat(in, GroupReduce::kMin, [](const HeadStats& s, int32_t p) { return s.Low(p); }, scores);
    GroupStat(in, GroupReduce::kMax, [](const HeadStats& s, int32_t p) { return s.Sum(p); }, &attention);
    // The attention over the history is < history + 1: it only breaks ties of whole counts.
    for (size_t i = 0; i < scores->size(); ++i) (*scores)[i] = -(*scores)[i] + attention[i] / (history_ + 1.0f);
  }
  PolicyParams Parameters() const override {
    return {{"history", std::to_string(history_)}, {"ring", ring_ ? "1" : "0"}};
  }

 private:
  int history_;
  bool ring_;
};

}  // namespace

static ScorerMethod ScissorhandsMethod() {
  EvictionConfig d;
  d.window = 32;
  d.sinks = 4;
  d.continuous = true;
  return {"scissorhands",
          [](PolicyParamReader& r) -> Result<std::unique_ptr<Scorer>> {
            int history = 32;
            bool ring = false;
            r.Int("history", &history, 1, 4096).Bool("ring", &ring);
            return std::unique_ptr<Scorer>(new ScissorhandsScorer(history, ring));
          },
          d};
}

namespace {
const ScorerRegistrar kRegistered(ScissorhandsMethod());
}  // namespace

}  // namespace kvx::kv
