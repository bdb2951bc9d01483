// kvx tune's retrieval check (docs/tune.md, issue 37's "equal quality means
// retrieval too"): a spec answers the same retrieval prompts as an f16
// cache and gets its hit rate with a Wilson 95% interval and a verdict
// against f16:
//
//   worse              its rate is below f16's interval, or the exact
//                      McNemar test on the prompts where exactly one of the
//                      two is right says it loses (p < 0.05);
//   better             the mirror image;
//   indistinguishable  neither.
//
// A spec is of "equal quality" when its KLD is within the bound and its
// retrieval is not worse than f16's. A spec's run may stop as soon as it is
// worse whatever its remaining prompts give (CertainlyWorse): kvx tune checks
// its finalists one at a time, best first, until one holds.
//
// Thread-safety: pure functions, but the scorer runs the model (one call at
// a time, on the given ThreadPool).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "eval/eval.h"
#include "eval/stats.h"

namespace kvx::eval {

struct RetrievalVerdict {
  int n = 0, hits = 0;   // the prompts the spec answered, and its hits there
  Interval interval;     // Wilson 95% of hits / n
  int only_spec = 0;     // prompts only the spec gets right
  int only_f16 = 0;      // prompts only f16 gets right
  double mcnemar_p = 1;  // exact two-sided, on only_spec vs only_f16
  std::string verdict;   // "better", "worse" or "indistinguishable" (vs f16)
  std::string error;     // the spec failed on the prompts (then: worse)
  int skipped = 0;       // prompts not run: it was worse whatever they gave
  double Rate() const { return n > 0 ? static_cast<double>(hits) / n : 0.0; }
};

// `f16` and `spec`: one hit per prompt, the same prompts in the same order.
// A `spec` shorter than `f16` is a run that stopped early: it is judged as
// if every prompt it did not answer were a hit, so its "worse" is certain
// (skipped counts those prompts; n, hits and the McNemar counts are the
// answered ones'); when even that is not worse, or `spec` is longer, the
// verdict is "worse" with an error (the runs do not pair up).
RetrievalVerdict JudgeRetrieval(std::span<const uint8_t> f16, std::span<const uint8_t> spec);

// Whether the first so_far.size() prompts already make the spec worse than
// f16 whatever the rest give (JudgeRetrieval on the best completion).
bool CertainlyWorse(std::span<const uint8_t> f16, std::span<const uint8_t> so_far);

// One spec's answers, one hit per prompt in the order the prompts ran (the
// same order for every spec and every run: hits pair up by index).
struct RetrievalRun {
  std::vector<uint8_t> hits;
  std::string error;     // the spec failed on the prompts ("" when not)
  bool stopped = false;  // the stop hook ended the run: nothing to judge
};

// Asked after every prompt with the hits so far: true ends the spec's run.
using RetrievalGiveUp = std::function<bool(std::span<const uint8_t> hits_so_far)>;

// Scores one spec on the retrieval prompts; `give_up` may be null.
using RetrievalScorer = std::function<Result<RetrievalRun>(const std::string& spec, const RetrievalGiveUp& give_up)>;

struct RetrievalSettings {
  std::vector<Task> tasks;  // retrieval tasks (kRetrievalTasks)
  int length = 0;           // tokens of every prompt (answer included)
  std::vector<double> depths = {0.0, 0.25, 0.5, 0.75, 1.0};
  int trials = 10;          // prompts per depth and task: n = tasks x depths x trials
  std::string data_dir = "../shared/data";
  uint64_t seed = 42;
  int Prompts() const { return static_cast<int>(tasks.size() * depths.size()) * trials; }
};

// The scorer that runs kvx eval's tasks (RunEval with the spec as its only
// cache, question excluded from compression) on `model`; `progress` (may be
// null) gets the work added to its totals; `stop` (may be null), polled
// before every prompt, ends the run early (RetrievalRun::stopped).
RetrievalScorer ModelRetrievalScorer(const model::Model& model, ThreadPool* threads, RetrievalSettings settings,
                                     ProgressBar* progress, std::function<bool()> stop = nullptr);

}  // namespace kvx::eval
