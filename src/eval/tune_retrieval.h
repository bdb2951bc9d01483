// kvx tune's retrieval check (docs/tune.md, issue 37's "equal quality means
// retrieval too"): the finalists, and the best single-family specs they are
// compared with, answer the same retrieval prompts as an f16 cache. Each
// gets its hit rate with a Wilson 95% interval and a verdict against f16:
//
//   worse              its rate is below f16's interval, or the exact
//                      McNemar test on the prompts where exactly one of the
//                      two is right says it loses (p < 0.05);
//   better             the mirror image;
//   indistinguishable  neither.
//
// A spec is of "equal quality" when its KLD is within the bound and its
// retrieval is not worse than f16's.
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
  int n = 0, hits = 0;
  Interval interval;     // Wilson 95% of hits / n
  int only_spec = 0;     // prompts only the spec gets right
  int only_f16 = 0;      // prompts only f16 gets right
  double mcnemar_p = 1;  // exact two-sided, on only_spec vs only_f16
  std::string verdict;   // "better", "worse" or "indistinguishable" (vs f16)
  std::string error;     // the spec failed on the prompts (then: worse)
  double Rate() const { return n > 0 ? static_cast<double>(hits) / n : 0.0; }
};

// `f16` and `spec`: one hit per prompt, the same prompts in the same order
// (sizes must match; a mismatch is judged "worse" with an error).
RetrievalVerdict JudgeRetrieval(std::span<const uint8_t> f16, std::span<const uint8_t> spec);

// The prompts, their hits and their cost.
struct RetrievalScores {
  std::vector<uint8_t> f16;                // the f16 cache's hit per prompt
  std::vector<std::vector<uint8_t>> specs; // per spec asked, the same prompts
  std::vector<std::string> errors;         // per spec: "" or why it failed
  bool stopped = false;                    // the stop hook ended the run: nothing to judge
};

// Scores specs on retrieval prompts (f16 is always scored first).
using RetrievalScorer = std::function<Result<RetrievalScores>(const std::vector<std::string>& specs)>;

struct RetrievalSettings {
  std::vector<Task> tasks;  // retrieval tasks (kRetrievalTasks)
  int length = 0;           // tokens of every prompt (answer included)
  std::vector<double> depths = {0.0, 0.25, 0.5, 0.75, 1.0};
  int trials = 10;          // prompts per depth and task: n = tasks x depths x trials
  std::string data_dir = "../shared/data";
  uint64_t seed = 42;
  int Prompts() const { return static_cast<int>(tasks.size() * depths.size()) * trials; }
};

// The scorer that runs kvx eval's tasks (RunEval, baseline codec=f16,
// question excluded from compression) on `model`; `progress` (may be null)
// gets the work added to its totals; `stop` (may be null), polled before
// every prompt, ends the run early (RetrievalScores::stopped).
RetrievalScorer ModelRetrievalScorer(const model::Model& model, ThreadPool* threads, RetrievalSettings settings,
                                     ProgressBar* progress, std::function<bool()> stop = nullptr);

}  // namespace kvx::eval
