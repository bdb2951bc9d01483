// SCBench's shared-context protocols (Li et al., ICLR 2025, "SCBench: A
// KV Cache-Centric Analysis of Long-Context Methods") in kvx eval
// (`--protocol multi-query` / `multi-turn`): does a KV cache compressed once
// for a shared context still answer the second, third, fourth question?
//
// The context: RULER's niah_multikey haystack (eval/ruler.h: Paul Graham
// essays with `questions` needles "One of the special magic numbers for KEY
// is: VALUE.", distinct keys, the first at depths 0.1/0.5/0.9 in turn, the
// others anywhere), without its question. The questions: RULER's niah
// question for each key, in an order shuffled per context (so a question's
// index is not its needle's depth). Scored by exact match of the value
// (ValuesFound == 1).
//
// Both protocols go through the scheduler (engine/scheduler.h), as a server
// would serve them: a warm-up request prefills the context alone and
// compresses it at its end (compress_at: the question excluded), which
// leaves it in the scheduler's compressed cache (or, without a policy, its
// blocks in the radix prefix cache; with a continuous policy the evicted
// sequence);
//   multi-query  then every question is a request on the context, submitted
//                together, each a copy-on-write fork of that one compressed
//                cache (SchedulerStats: compressions 1 per context);
//   multi-turn   then the questions one after another in one conversation
//                (a named session): each turn's prompt is its question
//                appended after the previous answer (the model's own), and
//                nothing is compressed again.
// Greedy answers of n_gen tokens at most.
//
// Thread-safety: one call at a time; uses the given ThreadPool.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "eval/progress.h"
#include "model/model.h"
#include "util/status.h"
#include "util/thread_pool.h"

namespace kvx::eval {

struct SharedContextOptions {
  std::string protocol = "multi-query";  // or "multi-turn"
  std::vector<std::string> specs;        // the --kv specs, the full cache among them if wanted
  std::vector<int> lengths = {2048};     // tokens of context + question + answer
  int contexts = 12;                     // per length
  int questions = 4;                     // needles and questions per context (>= 2)
  int n_gen = 0;                         // 0: niah_multikey's default
  std::string data_dir = "../shared/data";
  int n_batch = 512;
  uint64_t seed = 42;
  ProgressBar* progress = nullptr;  // advanced per context, weighted by its tokens (nullptr: none)
};

// One (spec, length, question index) cell.
struct SharedContextRow {
  std::string spec;
  int length = 0;
  int question = 0;  // 0-based index in the order asked
  int n = 0, hits = 0;
  double lo = 0, hi = 1;  // Wilson 95%
};

struct SharedContextResult {
  std::string protocol;
  std::vector<SharedContextRow> rows;
  // Per spec (in options order): the scheduler's compression moments and
  // compressed-cache hits over the whole run, and the prompt tokens it
  // computed, so a table shows that each context was compressed once.
  struct SpecWork {
    std::string spec;
    uint64_t contexts = 0, compressions = 0, compressed_hits = 0, prefix_hit_tokens = 0, prompt_tokens_computed = 0;
    double seconds = 0;
  };
  std::vector<SpecWork> work;
};

// InvalidArgument for an unknown protocol, fewer than 2 questions, no spec;
// a spec or length that cannot run is an error naming it.
Result<SharedContextResult> RunSharedContextEval(const model::Model& model, ThreadPool* threads,
                                                 const SharedContextOptions& options);

// Markdown: one row per (spec, length), a column per question index
// ("rate [lo, hi] (hits/n)"), then the work per spec.
std::string SharedContextTable(const SharedContextResult& result);
std::string SharedContextJson(const SharedContextResult& result);

}  // namespace kvx::eval
