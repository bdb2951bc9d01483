#include "kv/policy/merge_fate.h"

#include <climits>
#include <cmath>
#include <vector>

#include "kv/policy/eviction_policies.h"
#include "kv/policy/scored_eviction.h"

namespace kvx::kv {

Result<std::unique_ptr<EvictionFate>> MergeFate::Create(PolicyParamReader& params) {
  auto f = std::make_unique<MergeFate>();
  std::string weight = "cos";
  params.Choice("merge_weight", &weight, {"cos", "gauss"}).Double("merge_ema", &f->ema_beta_, 0.0, 0.999);
  if (f->ema_beta_ > 0) {
    params.NotApplicable("merge_min_sim", "merge_ema sets the threshold");
  } else {
    params.Double("merge_min_sim", &f->min_sim_, -1.0, 1.0);
  }
  f->gauss_ = weight == "gauss";
  return std::unique_ptr<EvictionFate>(std::move(f));
}

PolicyParams MergeFate::Parameters() const {
  PolicyParams p = {{"merge_weight", gauss_ ? "gauss" : "cos"}};
  if (ema_beta_ > 0) {
    p["merge_ema"] = std::to_string(ema_beta_);
  } else {
    p["merge_min_sim"] = std::to_string(min_sim_);
  }
  return p;
}

void MergeFate::Forget(SeqId seq) {
  for (auto it = ema_.lower_bound({seq, INT_MIN, INT_MIN}); it != ema_.end() && std::get<0>(it->first) == seq;) {
    it = ema_.erase(it);
  }
}

double MergeFate::Threshold(SeqId seq, int layer, int kv_head, const std::vector<double>& best_sims) {
  if (ema_beta_ <= 0 || best_sims.empty()) return min_sim_;
  double mean = 0;
  for (double s : best_sims) mean += s;
  mean /= static_cast<double>(best_sims.size());
  auto [it, first] = ema_.try_emplace({seq, layer, kv_head}, mean);
  if (!first) it->second = ema_beta_ * it->second + (1 - ema_beta_) * mean;
  return it->second;
}

Status MergeFate::Apply(KVManager& manager, SeqId seq, int layer, int kv_head, const std::vector<int>& evicted,
                        const std::vector<int>& kept) {
  SequenceKV& kv = manager.kv(seq);
  if (!kept.empty() && !evicted.empty()) {
    const int D = kv.layout().head_dim;
    std::vector<float> k, v;
    std::vector<int32_t> pos;
    kv.ReadChain(layer, kv_head, &k, &v, &pos);
    auto key = [&](int slot) { return k.data() + static_cast<size_t>(slot) * D; };
    auto norm = [&](const float* x) {
      double s = 0;
      for (int c = 0; c < D; ++c) s += static_cast<double>(x[c]) * x[c];
      return std::sqrt(s);
    };
    std::vector<double> kept_norm(kept.size());
    for (size_t i = 0; i < kept.size(); ++i) kept_norm[i] = norm(key(kept[i]));
    // Each evicted entry's pivot (most similar kept key; ties: the earlier).
    struct Match {
      int e;
      size_t r;
      double cos, dist2;
    };
    std::vector<double> best(evicted.size(), -2.0);
    std::vector<size_t> best_r(evicted.size(), 0);
    for (size_t j = 0; j < evicted.size(); ++j) {
      const int e = evicted[j];
      const double ne = norm(key(e));
      for (size_t i = 0; i < kept.size(); ++i) {
        double dot = 0;
        for (int c = 0; c < D; ++c) dot += static_cast<double>(key(e)[c]) * key(kept[i])[c];
        const double cs = ne > 0 && kept_norm[i] > 0 ? dot / (ne * kept_norm[i]) : 0.0;
        if (cs > best[j]) best[j] = cs, best_r[j] = i;
      }
    }
    const double threshold = Threshold(seq, layer, kv_head, best);
    std::vector<Match> matches;
    for (size_t j = 0; j < evicted.size(); ++j) {
      if (best[j] < threshold) continue;  // dropped
      const int e = evicted[j];
      double d2 = 0;
      for (int c = 0; c < D; ++c) {
        const double d = static_cast<double>(key(e)[c]) - key(kept[best_r[j]])[c];
        d2 += d * d;
      }
      matches.push_back({e, best_r[j], best[j], d2});
    }
    double sigma2 = 0;
    for (const Match& m : matches) sigma2 += m.dist2;
    sigma2 = matches.empty() ? 1.0 : std::max(sigma2 / static_cast<double>(matches.size()), 1e-12);
    // Accumulate per pivot: its own row with weight 1, then the merged ones.
    std::vector<double> wsum(kept.size(), 0.0);
    std::vector<double> acc_k(kept.size() * D, 0.0), acc_v(kept.size() * D, 0.0);
    for (const Match& m : matches) {
      const double w = gauss_ ? std::exp(-m.dist2 / (2 * sigma2)) : (m.cos + 1) / 2;
      wsum[m.r] += w;
      for (int c = 0; c < D; ++c) {
        acc_k[m.r * D + c] += w * key(m.e)[c];
        acc_v[m.r * D + c] += w * v[static_cast<size_t>(m.e) * D + c];
      }
    }
    std::vector<int> slots;
    std::vector<float> new_k, new_v;
    for (size_t i = 0; i < kept.size(); ++i) {
      if (wsum[i] <= 0) continue;
      slots.push_back(kept[i]);
      for (int c = 0; c < D; ++c) {
        const size_t at = static_cast<size_t>(kept[i]) * D + c;
        new_k.push_back(static_cast<float>((k[at] + acc_k[i * D + c]) / (1 + wsum[i])));
        new_v.push_back(static_cast<float>((v[at] + acc_v[i * D + c]) / (1 + wsum[i])));
      }
    }
    if (!slots.empty()) KVX_RETURN_IF_ERROR(kv.RewriteEntries(layer, kv_head, slots, new_k.data(), new_v.data()));
    merged_ += static_cast<int64_t>(matches.size());
  }
  return kv.RemoveEntries(layer, kv_head, evicted);
}

namespace {
const FateRegistrar kFate("merge", MergeFate::Create);
const PolicyRegistrar kPolicy("kvmerger", ScoredPolicyFactory("kvmerger", "h2o", [](EvictionConfig& d) {
    d.fate = "merge";
  }));
}  // namespace

}  // namespace kvx::kv
