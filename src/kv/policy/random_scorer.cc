// Random baseline (kvpress RandomPress): every entry gets a random score
// from a seeded hash of (seed, layer, kv head, position), so a run is
// reproducible and heads evict independently. The floor every method must
// beat; no sinks or window by default.
#include "kv/policy/eviction_policies.h"

namespace kvx::kv {
namespace {

uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class RandomScorer : public Scorer {
 public:
  explicit RandomScorer(uint64_t seed) : seed_(seed) {}
  std::string_view name() const override { return "random"; }
  ObservationNeeds needs() const override { return ObservationNeeds{}; }
  void Score(const ScoringInput& in, std::vector<float>* scores) const override {
    scores->resize(in.positions.size());
    const uint64_t base = Mix(Mix(seed_) ^ (static_cast<uint64_t>(in.layer) << 32 | static_cast<uint32_t>(in.kv_head)));
    for (size_t i = 0; i < in.positions.size(); ++i) {
      (*scores)[i] = static_cast<float>(Mix(base ^ static_cast<uint32_t>(in.positions[i])) >> 40) / 16777216.0f;
    }
  }
  PolicyParams Parameters() const override { return {{"seed", std::to_string(seed_)}}; }

 private:
  uint64_t seed_;
};

}  // namespace

static ScorerMethod RandomMethod() {
  EvictionConfig d;
  d.window = 0;
  d.sinks = 0;
  return {"random",
          [](PolicyParamReader& r) -> Result<std::unique_ptr<Scorer>> {
            int seed = 0;
            r.Int("seed", &seed, 0, 1 << 30);
            return std::unique_ptr<Scorer>(new RandomScorer(static_cast<uint64_t>(seed)));
          },
          d};
}

namespace {
const ScorerRegistrar kRegistered(RandomMethod());
}  // namespace

}  // namespace kvx::kv
