// kvx tune's retrieval verdict and the scorer that runs kvx eval's tasks
// (tune_retrieval.h).
#include "eval/tune_retrieval.h"

#include <algorithm>

namespace kvx::eval {

namespace {

// f16 and spec of equal, non-zero sizes.
RetrievalVerdict JudgePaired(std::span<const uint8_t> f16, std::span<const uint8_t> spec) {
  RetrievalVerdict v;
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

std::vector<uint8_t> BestCompletion(size_t n, std::span<const uint8_t> so_far) {
  std::vector<uint8_t> best(n, 1);
  std::copy(so_far.begin(), so_far.end(), best.begin());
  return best;
}

}  // namespace

bool CertainlyWorse(std::span<const uint8_t> f16, std::span<const uint8_t> so_far) {
  if (f16.empty() || so_far.size() > f16.size()) return false;
  return JudgePaired(f16, BestCompletion(f16.size(), so_far)).verdict == "worse";
}

RetrievalVerdict JudgeRetrieval(std::span<const uint8_t> f16, std::span<const uint8_t> spec) {
  if (f16.size() == spec.size() && !f16.empty()) return JudgePaired(f16, spec);
  if (spec.size() < f16.size() && CertainlyWorse(f16, spec)) {
    // The answered prompts' figures, the verdict of the best completion.
    RetrievalVerdict v = spec.empty() ? RetrievalVerdict{} : JudgePaired(f16.first(spec.size()), spec);
    v.verdict = "worse";
    v.skipped = static_cast<int>(f16.size() - spec.size());
    return v;
  }
  RetrievalVerdict v;
  v.verdict = "worse";
  v.error = "answered " + std::to_string(spec.size()) + " of " + std::to_string(f16.size()) + " prompts";
  return v;
}

RetrievalScorer ModelRetrievalScorer(const model::Model& model, ThreadPool* threads, RetrievalSettings settings,
                                     ProgressBar* progress, std::function<bool()> stop) {
  return [&model, threads, settings, progress, stop](const std::string& spec,
                                                     const RetrievalGiveUp& give_up) -> Result<RetrievalRun> {
    EvalOptions eo;
    eo.tasks = settings.tasks;
    eo.baseline = spec;  // the only cache of this run: RunEval answers every prompt with it
    eo.n_ctx = settings.length;
    eo.lengths = {settings.length};
    eo.depths = settings.depths;
    eo.passkey_trials = eo.lines_trials = eo.ruler_trials = settings.trials;
    eo.data_dir = settings.data_dir;
    eo.seed = settings.seed;
    RetrievalRun run;
    bool gave_up = false;
    EvalHooks hooks;
    hooks.progress = progress;
    hooks.on_prompt = [&run](size_t, const PromptOutcome& p) { run.hits.push_back(p.hit ? 1 : 0); };
    hooks.cancelled = [&] {
      if (stop && stop()) return true;
      gave_up = gave_up || (give_up && !run.hits.empty() && give_up(run.hits));
      return gave_up;
    };
    KVX_ASSIGN_OR_RETURN(EvalReport report, RunEval(model, threads, eo, hooks));
    if (!report.complete && !gave_up) {
      run.stopped = true;
      return run;
    }
    run.error = report.specs[0].error;  // the spec failed to run at all
    for (Task t : settings.tasks) {
      const std::optional<RetrievalResult>& r = *report.specs[0].Retrieval(t);
      if (r && !r->ok && !gave_up && run.error.empty()) run.error = std::string(TaskName(t)) + ": " + r->error;
    }
    return run;
  };
}

}  // namespace kvx::eval
