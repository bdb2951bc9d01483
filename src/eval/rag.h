// kvx eval --tasks rag: chunk reuse (engine/chunk_assembly.h) measured on a
// RAG-shaped prompt in natural text (docs/kv-reuse.md).
//
// For each size T (tokens of chunks per prompt): D = T / chunk_tokens
// documents of Paul Graham essay sentences (at most chunk_tokens tokens
// each, whole sentences): D - 1 plain ones that every question shares, and
// per question one more holding the recall model's trained needle "The pass
// key is N. Remember it. N is the pass key." at a random sentence. A
// question is BOS + an instruction (the prefix, the same every time), its D
// documents in a fresh random order (the chunks), then "What is the pass
// key? The pass key is" (the suffix). A prefix cache would hit only the
// instruction; every document was assembled once before the questions (not
// measured), so the chunk cache holds them all.
//
// Per question and repair: the assembly's time (time to first token, the
// chunk cache warm), the fraction of chunk tokens recomputed, a greedy answer
// (a hit when it holds N: text_score.h ValuesFound), and the KL divergence
// KL(full || repair) of the next-token distributions at the answer's
// positions, teacher-forced with `full`'s greedy answer (n_gen positions).
//
// split_needle (--rag-needle split): the needle document is two chunks cut
// inside the needle, "... The pass key is" | " N. Remember it. ...", kept
// adjacent in every order; N appears once, so answering needs the attention
// from N's tokens back across the boundary that chunks computed alone lack.
// Accuracy carries a Wilson 95% interval, and every repair an exact McNemar
// verdict against `full` on the same questions (eval/stats.h).
//
// Thread-safety: one call at a time (uses the given ThreadPool).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"
#include "util/status.h"
#include "util/thread_pool.h"

namespace kvx::eval {

struct RagOptions {
  std::string kv_spec = "codec=f16";
  std::vector<int> sizes = {2048};  // T: tokens of chunks per prompt
  int chunk_tokens = 256;           // tokens per document (about: whole sentences)
  int questions = 10;               // per size
  int n_gen = 12;                   // answer tokens (greedy) and KLD positions
  // The needle document cut in two chunks inside the needle ("... The pass
  // key is" | " N. Remember it. ..."), kept adjacent: the answer needs
  // attention across a chunk boundary (--rag-needle split).
  bool split_needle = false;
  std::vector<std::string> repairs = {"none",         "epic,k=1",     "epic,k=4",    "epic,k=16",
                                      "blend,r=0.05", "blend,r=0.15", "blend,r=0.3", "blend,r=0.05,k=16",
                                      "full"};
  std::string data_dir = "../shared/data";
  int n_batch = 512;
  uint64_t seed = 42;
};

struct RagRow {
  int size = 0;  // T
  std::string repair;
  int n = 0, hits = 0;
  double acc_lo = 0, acc_hi = 1;  // Wilson 95%
  double kld_mean = 0;            // over questions x n_gen positions
  double ttft_ms_median = 0;
  double recomputed_fraction = 0;  // mean over questions
  int64_t prompt_tokens = 0;       // of the last question (the size column: its chunk tokens)
  std::vector<bool> answered;      // per question, in order (the same questions for every repair)
  // Paired against `full` (same size): questions only `full` answered, only
  // this repair answered, the exact McNemar p-value and verdict ("better",
  // "worse", "indistinguishable"); empty without a `full` row.
  int only_full = 0, only_this = 0;
  double mcnemar_p = 1;
  std::string verdict;
};

// InvalidArgument for a bad repair or spec, NotFound without the essays.
Result<std::vector<RagRow>> RunRagEval(const model::Model& model, ThreadPool* threads, const RagOptions& options);

// The rows as a Markdown table (docs/kv-reuse.md's), and as JSON (every
// field, per-question answers included: `kvx eval --tasks rag --json FILE`).
std::string RagTable(const std::vector<RagRow>& rows);
std::string RagJson(const std::vector<RagRow>& rows);

}  // namespace kvx::eval
