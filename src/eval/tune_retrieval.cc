// kvx tune's retrieval verdict and the scorer that runs kvx eval's tasks
// (tune_retrieval.h).
#include "eval/tune_retrieval.h"

#include <algorithm>

namespace kvx::eval {

RetrievalVerdict JudgeRetrieval(std::span<const uint8_t> f16, std::span<const uint8_t> spec) {
  RetrievalVerdict v;
  v.verdict = "worse";
  if (f16.size() != spec.size() || f16.empty()) {
    v.error = "answered " + std::to_string(spec.size()) + " of " + std::to_string(f16.size()) + " prompts";
    return v;
  }
  int f16_hits = 0;
  for (size_t i = 0; i < f16.size(); ++i) {
    f16_hits += f16[i] ? 1 : 0;
    v.hits += spec[i] ? 1 : 0;
    v.only_spec += spec[i] && !f16[i] ? 1 : 0;
    v.only_f16 += f16[i] && !spec[i] ? 1 : 0;
  }
  v.n = static_cast<int>(spec.size());
  v.interval = WilsonInterval(v.hits, v.n);
  v.mcnemar_p = McNemarExactP(v.only_spec, v.only_f16);
  const Interval full = WilsonInterval(f16_hits, v.n);
  const bool paired = v.mcnemar_p < 0.05;
  if (v.Rate() < full.lo || (paired && v.only_f16 > v.only_spec)) {
    v.verdict = "worse";
  } else if (v.Rate() > full.hi || (paired && v.only_spec > v.only_f16)) {
    v.verdict = "better";
  } else {
    v.verdict = "indistinguishable";
  }
  return v;
}

RetrievalScorer ModelRetrievalScorer(const model::Model& model, ThreadPool* threads, RetrievalSettings settings,
                                     ProgressBar* progress, std::function<bool()> stop) {
  return [&model, threads, settings, progress, stop](const std::vector<std::string>& specs) -> Result<RetrievalScores> {
    EvalOptions eo;
    eo.tasks = settings.tasks;
    eo.baseline = "codec=f16";  // the full cache the verdict compares with
    eo.specs = specs;
    eo.n_ctx = settings.length;
    eo.lengths = {settings.length};
    eo.depths = settings.depths;
    eo.passkey_trials = eo.lines_trials = eo.ruler_trials = settings.trials;
    eo.data_dir = settings.data_dir;
    eo.seed = settings.seed;
    EvalHooks hooks;
    hooks.progress = progress;
    hooks.cancelled = stop;
    KVX_ASSIGN_OR_RETURN(EvalReport report, RunEval(model, threads, eo, hooks));
    RetrievalScores out;
    out.stopped = !report.complete;
    if (out.stopped) return out;
    for (size_t s = 0; s < report.specs.size(); ++s) {
      std::vector<uint8_t> hits;
      std::string error = report.specs[s].error;
      for (Task t : settings.tasks) {
        const std::optional<RetrievalResult>& r = *report.specs[s].Retrieval(t);
        if (!r) continue;
        if (!r->ok && error.empty()) error = std::string(TaskName(t)) + ": " + r->error;
        // By prompt id: every spec answers the same plan, so hits pair up.
        std::vector<PromptOutcome> by_id = r->prompts;
        std::sort(by_id.begin(), by_id.end(), [](const PromptOutcome& a, const PromptOutcome& b) { return a.id < b.id; });
        for (const PromptOutcome& p : by_id) hits.push_back(p.hit ? 1 : 0);
      }
      if (s == 0) {
        if (!error.empty()) return Internal("the f16 cache failed on the retrieval prompts: " + error);
        out.f16 = std::move(hits);
      } else {
        out.specs.push_back(std::move(hits));
        out.errors.push_back(std::move(error));
      }
    }
    return out;
  };
}

}  // namespace kvx::eval
