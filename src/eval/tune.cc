// RunTune: the budget filter, successive halving, the per-layer descent and
// the validation of tune.h.
#include "eval/tune.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>

#include "engine/engine.h"
#include "engine/session.h"
#include "eval/eval_ppl.h"
#include "eval/plots.h"
#include "kv/policy/policy.h"
#include "kv/resolved_spec.h"
#include "kv/sequence_kv.h"
#include "util/clock.h"

namespace kvx::eval {
namespace {

std::string Human(uint64_t b) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%llu bytes (%.2f MiB)", static_cast<unsigned long long>(b), b / 1048576.0);
  return buf;
}

// The bit widths a layer's keys or values step through.
constexpr int kWidths[] = {2, 4, 8};

int NextWidth(int bits, int step) {
  const int* at = std::find(std::begin(kWidths), std::end(kWidths), bits);
  if (at == std::end(kWidths)) return 0;
  const long i = (at - std::begin(kWidths)) + step;
  return i >= 0 && i < static_cast<long>(std::size(kWidths)) ? kWidths[i] : 0;
}

// One per-layer move: layer `layer`'s keys (or values) to `bits`, and the
// KLD change it caused alone.
struct LayerMove {
  int layer = 0;
  bool keys = true;
  int bits = 0;
  double delta = 0;
};

// `base` with every move applied (per-layer bits.L overrides).
kv::KVSpec WithMoves(const kv::KVSpec& base, int n_layers, std::span<const LayerMove> moves) {
  const int k = base.codec.k_bits > 0 ? base.codec.k_bits : kv::DefaultBits(base.codec.id);
  const int v = base.codec.v_bits > 0 ? base.codec.v_bits : kv::DefaultBits(base.codec.id);
  std::vector<std::pair<int, int>> bits(static_cast<size_t>(n_layers), {k, v});
  for (const LayerMove& m : moves) (m.keys ? bits[m.layer].first : bits[m.layer].second) = m.bits;
  kv::KVSpec out = base;
  out.codec.layer_bits.clear();
  for (int l = 0; l < n_layers; ++l) {
    if (bits[l] == std::make_pair(k, v)) continue;
    kv::LayerBits lb;
    lb.first = lb.last = l;
    lb.k_bits = bits[l].first;
    lb.v_bits = bits[l].second;
    out.codec.layer_bits.push_back(lb);
  }
  return out;
}

class Tuner {
 public:
  Tuner(const model::Model& model, ThreadPool* threads, std::span<const int32_t> text, const TuneOptions& options,
        const TuneHooks& hooks)
      : model_(model), threads_(threads), text_(text), opt_(options), hooks_(hooks), layout_(model.KVLayoutFor(16)) {}

  Result<TuneResult> Run() {
    start_ = util::MonotonicSeconds();
    KVX_RETURN_IF_ERROR(Check());
    KVX_RETURN_IF_ERROR(Filter());
    PlanRungs();
    std::vector<int> alive(result_.candidates.size());
    for (size_t i = 0; i < alive.size(); ++i) alive[i] = static_cast<int>(i);
    SetProgressTotal(alive.size());
    for (size_t r = 0; r < rungs_.size() && !Stopped(); ++r) {
      Measure(alive, r);
      if (Stopped()) break;
      result_.rungs = static_cast<int>(r) + 1;
      Rank(&alive, r);
      if (r + 1 < rungs_.size()) {
        const size_t keep = std::max<size_t>(opt_.finalists, (alive.size() + opt_.eta - 1) / opt_.eta);
        if (alive.size() > keep) alive.resize(keep);
      } else if (alive.size() > static_cast<size_t>(opt_.finalists)) {
        alive.resize(opt_.finalists);
      }
      Choose();
    }
    // The finalists are validated before the descent, so a search stopped
    // in the descent still reports them on unseen text.
    if (!Stopped()) Validate(alive);
    if (!Stopped() && !alive.empty()) Descend(&alive);
    if (!Stopped() && !alive.empty() && !opt_.retrieval.tasks.empty()) {
      Status s = Retrieve(&alive);
      if (!s.ok()) return s;
    }
    result_.finalists = alive;
    Choose();
    result_.seconds = util::MonotonicSeconds() - start_;
    Notify();
    return std::move(result_);
  }

 private:
  struct Rung {
    int chunk = 0, n_chunks = 0;
  };

  Status Check() {
    if (opt_.ctx < 16) return InvalidArgument("--ctx must be at least 16 tokens");
    if (opt_.sessions < 1) return InvalidArgument("--sessions must be at least 1");
    if (opt_.mem_bytes == 0) return InvalidArgument("--mem must be a positive size, e.g. --mem 64M");
    if (opt_.finalists < 1 || opt_.eta < 2 || opt_.batch < 1 || opt_.first_chunk < 16 ||
        (opt_.max_chunk > 0 && opt_.max_chunk < opt_.first_chunk)) {
      return InvalidArgument("tune: finalists >= 1, eta >= 2, batch >= 1 and 16 <= first chunk <= max chunk");
    }
    if (opt_.max_kld && !(*opt_.max_kld > 0)) return InvalidArgument("--quality kld<=X needs X > 0");
    RetrievalSettings& rs = opt_.retrieval;
    for (Task t : rs.tasks) {
      if (std::find(std::begin(kRetrievalTasks), std::end(kRetrievalTasks), t) == std::end(kRetrievalTasks)) {
        return InvalidArgument("--tasks takes retrieval tasks (passkey, needle, niah_*, vt, lines), not " +
                               std::string(TaskName(t)) + ": tune measures KLD itself");
      }
    }
    if (rs.trials < 1) return InvalidArgument("--retrieval-trials must be at least 1");
    const int trained = model_.config().n_ctx_train;
    if (rs.length == 0) rs.length = trained > 0 ? std::min(opt_.ctx, trained) : opt_.ctx;
    const int64_t need = TuneTextTokens(opt_);
    if (static_cast<int64_t>(text_.size()) < need) {
      return InvalidArgument("the text has " + std::to_string(text_.size()) + " tokens; tune needs " +
                             std::to_string(need) + " (the search's chunks and as many unseen tokens to validate " +
                             "on): give a longer text (-f) or a smaller --max-chunk");
    }
    return Status::Ok();
  }

  // Every spec of the space that resolves for this model, sized; the ones
  // that fit become candidates. None fits: the error names the smallest.
  Status Filter() {
    const std::vector<std::string> space = opt_.space.empty() ? DefaultTuneSpace(opt_.heads) : opt_.space;
    const Result<uint64_t> f16 = SteadyStateBytes(kv::KVSpec{}, layout_, opt_.ctx, opt_.sessions);
    result_.f16_bytes = f16.ok() ? *f16 : 0;
    std::string smallest;
    uint64_t smallest_bytes = UINT64_MAX;
    for (const std::string& text : space) {
      Result<kv::KVSpec> spec = kv::ParseKVSpec(text);
      if (!spec.ok()) return spec.status().WithContext("tune space");
      Result<uint64_t> bytes = SteadyStateBytes(*spec, layout_, opt_.ctx, opt_.sessions);
      if (!bytes.ok()) continue;  // not for this model (a group wider than its heads, ThinK on KIVI...)
      result_.space_size++;
      if (*bytes < smallest_bytes) smallest_bytes = *bytes, smallest = spec->ToString();
      if (*bytes > opt_.mem_bytes) continue;
      TuneCandidate c;
      c.spec = spec->ToString();
      c.origin = "space";
      c.family = Family(*spec);
      c.defaults = text.find_first_of(",;") == std::string::npos;
      c.bytes = *bytes;
      // A bare codec=X may be a setting the space also names in full.
      auto same = std::find_if(result_.candidates.begin(), result_.candidates.end(),
                               [&](const TuneCandidate& o) { return o.spec == c.spec; });
      if (same != result_.candidates.end()) {
        same->defaults = same->defaults || c.defaults;
        continue;
      }
      result_.candidates.push_back(std::move(c));
    }
    if (result_.space_size == 0) return InvalidArgument("tune: no spec of the space resolves for this model");
    if (result_.candidates.empty()) {
      return InvalidArgument("no KV spec fits --mem " + Human(opt_.mem_bytes) + " for " +
                             std::to_string(opt_.sessions) + " session(s) x " + std::to_string(opt_.ctx) +
                             " tokens: the smallest, --kv '" + smallest + "', needs " + Human(smallest_bytes) +
                             "; raise --mem to at least that, or lower --ctx or --sessions");
    }
    return Status::Ok();
  }

  void PlanRungs() {
    const int last = opt_.LastChunk();
    std::vector<kv::KVSpec> specs;
    for (const TuneCandidate& c : result_.candidates) specs.push_back(*kv::ParseKVSpec(c.spec));
    for (int c = Rung0Chunk(specs, layout_, opt_);; c = std::min(c * 2, last)) {
      rungs_.push_back(Rung{c, rungs_.empty() ? 1 : 2});
      if (c == last) break;
    }
  }

  void SetProgressTotal(size_t n) {
    if (!hooks_.progress) return;
    double weight = 0;
    int64_t items = 0;
    for (const Rung& r : rungs_) {
      weight += static_cast<double>(n) * r.chunk * r.n_chunks;
      items += static_cast<int64_t>(n) * r.n_chunks;
      n = std::max<size_t>(opt_.finalists, (n + opt_.eta - 1) / opt_.eta);
    }
    // Retrieval: every prompt for f16 and the finalist that holds (one more
    // for one rejected), or with compare_retrieval the finalists (and the
    // descent's result) and the three compared specs; the actual sum set as
    // each spec runs.
    if (!opt_.retrieval.tasks.empty()) {
      const int specs = opt_.compare_retrieval ? opt_.finalists + 5 : 3;
      const int64_t prompts = static_cast<int64_t>(opt_.retrieval.Prompts()) * specs;
      items += prompts;
      weight += static_cast<double>(prompts) * opt_.retrieval.length;
    }
    hooks_.progress->SetTotal(items, weight);
  }

  bool Stopped() {
    if (result_.stopped) return true;
    if (hooks_.stop) {
      std::string why = hooks_.stop();
      if (!why.empty()) result_.stopped = true, result_.stop_reason = std::move(why);
    }
    return result_.stopped;
  }

  // KLD of `specs` against f32 on n_chunks chunks of `text`, in passes of
  // opt_.batch specs (each pass runs the baseline again); store(i, measure)
  // receives each spec's, and after each pass the best so far is chosen
  // again (and reported). Stops between passes; the unmeasured get nothing.
  using Store = std::function<void(size_t, const TuneMeasure&)>;
  void MeasureSpecs(const std::vector<std::string>& specs, std::span<const int32_t> text, int chunk, int n_chunks,
                    const std::string& label, const Store& store) {
    EvalOptions eo;
    eo.tasks = {Task::kKld};
    eo.chunk = chunk;
    eo.always_split = true;
    const uint64_t f16_per_token = 2ull * 2ull * layout_.n_layers * layout_.n_kv_heads * layout_.head_dim;
    for (size_t at = 0; at < specs.size(); at += static_cast<size_t>(opt_.batch)) {
      if (Stopped()) break;
      const size_t end = std::min(specs.size(), at + static_cast<size_t>(opt_.batch));
      std::vector<std::unique_ptr<engine::Engine>> engines;
      std::vector<std::unique_ptr<engine::Session>> sessions;
      std::vector<EvalRun> runs;
      std::vector<std::string> errors;
      for (size_t i = at; i <= end; ++i) {  // runs[0]: the f32 baseline
        engine::EngineOptions so;
        // Room for a few pages more than the chunk: a sealed codec without
        // a residual window sizes a pool for 1-2 pages below its one-token
        // minimum and refuses it (kvx run -c 64 --kv codec=kivi2,page=32,
        // residual=0); a larger pool only reserves address space.
        so.n_ctx = std::max(chunk, std::min(1024, model_.config().n_ctx_train));
        so.kv_spec = *kv::ParseKVSpec(i == at ? "codec=f32" : specs[i - 1]);
        Result<std::unique_ptr<engine::Engine>> e = engine::Engine::Create(&model_, threads_, so);
        Result<std::unique_ptr<engine::Session>> s =
            e.ok() ? (*e)->NewSession() : Result<std::unique_ptr<engine::Session>>(e.status());
        if (!s.ok()) {
          errors.push_back(s.status().message());
          continue;
        }
        errors.push_back("");
        runs.push_back(EvalRun{e->get(), s->get()});
        engines.push_back(std::move(*e));
        sessions.push_back(std::move(*s));
      }
      if (!errors[0].empty()) {  // the baseline itself failed: nothing can be compared
        for (size_t i = at; i < end; ++i) store(i, TuneMeasure{.error = "the f32 baseline failed: " + errors[0]});
        continue;
      }
      const TextPassHooks th{[&](size_t r, std::string_view) {
                               if (hooks_.progress && r > 0) hooks_.progress->SetLabel(label + " " + specs[at + r - 1]);
                             },
                             [&](double w) {
                               if (hooks_.progress) hooks_.progress->Advance(0, w);
                             }};
      std::vector<TextTaskResult> res = RunTextTasks(model_, eo, text, n_chunks, runs, f16_per_token, th);
      size_t run = 1;
      for (size_t i = at; i < end; ++i) {
        TuneMeasure m;
        m.chunk = chunk;
        m.n_chunks = n_chunks;
        if (!errors[i - at + 1].empty()) {
          m.error = errors[i - at + 1];
        } else {
          const KldResult& k = *res[run++].kld;
          if (!k.ok) m.error = k.error;
          m.kld = k.mean;
          m.kld_stderr = k.mean_stderr;
          m.top1 = k.top1;
          m.kv_bytes = k.kv.peak_bytes;
          m.kv_tokens = k.kv.peak_tokens;
          m.kl = k.per_position;
        }
        store(i, m);
        if (hooks_.progress) hooks_.progress->Advance(n_chunks, 0);
      }
      Choose();
    }
  }

  std::span<const int32_t> SearchText() const { return text_.first(text_.size() - HoldoutTokens()); }
  size_t HoldoutTokens() const { return static_cast<size_t>(rungs_.back().chunk) * rungs_.back().n_chunks; }

  void Measure(const std::vector<int>& which, size_t r) {
    std::vector<std::string> specs;
    for (int i : which) specs.push_back(result_.candidates[i].spec);
    const std::string label = "rung " + std::to_string(r + 1) + "/" + std::to_string(rungs_.size());
    MeasureSpecs(specs, SearchText(), rungs_[r].chunk, rungs_[r].n_chunks, label,
                 [&](size_t j, const TuneMeasure& m) { result_.candidates[which[j]].search.push_back(m); });
  }

  // Whether candidate a ranks before b on their measurement at rung r:
  // errors last; with a quality floor, those meeting it first, smallest
  // first; otherwise (and among those missing the floor) lowest KLD first.
  bool Before(int a, int b, size_t r) const {
    const TuneMeasure& ma = result_.candidates[a].search[r];
    const TuneMeasure& mb = result_.candidates[b].search[r];
    if (ma.error.empty() != mb.error.empty()) return ma.error.empty();
    const bool ra = result_.candidates[a].Rejected(), rb = result_.candidates[b].Rejected();
    if (ra != rb) return rb;  // retrieval worse than f16's ranks below every other
    const uint64_t ba = result_.candidates[a].bytes, bb = result_.candidates[b].bytes;
    if (opt_.max_kld) {
      const bool ok_a = ma.kld <= *opt_.max_kld, ok_b = mb.kld <= *opt_.max_kld;
      if (ok_a != ok_b) return ok_a;
      if (ok_a && ba != bb) return ba < bb;
    }
    if (ma.kld != mb.kld) return ma.kld < mb.kld;
    return ba < bb;
  }

  // At the last rung (the final choice; not the halving cuts, which keep
  // the best point estimates), ties within error go to the smaller spec; a
  // quality floor already orders those meeting it by bytes.
  void Rank(std::vector<int>* which, size_t r) const {
    std::stable_sort(which->begin(), which->end(), [&](int a, int b) { return Before(a, b, r); });
    if (!opt_.max_kld && r + 1 == rungs_.size()) PreferSmallerWithinError(which, result_.candidates, r);
  }

  // The best candidate of the deepest rung any candidate reached.
  void Choose() {
    size_t deepest = 0;
    for (const TuneCandidate& c : result_.candidates) deepest = std::max(deepest, c.search.size());
    std::vector<int> at;
    for (size_t i = 0; i < result_.candidates.size(); ++i) {
      if (deepest > 0 && result_.candidates[i].search.size() == deepest) at.push_back(static_cast<int>(i));
    }
    if (at.empty()) return;
    Rank(&at, deepest - 1);
    result_.chosen = at.front();
    CompareWithChosen();
    Notify();
  }

  // Every other candidate against the chosen one, paired, at the deepest
  // rung both reached (rung 0 for all: every candidate is measured there).
  void CompareWithChosen() {
    const TuneCandidate& chosen = result_.candidates[result_.chosen];
    for (size_t i = 0; i < result_.candidates.size(); ++i) {
      TuneCandidate& c = result_.candidates[i];
      c.vs_chosen.reset();
      if (static_cast<int>(i) == result_.chosen) continue;
      for (size_t r = std::min(c.search.size(), chosen.search.size()); r-- > 0;) {
        const std::optional<PairedDifference> d = PairedKld(chosen.search[r], c.search[r]);
        if (!d) continue;
        c.vs_chosen = TunePaired{.rung = static_cast<int>(r), .chunk = c.search[r].chunk,
                                 .n_chunks = c.search[r].n_chunks, .diff = d->mean, .lo95 = d->ci95.lo,
                                 .hi95 = d->ci95.hi, .p = d->p, .blocks = d->n_blocks,
                                 .verdict = VerdictName(d->Verdict())};
        break;
      }
    }
  }

  // KVTuner-style: from the best finalist with a quantized codec, each
  // layer's keys or values one width up (fitting a budget) or down (under a
  // quality floor), measured alone on rung 0; then the moves in order of
  // benefit while the spec fits (or the summed KLD changes keep the floor).
  void Descend(std::vector<int>* alive) {
    const int base_index = alive->front();
    const TuneCandidate base_c = result_.candidates[base_index];
    const kv::KVSpec base = *kv::ParseKVSpec(base_c.spec);
    if (!kv::IsQuantized(base.codec.id) || !base.codec.layer_bits.empty()) return;
    const int step = opt_.max_kld ? -1 : +1;
    std::vector<LayerMove> moves;
    std::vector<std::string> probes;
    for (int l = 0; l < layout_.n_layers; ++l) {
      for (bool keys : {true, false}) {
        const int now = keys ? (base.codec.k_bits ? base.codec.k_bits : kv::DefaultBits(base.codec.id))
                             : (base.codec.v_bits ? base.codec.v_bits : kv::DefaultBits(base.codec.id));
        const LayerMove m{l, keys, NextWidth(now, step), 0};
        if (m.bits == 0) continue;
        const kv::KVSpec probe = WithMoves(base, layout_.n_layers, std::span(&m, 1));
        if (!SteadyStateBytes(probe, layout_, opt_.ctx, opt_.sessions).ok()) continue;
        moves.push_back(m);
        probes.push_back(probe.ToString());
      }
    }
    if (moves.empty()) return;
    if (hooks_.progress) {
      hooks_.progress->SetTotal(hooks_.progress->state().total_items + static_cast<int64_t>(moves.size()),
                                hooks_.progress->state().total_weight +
                                    static_cast<double>(moves.size()) * rungs_[0].chunk);
    }
    const double base_kld = base_c.search[0].kld;
    std::vector<LayerMove> measured;
    MeasureSpecs(probes, SearchText(), rungs_[0].chunk, rungs_[0].n_chunks, "per-layer",
                 [&](size_t i, const TuneMeasure& m) {
                   if (!m.error.empty()) return;
                   moves[i].delta = m.kld - base_kld;
                   measured.push_back(moves[i]);
                 });
    if (Stopped()) return;
    std::stable_sort(measured.begin(), measured.end(),
                     [](const LayerMove& a, const LayerMove& b) { return a.delta < b.delta; });
    std::vector<LayerMove> taken;
    double predicted = base_kld;
    for (const LayerMove& mv : measured) {
      if (!opt_.max_kld && mv.delta >= 0) break;  // raising bits that do not help costs bytes for nothing
      std::vector<LayerMove> next = taken;
      next.push_back(mv);
      const Result<uint64_t> bytes = SteadyStateBytes(WithMoves(base, layout_.n_layers, next), layout_, opt_.ctx,
                                                       opt_.sessions);
      if (!bytes.ok() || *bytes > opt_.mem_bytes) continue;
      if (opt_.max_kld && predicted + mv.delta > *opt_.max_kld) continue;
      predicted += mv.delta;
      taken = std::move(next);
    }
    if (taken.empty()) return;
    const kv::KVSpec tuned = WithMoves(base, layout_.n_layers, taken);
    TuneCandidate c;
    c.spec = tuned.ToString();
    c.origin = "per-layer descent";
    c.family = base_c.family;
    c.bytes = *SteadyStateBytes(tuned, layout_, opt_.ctx, opt_.sessions);
    // Measured on every rung's text as the finalists were, so it ranks
    // beside them at the deepest rung.
    for (size_t r = 0; r < static_cast<size_t>(result_.rungs) && !Stopped(); ++r) {
      MeasureSpecs({c.spec}, SearchText(), rungs_[r].chunk, rungs_[r].n_chunks, "per-layer",
                   [&](size_t, const TuneMeasure& m) { c.search.push_back(m); });
    }
    if (c.search.size() != static_cast<size_t>(result_.rungs)) return;
    result_.candidates.push_back(std::move(c));
    alive->push_back(static_cast<int>(result_.candidates.size()) - 1);
    Rank(alive, result_.rungs - 1);
    Choose();
    Validate({static_cast<int>(result_.candidates.size()) - 1});
  }

  void Validate(const std::vector<int>& finalists) {
    std::vector<std::string> specs;
    for (int i : finalists) specs.push_back(result_.candidates[i].spec);
    const Rung& last = rungs_.back();
    MeasureSpecs(specs, text_.last(HoldoutTokens()), last.chunk, last.n_chunks, "unseen text",
                 [&](size_t j, const TuneMeasure& m) { result_.candidates[finalists[j]].holdout = m; });
  }

  static std::string Family(const kv::KVSpec& spec) {
    if (spec.policies.empty()) return "codec";
    return spec.codec.id == kv::KVSpec{}.codec.id ? "policy" : "codec+policy";
  }

  // The best candidate of a family at rung 0 (-1: none measured).
  int BestOf(const std::function<bool(const TuneCandidate&)>& pick) const {
    int best = -1;
    for (size_t i = 0; i < result_.candidates.size(); ++i) {
      const TuneCandidate& c = result_.candidates[i];
      if (!pick(c) || c.search.empty() || !c.search[0].error.empty()) continue;
      if (best < 0 || c.search[0].kld < result_.candidates[best].search[0].kld) best = static_cast<int>(i);
    }
    return best;
  }

  // Retrieval (tune.h, step 5): f16 answers every prompt; then the
  // best-ranked finalist without a verdict, each stopped as soon as it is
  // worse whatever its remaining prompts give, until the best-ranked one
  // holds (or all are worse). With compare_retrieval, every finalist and
  // the best of each single family answer every prompt.
  Status Retrieve(std::vector<int>* alive) {
    TuneRetrieval tr;
    tr.length = opt_.retrieval.length;
    tr.compared = {{"codec only", BestOf([](const TuneCandidate& c) { return c.family == "codec"; })},
                   {"policy only", BestOf([](const TuneCandidate& c) { return c.family == "policy"; })},
                   {"defaults", BestOf([](const TuneCandidate& c) { return c.defaults; })}};
    if (hooks_.progress) hooks_.progress->SetLabel("retrieval");
    const double t0 = util::MonotonicSeconds();
    const RetrievalScorer score =
        hooks_.retrieval ? hooks_.retrieval
                         : ModelRetrievalScorer(model_, threads_, opt_.retrieval, hooks_.progress, [this] { return Stopped(); });
    // Each scorer call sets the bar's total to its own prompts: the specs
    // expected after it are pending work, so the ETA covers them too.
    const auto expect_after = [&](size_t specs) {
      if (!hooks_.progress) return;
      const int64_t prompts = static_cast<int64_t>(opt_.retrieval.Prompts()) * static_cast<int64_t>(specs);
      hooks_.progress->SetPending(prompts, static_cast<double>(prompts) * opt_.retrieval.length);
    };
    std::vector<int> compared = *alive;
    for (const auto& [role, i] : tr.compared) {
      if (i >= 0 && std::find(compared.begin(), compared.end(), i) == compared.end()) compared.push_back(i);
    }
    // Whatever way this ends, no pending work is left in the bar.
    struct ClearPending {
      ProgressBar* bar;
      ~ClearPending() {
        if (bar) bar->SetPending(0, 0);
      }
    } clear_pending{hooks_.progress};
    expect_after(opt_.compare_retrieval ? compared.size() : 1);
    Result<RetrievalRun> f16 = score("codec=f16", nullptr);
    if (!f16.ok()) return f16.status().WithContext("tune retrieval");
    // Stopped during f16's prompts: nothing judged, the choice on KLD stands.
    if (f16->stopped) return Status::Ok();
    if (!f16->error.empty() || f16->hits.empty()) {
      return Internal("tune retrieval: the f16 cache failed on the retrieval prompts: " + f16->error);
    }
    tr.n = static_cast<int>(f16->hits.size());
    for (uint8_t h : f16->hits) tr.hits += h ? 1 : 0;
    tr.interval = WilsonInterval(tr.hits, tr.n);
    result_.retrieval = std::move(tr);
    // Judges candidate i; false when the stop hook ended its run.
    const auto judge = [&](int i, bool early_stop) -> Result<bool> {
      TuneCandidate& c = result_.candidates[static_cast<size_t>(i)];
      RetrievalGiveUp give_up;
      if (early_stop) give_up = [&](std::span<const uint8_t> so_far) { return CertainlyWorse(f16->hits, so_far); };
      Result<RetrievalRun> run = score(c.spec, give_up);
      if (!run.ok()) return run.status().WithContext("tune retrieval");
      if (run->stopped) return false;
      RetrievalVerdict v = JudgeRetrieval(f16->hits, run->hits);
      if (!run->error.empty()) v.error = run->error, v.verdict = "worse";
      c.retrieval = std::move(v);
      return true;
    };
    const size_t r = static_cast<size_t>(std::max(result_.rungs - 1, 0));
    bool going = true;
    if (opt_.compare_retrieval) {
      for (size_t k = 0; k < compared.size() && going; ++k) {
        expect_after(compared.size() - k - 1);
        KVX_ASSIGN_OR_RETURN(going, judge(compared[k], false));
      }
    } else {
      // Each pass judges a new spec, so this ends within alive->size() passes.
      expect_after(0);  // the hope: this one holds
      while (going) {
        Rank(alive, r);
        if (result_.candidates[static_cast<size_t>(alive->front())].retrieval) break;
        KVX_ASSIGN_OR_RETURN(going, judge(alive->front(), true));
      }
    }
    result_.retrieval->seconds = util::MonotonicSeconds() - t0;
    Rank(alive, r);
    Choose();
    return Status::Ok();
  }

  void Notify() {
    result_.pareto = TuneFront(result_);
    result_.seconds = util::MonotonicSeconds() - start_;
    if (hooks_.on_update) hooks_.on_update(result_);
  }

  const model::Model& model_;
  ThreadPool* threads_;
  std::span<const int32_t> text_;
  TuneOptions opt_;
  const TuneHooks& hooks_;
  kv::KVLayout layout_;
  std::vector<Rung> rungs_;
  TuneResult result_;
  double start_ = 0;
};

}  // namespace

std::vector<std::string> DefaultTuneSpace(const TuneHeadTables& heads) {
  // A bare codec=X is its default setting (kv::DefaultsOf: int4 rotated, int2 clipped); the unrotated
  // int4 and unclipped int2 it meant before are named beside it.
  std::vector<std::string> s = {"codec=f16", "codec=int8", "codec=int8,sym=1",
                                "codec=int4", "codec=int4,rotate=none", "codec=int4,sym=1,rotate=none",
                                "codec=int4,group=64", "codec=int2", "codec=int2,clip=0", "codec=int2,rotate=hadamard",
                                "codec=kivi4", "codec=kivi2"};
  for (const char* codec : {"kivi4", "kivi2"}) {
    for (int page : {32, 128}) {
      for (int group : {32, 64}) {
        for (int prerope : {0, 1}) {
          for (int residual : {0, 32}) {
            s.push_back(std::string("codec=") + codec + ",page=" + std::to_string(page) + ",group=" +
                        std::to_string(group) + ",prerope=" + std::to_string(prerope) + ",residual=" +
                        std::to_string(residual));
          }
        }
      }
    }
    s.push_back(std::string("codec=") + codec + ",page=128,group=64,residual=0,rotate=hadamard");
  }
  // Policies on f16 and on the codecs they combine with (ThinK takes no KIVI).
  for (const char* codec : {"codec=f16", "codec=int8", "codec=kivi4,page=128,group=64,prerope=1,residual=0"}) {
    for (const char* ratio : {"0.25", "0.5", "0.75"}) {
      for (const char* policy : {"policy=snapkv,pool=max", "policy=adakv", "policy=cake"}) {
        s.push_back(std::string(codec) + ";" + policy + ",ratio=" + ratio);
      }
    }
  }
  for (const char* codec : {"codec=f16", "codec=int8"}) {
    for (const char* lambda : {"0.25", "0.5"}) s.push_back(std::string(codec) + ";policy=think,lambda=" + lambda);
    s.push_back(std::string(codec) + ";policy=snapkv,pool=max,ratio=0.5;policy=think,lambda=0.25");
  }
  // Head typing: the retrieval heads keep every token, the streaming ones
  // sinks + a recent window (continuous, so no prefill peak). Fractions from
  // one head in 16 up; duo's own window (128 + 256) and one half as long on
  // every codec; on those that hold up with duo (f16, int8, kivi4; int4 and
  // kivi2 add 0.03-0.16 of KLD of their own) also twice as long (256 + 512)
  // and 128 + 768. At 4096 tokens the streaming heads' window sets most of
  // duo's KLD (kvx eval, 2 chunks of WikiText-2, retrieval 1/16: int8 at
  // 384 tokens 0.0127, 768 0.0064, 896 0.0056, 1280 0.0037), and a
  // quantized codec pays for a longer one: int8 + 1/16 with 128 + 768 is
  // 6.38x smaller than f16 at KLD 0.0056, f16 + 1/16 at duo's own window
  // 6.39x at 0.0126. Windows up to 1024 tokens keep rung 0 at 2048
  // (Rung0Chunk: the 1536 prefilled tokens must evict at least half the
  // share 4096 do); 1280 would make it 4096 for the whole space.
  const char* head_codecs[] = {"codec=f16", "codec=int8", "codec=kivi4,page=128,group=64,prerope=1,residual=0",
                               "codec=int4", "codec=kivi2,page=128,group=64,residual=0,rotate=hadamard"};
  const char* windows[] = {"", ",sinks=64,window=128", ",sinks=256,window=512", ",sinks=128,window=768"};
  // How many of those windows each codec takes: kivi4's 128-token pages
  // round 128 + 768 up to 1024 kept tokens, past what rung 0 at 2048 sees.
  const size_t n_windows[] = {4, 4, 3, 2, 2};
  if (!heads.duo.empty()) {
    for (size_t c = 0; c < std::size(head_codecs); ++c) {
      for (const char* retrieval : {"0.0625", "0.125", "0.25"}) {
        for (size_t w = 0; w < n_windows[c]; ++w) {
          s.push_back(std::string(head_codecs[c]) + ";policy=duo,heads=" + heads.duo + ",retrieval=" + retrieval +
                      windows[w]);
        }
      }
    }
  }
  if (!heads.razor.empty()) {  // RazorAttention's window grows with the context (n/5)
    for (const char* codec : {head_codecs[0], head_codecs[2]}) {
      for (const char* retrieval : {"0.0625", "0.15"}) {
        s.push_back(std::string(codec) + ";policy=razor,heads=" + heads.razor + ",retrieval=" + retrieval);
      }
    }
  }
  return s;
}

bool EqualQuality(const TuneCandidate& c, const TuneOptions& options) {
  const std::optional<TuneMeasure>& m =
      c.holdout ? c.holdout : (c.search.empty() ? std::nullopt : std::optional(c.search.back()));
  if (!m || !m->error.empty() || m->kld > options.EqualKld()) return false;
  return c.retrieval && c.retrieval->verdict != "worse";
}

std::vector<ParetoPoint> TuneRung0Points(const TuneResult& result, std::vector<int>* which) {
  std::vector<ParetoPoint> points;
  for (size_t i = 0; i < result.candidates.size(); ++i) {
    const TuneCandidate& c = result.candidates[i];
    if (c.search.empty() || !c.search[0].error.empty()) continue;
    points.push_back(ParetoPoint{static_cast<int>(i), static_cast<double>(c.bytes), c.search[0].kld});
    if (which) which->push_back(static_cast<int>(i));
  }
  return points;
}

std::vector<int> TuneFront(const TuneResult& result) {
  std::vector<int> which, front;
  for (size_t p : ParetoFrontier(TuneRung0Points(result, &which), false)) front.push_back(which[p]);
  return front;
}

Result<uint64_t> SteadyStateBytes(const kv::KVSpec& spec, const kv::KVLayout& layout, int ctx, int sessions) {
  KVX_ASSIGN_OR_RETURN(kv::ResolvedKVSpec r, kv::ResolveKVSpec(spec, layout, ctx, sessions));
  // The codec's pages for `ctx` tokens (page rounding included), scaled by
  // what the policies keep at steady state (kvx plan's bytes per token):
  // SnapKV at ratio 0.5 holds half, Quest adds its bounds.
  const double codec_per_token = static_cast<double>(kv::BytesPerToken(r.layout, r.layers));
  const double kept = kv::SteadyStateBytesPerToken(r, r.policies, ctx) / codec_per_token;
  const uint64_t full = kv::BytesForContext(r.layout, r.layers, ctx);
  const uint64_t steady = static_cast<uint64_t>(std::ceil(static_cast<double>(full) * kept));
  // A policy that compresses once (SnapKV, Ada-KV, CAKE ...) holds its whole
  // prompt in the codec until its compression moment, plus what compressing
  // holds before it frees: one session prefilling at a time needs that peak
  // beside the others' steady state.
  uint64_t peak = steady;
  for (const auto& p : r.policies) {
    if (p->compresses_once()) peak = std::max(peak, full + p->CompressionHeadroomBytes(r));
  }
  return steady * static_cast<uint64_t>(sessions - 1) + peak;
}

int64_t TuneTextTokens(const TuneOptions& options) {
  return 4 * static_cast<int64_t>(options.LastChunk());  // 2 chunks for the search's last rung, 2 unseen
}

int Rung0Chunk(std::span<const kv::KVSpec> specs, const kv::KVLayout& layout, const TuneOptions& options) {
  const int last = options.LastChunk();
  // Each policy-bearing spec's evicted share of its codec's bytes at
  // `tokens` (0 when nothing is evicted).
  std::vector<kv::ResolvedKVSpec> resolved;
  for (const kv::KVSpec& spec : specs) {
    if (spec.policies.empty()) continue;
    Result<kv::ResolvedKVSpec> r = kv::ResolveKVSpec(spec, layout, options.ctx, options.sessions);
    if (r.ok()) resolved.push_back(std::move(*r));
  }
  const auto evicted = [](const kv::ResolvedKVSpec& r, int tokens) {
    const double codec = static_cast<double>(kv::BytesPerToken(r.layout, r.layers));
    return 1.0 - kv::SteadyStateBytesPerToken(r, r.policies, tokens) / codec;
  };
  int chunk = std::min(options.first_chunk, last);
  for (; chunk < last; chunk = std::min(chunk * 2, last)) {
    const bool all_act = std::all_of(resolved.begin(), resolved.end(), [&](const kv::ResolvedKVSpec& r) {
      return evicted(r, chunk * 3 / 4) >= 0.5 * evicted(r, options.ctx);
    });
    if (all_act) break;
  }
  return chunk;
}

void PreferSmallerWithinError(std::vector<int>* ranked, const std::vector<TuneCandidate>& candidates, size_t r) {
  const auto at = [&](size_t k) -> const TuneCandidate& { return candidates[static_cast<size_t>((*ranked)[k])]; };
  const auto usable = [&](size_t k) {
    return at(k).search.size() > r && at(k).search[r].error.empty() && !at(k).Rejected();
  };
  for (size_t lead = 0; lead < ranked->size() && usable(lead);) {
    const TuneMeasure& best = at(lead).search[r];
    size_t end = lead + 1;
    for (; end < ranked->size() && usable(end); ++end) {
      const TuneMeasure& m = at(end).search[r];
      const std::optional<PairedDifference> d = PairedKld(best, m);
      if (d ? d->Verdict() == PairedVerdict::kWorse : m.kld - best.kld > std::hypot(m.kld_stderr, best.kld_stderr)) {
        break;
      }
    }
    std::stable_sort(ranked->begin() + static_cast<long>(lead), ranked->begin() + static_cast<long>(end),
                     [&](int a, int b) { return candidates[static_cast<size_t>(a)].bytes < candidates[static_cast<size_t>(b)].bytes; });
    lead = end;
  }
}

std::optional<PairedDifference> PairedKld(const TuneMeasure& best, const TuneMeasure& m) {
  if (best.kl.empty() || best.kl.size() != m.kl.size() || best.chunk != m.chunk || best.n_chunks != m.n_chunks) {
    return std::nullopt;
  }
  // Blocks of 32 positions (batch means), fewer on short measures so that
  // there are at least 16 blocks where there are 16 positions.
  const int block = std::clamp(static_cast<int>(best.kl.size() / 16), 1, 32);
  PairedDifference d = PairedBlockDifference(best.kl, m.kl, block);
  if (d.n_blocks < 2) return std::nullopt;
  return d;
}

Result<TuneResult> RunTune(const model::Model& model, ThreadPool* threads, std::span<const int32_t> text,
                           const TuneOptions& options, const TuneHooks& hooks) {
  return Tuner(model, threads, text, options, hooks).Run();
}

}  // namespace kvx::eval
