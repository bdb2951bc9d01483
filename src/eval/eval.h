// kvx eval: how much quality a KV-cache configuration costs, measured the way
// the KV-cache papers do, side by side with an uncompressed baseline, in one
// run over one loaded model.
//
// Tasks (docs/eval.md has the exact protocols and scoring rules):
//   ppl      perplexity, llama.cpp's protocol (chunks of n tokens from an empty
//            cache, BOS first, the second half scored), same numbers as
//            `kvx perplexity`;
//   kld      KL(baseline || spec) of the next-token distributions at every
//            position ppl scores: mean (+- stderr), median, p90, p99, max; and
//            top-1 agreement with the baseline;
//   copy     induction probe: a span, filler, the span again; top-1 accuracy
//            on the repeat (after its first `copy_skip` tokens) per distance,
//            with random-token spans (chance = 1 / candidates) and, given a
//            text, spans of real text; each with the first-occurrence
//            accuracy as the no-copy control;
//   passkey  llama.cpp's passkey prompt over a length x depth grid, greedy;
//   lines    LongEval line retrieval, windows of the records that fit;
//   needle   needle in a haystack (Paul Graham essays), length x depth grid,
//            ROUGE-1 F1 of the answer sentence;
//   niah_word, niah_number, niah_uuid, niah_multikey, niah_multivalue, vt
//            RULER's retrieval tasks (eval/ruler.h) over the same grid,
//            exact match of the values (eval/text_score.h ValuesFound).
//
// Every retrieval task (passkey, lines, needle and the RULER tasks) is also
// scored on the cells the baseline solves (every trial a hit), so a spec is
// not blamed for what the model never could (BaselineSolved).
//
// Every task result carries KV bytes measured from the spec's BlockPool:
// BlockPool::bytes_in_use() plus the bytes the sequence keeps beside the pool
// (KVManager::SideBytes: Quest's bounds, MiniCache's norms, ThinK's channel
// maps, a scorer's statistics) read at the end of every sequence (after its
// last token, before the cache is cleared), the maximum kept, together with the
// sequence length then; and the bytes a dense f16 K/V cache holds for that
// many tokens (2 x 2 bytes x layers x kv_heads x head_dim per token), whose
// ratio is the compression against f16.
//
// Execution: ppl and kld run chunk by chunk over the baseline and all specs
// together (the baseline's log-probabilities of a chunk are computed once and
// compared against every spec, nothing is stored across chunks); then each
// spec, baseline first, runs the other tasks. After every task of every spec
// `on_update` receives the report so far, so an interrupted run keeps them.
//
// Thread-safety: RunEval uses the given ThreadPool; one call at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "eval/progress.h"
#include "eval/prompts.h"
#include "eval/stats.h"
#include "kv/tier/storage_transform.h"
#include "model/model.h"
#include "util/status.h"
#include "util/thread_pool.h"

namespace kvx::eval {

enum class Task {
  kPpl,
  kKld,
  kCopy,
  kPasskey,
  kLines,
  kNeedle,
  kNiahWord,
  kNiahNumber,
  kNiahUuid,
  kNiahMultikey,
  kNiahMultivalue,
  kVt
};
inline constexpr Task kAllTasks[] = {Task::kPpl,        Task::kKld,          Task::kCopy,          Task::kPasskey,
                                     Task::kLines,      Task::kNeedle,       Task::kNiahWord,      Task::kNiahNumber,
                                     Task::kNiahUuid,   Task::kNiahMultikey, Task::kNiahMultivalue, Task::kVt};
// The generation probes scored per grid cell (every task but ppl, kld, copy).
inline constexpr Task kRetrievalTasks[] = {Task::kPasskey,      Task::kLines,          Task::kNeedle,
                                           Task::kNiahWord,     Task::kNiahNumber,     Task::kNiahUuid,
                                           Task::kNiahMultikey, Task::kNiahMultivalue, Task::kVt};
std::string_view TaskName(Task t);
// The task named `name` (as TaskName), or nullopt.
std::optional<Task> TaskByName(std::string_view name);
bool IsRulerTask(Task t);  // niah_*, vt
// "ppl,kld,copy" -> tasks in canonical order; "all" = every task, "niah" =
// niah_word,niah_number,niah_uuid, "ruler" = every niah_* task and vt.
// InvalidArgument naming the unknown task and listing the valid ones.
Result<std::vector<Task>> ParseTasks(std::string_view list);

struct EvalOptions {
  std::vector<Task> tasks = {Task::kPpl, Task::kKld, Task::kCopy};
  std::string baseline = "codec=f32";  // the reference cache
  std::vector<std::string> specs;      // the caches to judge (any --kv strings)
  std::string model_path;              // for the report
  int n_ctx = 0;                       // longest sequence of any task; 0 = the model's trained context
  int n_batch = 512;
  uint64_t seed = 42;

  // ppl, kld (and copy spans from text): the text and its file name.
  std::string text;
  std::string text_name;
  int chunk = 0;        // ppl/kld chunk length; 0 = n_ctx
  int max_chunks = -1;  // -1 = every chunk

  // copy
  int copy_span = 32;
  int copy_skip = 1;                // repeat tokens not scored (the first can't be known)
  std::vector<int> copy_distances;  // empty = {0, n_ctx/32, n_ctx/8, n_ctx/2, max}
  int copy_trials = 10;             // sequences per distance and source

  // passkey, needle grid: total sequence lengths (prompt + answer) and depths
  std::vector<int> lengths;    // empty = {n_ctx/4, n_ctx/2, 3 n_ctx/4, n_ctx}, minus those
                               // too short for the bare prompt (+1/3 room for filler)
  std::vector<double> depths;  // empty = {0, 0.25, 0.5, 0.75, 1}
  int passkey_trials = 3;
  int passkey_gen = 16;
  int needle_gen = 32;

  // lines
  std::vector<int> line_counts;  // empty = {2, 5, 10, 20, 40, 80, 160}, those that fit
  int lines_trials = 10;         // cases per count (the first of 200_lines.jsonl)
  int lines_gen = 16;

  // niah_*, vt (same lengths and depths as passkey)
  int ruler_trials = 3;  // prompts per cell
  int ruler_gen = 0;     // tokens generated at most; 0 = the task's default (RulerDefaultGen)

  std::string data_dir = "../shared/data";  // lines and needle data

  // When the KV policies' explicit compression moment (Session::Compress)
  // runs: "excluded" after the context, before the question (kvpress's
  // question-free setting: the cache could serve any question; the default),
  // "included" after the whole prompt (query-aware), "none" never (only
  // continuous policies act). Retrieval prompts are split at
  // GenItem::question_start; copy compresses before the repeat in both
  // modes. ppl and kld have no question: when some spec has a KV policy
  // (once, continuous or a selection) and compress is not "none", every run (baseline too)
  // splits each chunk: its first kld_context fraction is the context
  // (prefill, then Compress), the rest is scored token by token (teacher
  // forced; both modes mean the same there; a continuous policy acts after
  // the prefill and after every tail step). Otherwise ppl and kld keep
  // llama.cpp's protocol.
  std::string compress = "excluded";
  // The context of a ppl/kld chunk in the split protocol: a share of the
  // chunk when in (0, 1), else a number of tokens.
  double kld_context = 0.75;
  // With kld_context in tokens: tokens scored after it; the chunk is then
  // kld_context + kld_score + 1 tokens (0: whatever the chunk leaves).
  int kld_score = 0;
  // The split protocol for every run, with a policy or not (kvx tune: KLDs
  // of specs measured in different passes stay comparable).
  bool always_split = false;
  // A tier storage level (kv/tier/storage_codec.h; "" = none): ppl and kld
  // use the split protocol, and every spec but the baseline sends its
  // context's full 256-token blocks through the tier block format at this
  // level and back, as a tier hit would load them, before the rest is
  // scored; on the retrieval tasks, each prompt's but its last token, before
  // the answer (copy is refused). Its KV bytes are then the stored blocks'.
  std::string storage_codec;
  // The `compact` level's calibration (kv/tier/storage_transform.h): the
  // PCA of each spec's KV over this text's first storage_calib_tokens
  // tokens, in chunks of --chunk. The default, the Jargon File, is no eval
  // task's text (kvx calibrate-heads uses it too).
  std::string storage_calib = "../shared/data/prose/jargon-4.4.7.txt";
  int storage_calib_tokens = 8192;
  // Its bit rates (--storage-rates; the transform's digest covers the bits).
  kv::tier::CompactRates storage_rates = kv::tier::DefaultCompactRates();
  // Retrieval prompts: specs of the same codec and page size take the
  // prompt's prefill from the first of them that ran it (a copy of its
  // pages), and run only the prompt's last calls themselves, when their
  // policies depend on the pages and the prompt's last queries only
  // (KVManager::PromptWindow): the results are the same as with a prefill
  // of their own. The copies kept take at most this many MiB (0: off).
  int prefill_cache_mib = 2048;
};

// Default answer tokens of a RULER task: room for its values in the probe
// tokenizer (digits split, so a UUID takes ~30 tokens) plus the words a model
// may put before them.
int RulerDefaultGen(Task t);

// KV bytes held by a spec's pool (see the header comment).
struct KvMeasure {
  uint64_t peak_bytes = 0;  // max pool bytes in use + side bytes at the end of a sequence
  int64_t peak_tokens = 0;  // that sequence's length
  uint64_t f16_bytes = 0;   // dense f16 K+V bytes for peak_tokens tokens
  // Live entries over the slots of the pages that sequence's tables list:
  // what eviction leaves in half-empty pages before compaction packs them
  // (1 without removals, but for the last partly written page of a table).
  // Unset in reports written before it was measured.
  std::optional<double> live_fraction;
  double CompressionVsF16() const {
    return peak_bytes > 0 ? static_cast<double>(f16_bytes) / static_cast<double>(peak_bytes) : 0.0;
  }
  // Keeps the larger measurement.
  void Observe(uint64_t bytes, int64_t tokens, uint64_t f16_bytes_per_token, std::optional<double> live_fraction = std::nullopt);
  void Merge(const KvMeasure& other);
};

struct TaskOutcome {
  bool ok = true;
  std::string error;  // when !ok
  double seconds = 0;
  KvMeasure kv;
};

struct PplResult : TaskOutcome {
  double ppl = 0;
  double ppl_stderr = 0;
  int n_chunks = 0;
  int n_scored = 0;
  int chunk = 0;
  int context = 0;  // split protocol (EvalOptions::compress): context tokens per chunk; 0: llama.cpp's protocol
};

struct KldResult : TaskOutcome {
  double mean = 0, mean_stderr = 0, median = 0, p90 = 0, p99 = 0, max = 0;
  double top1 = 0, top1_stderr = 0;  // fraction of positions where the argmax agrees
  int64_t n_positions = 0;
  int context = 0;  // as PplResult::context
  // Each scored position's KL, in text order: two caches scored on the same
  // text compare position by position (stats.h PairedBlockDifference).
  std::vector<float> per_position;
};

struct CopyDistance {
  int distance = 0;
  int64_t n_scored = 0;
  double accuracy = 0;        // repeat tokens predicted top-1
  double first_accuracy = 0;  // the same span positions at their first occurrence
};

struct CopySource {
  std::string source;  // "random" or "text"
  double chance = -1;  // random: 1 / candidates; text: -1 (n/a)
  int64_t n_sequences = 0;
  int64_t n_scored = 0;
  double accuracy = 0;
  double first_accuracy = 0;
  std::vector<CopyDistance> by_distance;
};

struct CopyResult : TaskOutcome {
  int span = 0;
  int skip = 0;
  std::vector<CopySource> sources;
};

struct CellResult {
  GridCell cell;
  int n = 0;
  int hits = 0;
  double score_sum = 0;  // passkey/lines: hits; needle: sum of ROUGE-1 F1; niah*/vt: sum of ValuesFound
  double prompt_tokens_sum = 0;
  std::string example;  // the first item's output
  double Accuracy() const { return n > 0 ? static_cast<double>(hits) / n : 0.0; }
  double Score() const { return n > 0 ? score_sum / n : 0.0; }
};

// One prompt's outcome. `id` is the prompt's index in the probe plan, the
// same prompt under every spec of a run, so two specs can be compared on the
// same prompts (paired tests: stats.h McNemarExactP).
struct PromptOutcome {
  int id = 0;
  int cell = 0;  // index into RetrievalResult::cells
  bool hit = false;
  double score = 0;
};

struct RetrievalResult : TaskOutcome {
  // "first_integer" (passkey, lines), "rouge1_f1" (needle) or "values_found"
  // (niah*, vt: ValuesFound, its share of the values as the score)
  std::string metric;
  std::vector<CellResult> cells;
  std::vector<PromptOutcome> prompts;  // in the order they ran
  int n = 0;
  int hits = 0;
  double score_sum = 0;
  double Accuracy() const { return n > 0 ? static_cast<double>(hits) / n : 0.0; }
  double Score() const { return n > 0 ? score_sum / n : 0.0; }
};

struct SpecResult {
  std::string spec;       // as given
  std::string canonical;  // KVSpec::ToString()
  bool is_baseline = false;
  std::string error;  // set when the spec could not be set up
  std::optional<PplResult> ppl;
  std::optional<KldResult> kld;
  std::optional<CopyResult> copy;
  std::optional<RetrievalResult> passkey, lines, needle;
  std::optional<RetrievalResult> niah_word, niah_number, niah_uuid, niah_multikey, niah_multivalue, vt;
  KvMeasure kv;  // the largest of the tasks' measurements

  // The result slot of a retrieval task (nullptr for ppl, kld, copy).
  std::optional<RetrievalResult>* Retrieval(Task t);
  const std::optional<RetrievalResult>* Retrieval(Task t) const;
  double seconds = 0;
  bool done = false;  // every requested task has finished
  int64_t prefill_reused = 0;  // prompt tokens taken from another spec's prefill (EvalOptions::prefill_cache_mib)
};

// A spec's score on the cells its baseline solves: those where every trial
// of the baseline is a hit (all values found; needle: every answer word).
// Cells are matched by index (every spec runs the same plan).
struct SolvedCells {
  int cells = 0;         // cells with at least one trial
  int solved = 0;        // of which the baseline solves
  int n = 0;             // the spec's trials on the solved cells
  int hits = 0;
  double score_sum = 0;
  double Share() const { return cells > 0 ? static_cast<double>(solved) / cells : 0.0; }
  double Accuracy() const { return n > 0 ? static_cast<double>(hits) / n : 0.0; }
  double Score() const { return n > 0 ? score_sum / n : 0.0; }
};
SolvedCells BaselineSolved(const RetrievalResult& baseline, const RetrievalResult& spec);

// A spec against its baseline on the prompts both answered (matched by
// PromptOutcome::id): hits of both, of the baseline only, of the spec only,
// the exact McNemar p-value and the verdict at alpha 0.05 (uncorrected: one
// comparison per spec and task).
struct PairedComparison {
  int n = 0, both = 0, baseline_only = 0, spec_only = 0;
  double p = 1;
  std::string verdict = "indistinguishable";
};
PairedComparison CompareWithBaseline(const RetrievalResult& baseline, const RetrievalResult& spec);

// 95% interval of a result's score (or of one cell's, cell >= 0): Wilson on
// the hits when every score is 0 or 1 (a rate), else the bootstrap of the
// mean score over its prompts. Results read from reports written before
// per-prompt outcomes were kept get Wilson on the hits.
Interval ScoreInterval(const RetrievalResult& r, int cell = -1);

struct ModelInfo {
  std::string path, name, arch;
  int n_layers = 0, n_kv_heads = 0, head_dim = 0, n_ctx_train = 0, n_vocab = 0;
  uint64_t f16_bytes_per_token = 0;  // dense f16 K+V
};

struct EvalReport {
  ModelInfo model;
  EvalOptions settings;  // with every default resolved (grids, n_ctx, chunk)
  std::vector<int> dropped_line_counts;
  int copy_candidates = 0;
  std::vector<SpecResult> specs;  // baseline first, then options.specs in order
  bool complete = false;
  std::string created_utc;
};

struct EvalHooks {
  std::function<void(const EvalReport&)> on_update;  // after every finished task
  ProgressBar* progress = nullptr;
  // Polled before every spec and every retrieval prompt: true ends the run
  // there, and the report comes back with complete == false (kvx tune's
  // Ctrl-C during its retrieval check).
  std::function<bool()> cancelled;
  // After every retrieval prompt a spec answered: the spec (0: the
  // baseline) and the outcome, in the order the prompts run (the same for
  // every spec and every run of the same options: kvx tune pairs hits by it).
  std::function<void(size_t spec, const PromptOutcome&)> on_prompt;
};

// Validates the options (every spec parses, the grids fit in the context,
// needed data present), builds every probe input, then runs. Setup errors
// (bad spec, missing data, a grid that does not fit) return a Status before
// anything runs; a spec that fails while running (e.g. its budget runs out)
// gets the error in its task result and the run goes on.
Result<EvalReport> RunEval(const model::Model& model, ThreadPool* threads, const EvalOptions& options,
                           const EvalHooks& hooks);

}  // namespace kvx::eval
