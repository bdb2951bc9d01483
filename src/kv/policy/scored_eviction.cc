#include "kv/policy/scored_eviction.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "kv/policy/budget.h"
#include "kv/sequence_kv.h"

namespace kvx::kv {
namespace {

// Live entries of (l, h) a pass may select from: demoted entries (fate=demote,
// page_table.h) were evicted already; they are neither scored nor counted
// against the budget again.
int Selectable(const SequenceKV& kv, int l, int h) {
  return kv.LiveEntries(l, h) - kv.LiveEntriesIn(l, h, kPageDemoted);
}

// Pool bytes of (l, h)'s pages, each at its own size class.
size_t TableBytes(const SequenceKV& kv, int l, int h) {
  size_t bytes = 0;
  for (PageId id : kv.table(l, h).pages()) bytes += kv.pool().PageBytesOf(id);
  return bytes;
}

}  // namespace

Status ReadEvictionConfig(PolicyParamReader& r, EvictionConfig* c) {
  const bool has_ratio = r.Has("ratio"), has_budget = r.Has("budget");
  if (has_ratio && has_budget) {
    return InvalidArgument("policy " + r.policy() + ": give ratio= (fraction removed) or budget= (entries kept per "
                           "head), not both");
  }
  std::string mode = c->continuous ? "continuous" : "once";
  const double default_compact = c->compact;
  r.Double("ratio", &c->ratio, 0.0, 0.999)
      .Int("budget", &c->budget, 1, 1 << 24)
      .Int("window", &c->window, 0, 1 << 20)
      .Int("sinks", &c->sinks, 0, 1 << 20)
      .Choice("mode", &mode, {"once", "continuous"})
      .Choice("layers", &c->layers, {"uniform", "pyramid", "cake"})
      .Choice("heads", &c->heads, {"uniform", "adakv"})
      .Double("compact", &c->compact, 0.0, 1.0);
  // The allocations' own knobs are read only where they act.
  if (c->layers == "pyramid") {
    r.Double("beta", &c->beta, 1.0, 1e6);
  } else {
    r.NotApplicable("beta", "only layers=pyramid uses it; layers=" + c->layers);
  }
  if (c->layers == "cake") {
    r.Double("tau1", &c->tau1, 0.01, 100.0).Double("tau2", &c->tau2, 0.01, 100.0);
  } else {
    r.NotApplicable("tau1", "only layers=cake uses it; layers=" + c->layers);
    r.NotApplicable("tau2", "only layers=cake uses it; layers=" + c->layers);
  }
  if (c->heads == "adakv") {
    r.Double("alpha", &c->alpha, 0.0, 1.0);
  } else {
    r.NotApplicable("alpha", "only heads=adakv uses it; heads=" + c->heads);
  }
  std::string fate = c->fate;
  // The fate name is free text here; the registry checks it.
  if (r.Has("fate")) {
    std::vector<std::string> names = EvictionFateRegistry::Global().Names();
    r.Choice("fate", &fate, names);
  }
  c->fate = fate;
  c->continuous = mode == "continuous";
  if (c->continuous && !r.Has("compact")) c->compact = std::min(default_compact, 0.75);
  if (r.Has("window")) c->window_fraction = 0.0;
  if (has_budget && c->budget < c->sinks + (c->window_fraction > 0 ? 0 : c->window)) {
    return InvalidArgument("policy " + r.policy() + ": budget=" + std::to_string(c->budget) +
                           " cannot hold sinks + window = " + std::to_string(c->sinks + c->window) +
                           " protected entries; raise budget or lower window/sinks");
  }
  return Status::Ok();
}

Result<std::unique_ptr<KVPolicy>> ScoredEvictionPolicy::Create(std::string name, PolicyParamReader& r,
                                                               const EvictionConfig& defaults,
                                                               const ScorerFactory& make_scorer) {
  std::unique_ptr<ScoredEvictionPolicy> p(new ScoredEvictionPolicy());
  p->name_ = std::move(name);
  p->config_ = defaults;
  KVX_ASSIGN_OR_RETURN(p->scorer_, make_scorer(r));
  KVX_RETURN_IF_ERROR(ReadEvictionConfig(r, &p->config_));
  KVX_ASSIGN_OR_RETURN(p->fate_, EvictionFateRegistry::Global().Create(p->config_.fate, r));
  ObservationNeeds needs = p->scorer_->needs();
  needs.single_queries = p->config_.continuous;
  if (p->config_.layers == "cake") {
    // CAKE's layer preferences need the attention's entropy and variance:
    // recorded for any scorer that observes attention at all.
    if (!needs.probabilities) {
      return InvalidArgument("policy " + p->name_ + ": layers=cake allocates by attention entropy and variance, and " +
                             std::string(p->scorer_->name()) +
                             " observes no attention; use layers=uniform or pyramid, or a scorer that observes "
                             "attention (snapkv, h2o, tova, ...)");
    }
    needs.squares = needs.entropy = true;
  }
  if (needs.probabilities) p->recorder_ = std::make_unique<ProbabilityRecorder>(needs);
  return std::unique_ptr<KVPolicy>(std::move(p));
}

PolicyParams ScoredEvictionPolicy::Parameters() const {
  PolicyParams p = scorer_->Parameters();
  const EvictionConfig& c = config_;
  auto number = [](double x) {
    std::ostringstream m;
    m << x;
    return m.str();
  };
  p["scorer"] = std::string(scorer_->name());
  p["ratio"] = number(c.ratio);
  p["budget"] = std::to_string(c.budget);
  p["window"] = c.window_fraction > 0 ? number(c.window_fraction) + " of the kept" : std::to_string(c.window);
  p["sinks"] = std::to_string(c.sinks);
  p["mode"] = c.continuous ? "continuous" : "once";
  p["layers"] = c.layers;
  p["heads"] = c.heads;
  p["compact"] = number(c.compact);
  p["fate"] = c.fate;
  if (c.layers == "pyramid") p["beta"] = number(c.beta);
  if (c.layers == "cake") p["tau1"] = number(c.tau1), p["tau2"] = number(c.tau2);
  if (c.heads == "adakv") p["alpha"] = number(c.alpha);
  for (const auto& [k, v] : fate_->Parameters()) p[k] = v;
  return p;
}

Status ScoredEvictionPolicy::CheckSpec(const ResolvedKVSpec& resolved) const {
  return fate_->CheckSpec(resolved);
}

int ScoredEvictionPolicy::Capacity(int tokens) const {
  if (config_.budget > 0) return config_.budget;
  return static_cast<int>(std::ceil((1.0 - config_.ratio) * tokens - 1e-9));
}

Status ScoredEvictionPolicy::OnStepCommitted(KVManager& manager, SeqId seq) {
  if (recorder_ != nullptr) recorder_->FoldStep(manager, seq);
  return config_.continuous ? Evict(manager, seq) : Status::Ok();
}

Status ScoredEvictionPolicy::Compress(KVManager& manager, SeqId seq) { return Evict(manager, seq); }

void ScoredEvictionPolicy::OnSequenceReleased(SeqId seq) {
  if (recorder_ != nullptr) recorder_->Forget(seq);
  fate_->Forget(seq);
}

std::vector<double> ScoredEvictionPolicy::CakePreferences(const SequenceObservations* obs, int n_layers) const {
  std::vector<double> pref(n_layers, 1.0);
  if (obs == nullptr) return pref;
  for (int l = 0; l < n_layers; ++l) {
    double entropy = 0.0, variance = 0.0;
    for (int h = 0; h < obs->n_heads(); ++h) {
      const HeadStats* hs = obs->head(l, h);
      if (hs == nullptr || hs->queries <= 0) continue;
      entropy += hs->entropy;
      const double q = hs->queries;
      for (size_t j = 0; j < hs->sum.size(); ++j) {
        const double mean = hs->sum[j] / q, sq = j < hs->sq.size() ? hs->sq[j] / q : 0.0;
        variance += std::max(0.0, sq - mean * mean);
      }
    }
    pref[l] = std::pow(std::max(entropy, 1e-12), 1.0 / config_.tau1) * std::pow(std::max(variance, 1e-12), 1.0 / config_.tau2);
  }
  return pref;
}

Status ScoredEvictionPolicy::Evict(KVManager& manager, SeqId seq) {
  SequenceKV& kv = manager.kv(seq);
  const KVLayout& L = kv.layout();
  const int H = L.n_kv_heads, T = L.page_tokens;
  const int capacity = Capacity(manager.length(seq));
  const int window = config_.window_fraction > 0 ? static_cast<int>(config_.window_fraction * capacity) : config_.window;
  const int w = config_.sinks + window;
  const SequenceObservations* obs = recorder_ != nullptr ? recorder_->Find(seq) : nullptr;
  stats_ = EvictionStats{};
  int most_live = 0;
  for (int l = 0; l < L.n_layers; ++l) {
    for (int h = 0; h < H; ++h) most_live = std::max(most_live, Selectable(kv, l, h));
  }
  const int cap = std::max(capacity, std::min(w, most_live));
  if (config_.layers == "pyramid") {
    stats_.layer_budget = PyramidBudgets(L.n_layers, cap, most_live, std::min(w, cap), config_.beta);
  } else if (config_.layers == "cake") {
    stats_.layer_budget = PreferenceBudgets(CakePreferences(obs, L.n_layers), cap, most_live, std::min(w, cap));
  } else {
    stats_.layer_budget.assign(L.n_layers, cap);
  }
  const bool adaptive = config_.heads == "adakv";
  bool removed = false;
  std::vector<float> k_unused;
  for (int l = 0; l < L.n_layers; ++l) {
    const int budget = stats_.layer_budget[l];
    int layer_live = 0;
    bool over = false;
    for (int h = 0; h < H; ++h) {
      layer_live += Selectable(kv, l, h);
      over = over || Selectable(kv, l, h) > budget;
    }
    if (adaptive ? layer_live <= budget * H : !over) continue;
    // Live slots per head, chain order, split into protected and candidates.
    std::vector<std::vector<int>> slots(H), prot(H);
    std::vector<std::vector<int32_t>> pos(H);
    std::vector<std::vector<float>> scores(H);
    std::vector<int> keep(H);
    for (int h = 0; h < H; ++h) {
      const PageTable& t = kv.table(l, h);
      std::vector<int> live;
      std::vector<int32_t> live_pos;
      for (int p = 0; p < t.num_pages(); ++p) {
        if (t.format(p) == kPageDemoted) continue;
        const int32_t* pp = PagePositions(kv.pool().PageData(t.pages()[p]));
        for (int s = 0; s < t.EntriesInPage(p, T); ++s) {
          if (pp[s] == kDeadPosition) continue;
          live.push_back(p * T + s);
          live_pos.push_back(pp[s]);
        }
      }
      const int n = static_cast<int>(live.size());
      const int n_sinks = std::min(config_.sinks, n), n_window = std::min(window, n - n_sinks);
      for (int i = 0; i < n; ++i) {
        if (i < n_sinks || i >= n - n_window) {
          prot[h].push_back(live[i]);
        } else {
          slots[h].push_back(live[i]);
          pos[h].push_back(live_pos[i]);
        }
      }
      keep[h] = std::max(0, budget - n_sinks - n_window);
      if (!adaptive && static_cast<int>(slots[h].size()) <= keep[h]) continue;  // nothing to score
      scorer_->Score(ScoringInput{kv, obs, l, h, slots[h], pos[h]}, &scores[h]);
    }
    for (int h = 0; h < H; ++h) {
      if (scores[h].size() != slots[h].size()) scores[h].assign(slots[h].size(), 0.0f);
    }
    const auto kept = SelectKept(scores, pos, keep, adaptive, config_.alpha);
    for (int h = 0; h < H; ++h) {
      std::vector<int> evicted, stay = prot[h];
      for (size_t i = 0; i < slots[h].size(); ++i) (kept[h][i] ? stay : evicted).push_back(slots[h][i]);
      if (evicted.empty()) continue;
      std::sort(stay.begin(), stay.end());
      const bool allocates = fate_->allocates();
      const size_t bytes_before = allocates ? TableBytes(kv, l, h) : 0;
      if (Status st = fate_->Apply(manager, seq, l, h, evicted, stay); !st.ok()) {
        // Heads done so far stay evicted: the sequence must say so.
        if (removed) manager.MarkEntriesRemoved(seq);
        return st;
      }
      stats_.evicted += static_cast<int64_t>(evicted.size());
      removed = true;
      const PageTable& t = kv.table(l, h);
      const double fill = t.num_pages() == 0 ? 1.0 : static_cast<double>(t.live()) / (static_cast<double>(t.num_pages()) * T);
      // A fate that allocates (demote: the evicted move to new low-bit pages)
      // leaves its sources partly live; under the threshold alone, an
      // eviction could then hold more than it did before (MiKV on int2 or
      // kivi layers, where a demoted entry saves little). Compacting then,
      // whatever the threshold, keeps an eviction from ever growing a table
      // it can shrink; in continuous mode it costs one compaction per new
      // demoted page, not one per step.
      if (fill < config_.compact || (allocates && TableBytes(kv, l, h) > bytes_before)) {
        const int before = t.num_pages();
        if (Status st = kv.Compact(l, h); !st.ok()) {
          manager.MarkEntriesRemoved(seq);
          return st;
        }
        if (kv.table(l, h).num_pages() < before) ++stats_.compactions;
      }
    }
  }
  if (removed) manager.MarkEntriesRemoved(seq);
  stats_.kept.resize(static_cast<size_t>(L.n_layers) * H);
  for (int l = 0; l < L.n_layers; ++l) {
    for (int h = 0; h < H; ++h) stats_.kept[static_cast<size_t>(l) * H + h] = Selectable(kv, l, h);
  }
  return Status::Ok();
}

uint64_t ScoredEvictionPolicy::CompressionHeadroomBytes(const ResolvedKVSpec& resolved) const {
  const int n_ctx = resolved.n_ctx;
  const int64_t evicted = config_.budget > 0 ? std::max<int64_t>(0, n_ctx - config_.budget)
                                             : static_cast<int64_t>(std::ceil(config_.ratio * n_ctx));
  // Compaction writes a run's new pages before it frees the run's sources
  // (SequenceKV::Compact): a pool the prompt filled needs that run free.
  const uint64_t compaction = SequenceKV::kCompactRunPages * static_cast<uint64_t>(PageBytes(resolved.layers));
  return fate_->HeadroomBytes(resolved.layout, evicted) + compaction;
}

double ScoredEvictionPolicy::KeptBytesPerToken(const ResolvedKVSpec& resolved, int tokens,
                                               double bytes_per_token) const {
  // As Evict: the capacity, never below the protected entries.
  const int capacity = Capacity(tokens);
  const int window = config_.window_fraction > 0 ? static_cast<int>(config_.window_fraction * capacity) : config_.window;
  const int kept = std::min(tokens, std::max(capacity, config_.sinks + window));
  const double evicted = static_cast<double>(tokens - kept) / tokens;
  return bytes_per_token * (1.0 - evicted) + fate_->BytesPerEvictedToken(resolved.layout) * evicted;
}

std::optional<int> ScoredEvictionPolicy::prompt_window() const {
  if (config_.continuous) return std::nullopt;
  const ObservationNeeds needs = scorer_->needs();
  if (!needs.probabilities) return 0;
  // A call of at least fold_window queries replaces the statistics
  // (SequenceObservations::Fold), and the recorder sees its last
  // query_window: equal windows make the last such call decide.
  if (needs.fold_window > 0 && needs.query_window == needs.fold_window) return needs.fold_window;
  return std::nullopt;
}

double LiveEntryFraction(const SequenceKV& kv) {
  const KVLayout& L = kv.layout();
  int64_t live = 0, slots = 0;
  for (int l = 0; l < L.n_layers; ++l) {
    for (int h = 0; h < L.n_kv_heads; ++h) {
      live += kv.LiveEntries(l, h);
      slots += static_cast<int64_t>(kv.table(l, h).num_pages()) * L.page_tokens;
    }
  }
  return slots == 0 ? 1.0 : static_cast<double>(live) / static_cast<double>(slots);
}

}  // namespace kvx::kv
