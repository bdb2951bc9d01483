#include "kv/policy/minicache.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <unordered_map>
#include <vector>

#include "kv/policy/params.h"

namespace kvx::kv {

double SlerpDirection(const float* x_a, const float* x_b, int d, double t, float* e) {
  double na = 0, nb = 0, dot = 0;
  for (int c = 0; c < d; ++c) {
    na += static_cast<double>(x_a[c]) * x_a[c];
    nb += static_cast<double>(x_b[c]) * x_b[c];
    dot += static_cast<double>(x_a[c]) * x_b[c];
  }
  na = std::sqrt(na);
  nb = std::sqrt(nb);
  if (na == 0 || nb == 0) {  // no direction to merge: the other one's (or none)
    const float* x = na == 0 ? x_b : x_a;
    const double n = na == 0 ? nb : na;
    for (int c = 0; c < d; ++c) e[c] = n == 0 ? 0.0f : static_cast<float>(x[c] / n);
    return 0.0;
  }
  const double cos_w = std::clamp(dot / (na * nb), -1.0, 1.0);
  const double w = std::acos(cos_w), sin_w = std::sin(w);
  // SLERP weights; near W = 0 (or pi) sin W vanishes and the normalised
  // linear interpolation is the limit (and the only defined choice).
  double wa = 1.0 - t, wb = t;
  if (sin_w > 1e-6) {
    wa = std::sin((1.0 - t) * w) / sin_w;
    wb = std::sin(t * w) / sin_w;
  }
  double n = 0;
  for (int c = 0; c < d; ++c) {
    const double y = wa * x_a[c] / na + wb * x_b[c] / nb;
    n += y * y;
  }
  n = std::sqrt(n);
  if (n < 1e-12) {  // opposite directions, t = 1/2: no interpolation exists; take the upper layer's
    for (int c = 0; c < d; ++c) e[c] = static_cast<float>(x_b[c] / nb);
    return w;
  }
  for (int c = 0; c < d; ++c) e[c] = static_cast<float>((wa * x_a[c] / na + wb * x_b[c] / nb) / n);
  return w;
}

Result<std::unique_ptr<KVPolicy>> MiniCachePolicy::Create(PolicyParamReader& r) {
  MiniCacheConfig c;
  std::string retain = "topk", mode = "once";
  r.Int("start", &c.start, 0, 1 << 16)
      .Double("t", &c.t, 0.0, 1.0)
      .Double("gamma", &c.gamma, 0.0, 1.0)
      .Choice("retain", &retain, {"topk", "range"})
      .Choice("mode", &mode, {"once", "continuous"});
  KVX_RETURN_IF_ERROR(r.error());
  if (mode == "continuous") {
    return InvalidArgument("policy minicache: mode=continuous is not implemented (merging new tokens as decode "
                           "goes); minicache merges at the compression moment (mode=once, e.g. kvx eval --compress "
                           "excluded|included), tokens appended later stay unmerged");
  }
  c.retain_range = retain == "range";
  return std::unique_ptr<KVPolicy>(new MiniCachePolicy(c));
}

PolicyParams MiniCachePolicy::Parameters() const {
  const MiniCacheConfig& c = config_;
  return {{"start", std::to_string(c.start)}, {"t", std::to_string(c.t)}, {"gamma", std::to_string(c.gamma)},
          {"retain", c.retain_range ? "range" : "topk"}, {"mode", "once"}};
}

namespace {
const PolicyRegistrar kRegistered("minicache", MiniCachePolicy::Create);
}  // namespace

Status MiniCachePolicy::CheckSpec(const ResolvedKVSpec& resolved) const {
  const KVSpec& spec = resolved.spec;
  const KVLayout& layout = resolved.layout;
  const int start = Start(layout.n_layers);
  if (start + 1 >= layout.n_layers) {
    return InvalidArgument("policy minicache: start=" + std::to_string(start) + " leaves no pair of adjacent layers in " +
                           "a model of " + std::to_string(layout.n_layers) + " layers; use start <= " +
                           std::to_string(layout.n_layers - 2));
  }
  for (const PolicySpec& p : spec.policies) {
    if (p.name == "quest") {
      return InvalidArgument("policy minicache does not combine with quest: page bounds would bound the shared "
                             "directions, not the per-layer scaled keys; use one of the two");
    }
  }
  const std::vector<LayerCodec>& layers = resolved.layers;
  for (int a = start; a + 1 < layout.n_layers; a += 2) {
    if (Status s = CanShareAcrossLayers(layers[a], layers[a + 1]); !s.ok()) {
      return InvalidArgument("policy minicache (layers " + std::to_string(a) + " and " + std::to_string(a + 1) +
                             "): " + s.message());
    }
  }
  return Status::Ok();
}

Status MiniCachePolicy::Compress(KVManager& manager, SeqId seq) {
  SequenceKV& kv = manager.kv(seq);
  const KVLayout& L = kv.layout();
  stats_ = MiniCacheStats{};
  for (int a = Start(L.n_layers); a + 1 < L.n_layers; a += 2) {
    for (int h = 0; h < L.n_kv_heads; ++h) KVX_RETURN_IF_ERROR(MergePair(kv, a, a + 1, h));
    ++stats_.pairs;
  }
  if (stats_.pairs > 0) manager.MarkEntriesRemoved(seq);  // the pages no longer hold the tokens as computed
  return Status::Ok();
}

Status MiniCachePolicy::MergePair(SequenceKV& kv, int a, int b, int kv_head) {
  const int D = kv.layout().head_dim;
  std::vector<float> k[2], v[2];
  std::vector<int32_t> pos[2];
  kv.ReadChain(a, kv_head, &k[0], &v[0], &pos[0]);
  kv.ReadChain(b, kv_head, &k[1], &v[1], &pos[1]);
  // Tokens both layers hold, matched by position (a position a layer holds
  // twice matches once; the rest stay that layer's own).
  std::unordered_map<int32_t, int> slot_b;
  for (int s = 0; s < static_cast<int>(pos[1].size()); ++s) {
    if (pos[1][s] != kDeadPosition) slot_b.emplace(pos[1][s], s);
  }
  struct Match {
    int sa, sb;
    double delta;
  };
  std::vector<Match> matches;
  std::vector<uint8_t> matched_b(pos[1].size(), 0);
  std::vector<float> ek(static_cast<size_t>(pos[0].size()) * D), ev(ek.size());
  for (int s = 0; s < static_cast<int>(pos[0].size()); ++s) {
    if (pos[0][s] == kDeadPosition) continue;
    auto it = slot_b.find(pos[0][s]);
    if (it == slot_b.end() || matched_b[it->second]) continue;
    const int sb = it->second;
    matched_b[sb] = 1;
    const size_t oa = static_cast<size_t>(s) * D, ob = static_cast<size_t>(sb) * D;
    const double wk = SlerpDirection(&k[0][oa], &k[1][ob], D, config_.t, &ek[oa]);
    const double wv = SlerpDirection(&v[0][oa], &v[1][ob], D, config_.t, &ev[oa]);
    matches.push_back({s, sb, std::max(wk, wv) / std::numbers::pi});
  }
  // Retention: the matched tokens whose directions differ most stay exact.
  std::vector<uint8_t> retained(matches.size(), 0);
  if (!matches.empty()) {
    if (config_.retain_range) {
      double lo = matches[0].delta, hi = lo;
      for (const Match& m : matches) lo = std::min(lo, m.delta), hi = std::max(hi, m.delta);
      const double threshold = lo + (hi - lo) * config_.gamma;
      for (size_t i = 0; i < matches.size(); ++i) retained[i] = matches[i].delta > threshold;
    } else {
      const size_t n_keep = std::min(matches.size(), static_cast<size_t>(std::ceil(config_.gamma * matches.size() - 1e-9)));
      std::vector<size_t> order(matches.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::partial_sort(order.begin(), order.begin() + n_keep, order.end(),
                        [&](size_t x, size_t y) { return matches[x].delta > matches[y].delta; });
      for (size_t i = 0; i < n_keep; ++i) retained[order[i]] = 1;
    }
  }
  // The shared run (directions, per-layer norms) and each layer's own slots.
  SequenceKV::SharedEntries shared;
  std::vector<int> keep_a, keep_b;
  std::vector<uint8_t> merged_a(pos[0].size(), 0), merged_b(pos[1].size(), 0);
  auto norm = [&](const std::vector<float>& x, int s) {
    double n = 0;
    for (int c = 0; c < D; ++c) n += static_cast<double>(x[static_cast<size_t>(s) * D + c]) * x[static_cast<size_t>(s) * D + c];
    return static_cast<float>(std::sqrt(n));
  };
  for (size_t i = 0; i < matches.size(); ++i) {
    if (retained[i]) {
      ++stats_.retained;
      continue;
    }
    const Match& m = matches[i];
    merged_a[m.sa] = merged_b[m.sb] = 1;
    shared.pos.push_back(pos[0][m.sa]);
    const size_t o = static_cast<size_t>(m.sa) * D;
    shared.k.insert(shared.k.end(), ek.begin() + o, ek.begin() + o + D);
    shared.v.insert(shared.v.end(), ev.begin() + o, ev.begin() + o + D);
    shared.k_scale[0].push_back(norm(k[0], m.sa));
    shared.v_scale[0].push_back(norm(v[0], m.sa));
    shared.k_scale[1].push_back(norm(k[1], m.sb));
    shared.v_scale[1].push_back(norm(v[1], m.sb));
  }
  stats_.merged += static_cast<int64_t>(shared.pos.size());
  for (int s = 0; s < static_cast<int>(pos[0].size()); ++s) {
    if (pos[0][s] != kDeadPosition && !merged_a[s]) keep_a.push_back(s);
  }
  for (int s = 0; s < static_cast<int>(pos[1].size()); ++s) {
    if (pos[1][s] != kDeadPosition && !merged_b[s]) keep_b.push_back(s);
  }
  return kv.ShareEntries(a, b, kv_head, shared, keep_a, keep_b);
}

}  // namespace kvx::kv
