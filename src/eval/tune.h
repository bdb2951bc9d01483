// kvx tune: the KV spec with the best quality whose steady-state bytes fit a
// memory budget (or, with a quality floor, the smallest spec that meets it),
// for one model and one text. docs/tune.md describes the search and its cost.
//
// The search:
//   1. the space (DefaultTuneSpace: codecs with their group, page, residual,
//      pre-RoPE and rotation settings; SnapKV with max pooling, Ada-KV, CAKE
//      and ThinK at several ratios, alone and on codecs; with head tables
//      (tune_heads.h), DuoAttention and RazorAttention head typing at several
//      retrieval fractions and windows, alone and on codecs) is filtered by
//      bytes (SteadyStateBytes: every session's steady state, one at its
//      prefill peak); what does not fit is never run;
//   2. successive halving on teacher-forced KLD against an f32 cache (the
//      split protocol of kvx eval for every spec: prefill 3/4 of a chunk,
//      compress, score the rest token by token): rung 0 measures every
//      candidate on one short chunk, each later rung doubles the chunk and
//      keeps the best 1/eta, down to `finalists`;
//   3. a KVTuner-style greedy per-layer descent from the best quantized
//      finalist: each layer's keys and values are moved one bit width (up
//      when fitting the budget, down under a quality floor) alone and
//      measured; the moves are then taken in order of measured benefit while
//      the spec still fits (or its predicted KLD still meets the floor);
//   4. the finalists are measured again on text the search did not see (the
//      end of the text), and both figures are reported;
//   5. with retrieval tasks (TuneOptions::retrieval), an f16 cache answers
//      the retrieval prompts, then the best-ranked finalist (tune_retrieval.h);
//      one worse than f16 ranks below every other, and the next best is
//      checked, until one holds or all are worse. A finalist's run stops as
//      soon as it is worse whatever its other prompts give. With
//      compare_retrieval every finalist and the best spec of each single
//      family (codec only, policy only, a codec at its defaults) answer
//      every prompt (the comparison docs/tune.md reports).
// Between passes (a few candidates at a time) the stop hook is polled: a
// stopped search (Ctrl-C, --time-budget) returns the best candidate of the
// deepest rung reached.
//
// Bytes: SteadyStateBytes, the codec's pages scaled by what the policies
// keep at steady state (kv::SteadyStateBytesPerToken, as kvx plan sizes a
// sequence) plus one session's prefill peak, so with several sessions an
// eviction policy fits a budget its codec alone does not.
//
// Thread-safety: RunTune uses the given ThreadPool; one call at a time.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "eval/progress.h"
#include "eval/stats.h"
#include "eval/tune_retrieval.h"
#include "kv/kv_spec.h"
#include "kv/layout.h"
#include "model/model.h"
#include "util/status.h"
#include "util/thread_pool.h"

namespace kvx::eval {

// The head tables the head-typing specs of the space name (file paths; ""
// leaves that method out): tune_heads.h loads or calibrates them.
struct TuneHeadTables {
  std::string duo, razor;
};

struct TuneOptions {
  uint64_t mem_bytes = 0;  // KV bytes for all sessions (the pool, not the weights)
  int ctx = 0;             // tokens per session
  int sessions = 1;
  std::optional<double> max_kld;  // a quality floor: the smallest spec whose KLD <= this
  // Rung 0's chunk (tokens), doubled until every candidate's policies act
  // in it (Rung0Chunk); each later rung doubles it up to the last rung's
  // chunk, min(ctx, max_chunk) (0: ctx, the length the budget counts).
  int first_chunk = 512;
  int max_chunk = 0;
  int LastChunk() const { return max_chunk > 0 ? std::min(ctx, max_chunk) : ctx; }
  int finalists = 3;
  int eta = 3;   // each rung keeps the best 1/eta
  int batch = 6; // candidates measured per pass (the stop hook is polled between passes)
  std::vector<std::string> space;  // the candidate specs; empty: DefaultTuneSpace(heads)
  TuneHeadTables heads;            // head typing in the default space (none: left out)
  // Retrieval tasks (none: KLD only); length 0: --ctx, at most the model's
  // trained context.
  RetrievalSettings retrieval;
  // Every finalist and the compared specs answer every retrieval prompt,
  // instead of the finalists one at a time until one holds.
  bool compare_retrieval = false;
  // "Equal quality" (issue 37): KLD on unseen text within this bound (the
  // quality floor when there is one) and retrieval not worse than f16's.
  double equal_kld = 0.01;
  double EqualKld() const { return max_kld.value_or(equal_kld); }
};

// One KLD measurement of a spec (KL(f32 || spec) per scored position).
struct TuneMeasure {
  int chunk = 0, n_chunks = 0;
  double kld = 0, kld_stderr = 0, top1 = 0;
  uint64_t kv_bytes = 0;  // the pool's bytes at the end of a chunk (measured), and its tokens
  int64_t kv_tokens = 0;
  std::string error;  // the spec failed to run (then it ranks last)
  // Each scored position's KL in text order (not in the JSON): specs
  // measured on the same chunks compare position by position.
  std::vector<float> kl{};
};

// A candidate's KLD against the chosen spec's on the same positions (the
// deepest rung both reached): diff = candidate - chosen, so > 0 means the
// chosen spec is better there; a paired t test on blocks of 32 positions
// (fewer on measures shorter than 512 positions: at least 16 blocks; stats.h
// PairedBlockDifference); verdict of the candidate against the
// chosen: "better", "worse" or "indistinguishable".
struct TunePaired {
  int rung = 0, chunk = 0, n_chunks = 0;
  double diff = 0, lo95 = 0, hi95 = 0, p = 1;
  int64_t blocks = 0;
  std::string verdict;
};

struct TuneCandidate {
  std::string spec;    // canonical (KVSpec::ToString)
  std::string origin;  // "space" or "per-layer descent"
  std::string family;  // "codec" (no policy), "policy" (f16 + policies) or "codec+policy"
  bool defaults = false;  // a bare "codec=X" of the space: the codec at its default settings
  uint64_t bytes = 0;  // steady-state: SteadyStateBytes
  std::vector<TuneMeasure> search;     // one per rung reached, on the search text
  std::optional<TuneMeasure> holdout;  // finalists: on the text the search did not see
  std::optional<RetrievalVerdict> retrieval;  // with retrieval tasks: those checked
  std::optional<TunePaired> vs_chosen;        // every candidate but the chosen one
  bool Rejected() const { return retrieval && retrieval->verdict == "worse"; }
};

// The f16 cache on the retrieval prompts, and the specs compared.
struct TuneRetrieval {
  int n = 0, hits = 0, length = 0;
  Interval interval;
  double seconds = 0;
  // The best spec (lowest rung-0 KLD) of each single family that fits, by
  // role ("codec only", "policy only", "defaults"): indices into candidates.
  std::vector<std::pair<std::string, int>> compared;
};

struct TuneResult {
  std::vector<TuneCandidate> candidates;  // those that fit, space order, then the descent's
  int chosen = -1;                        // index into candidates; -1: nothing measured
  std::vector<int> finalists;             // indices, best first
  std::vector<int> pareto;                // bytes vs rung-0 KLD, bytes ascending
  bool stopped = false;                   // chosen is the best so far
  std::string stop_reason;
  int space_size = 0;       // specs in the space that resolve for this model
  uint64_t f16_bytes = 0;   // the same sessions x ctx in f16
  int rungs = 0;            // rungs completed
  double seconds = 0;
  std::optional<TuneRetrieval> retrieval;  // with retrieval tasks, once they ran
};

// KLD within options.EqualKld() (on unseen text when measured) and
// retrieval not worse than f16 (when measured; unmeasured: unknown, false).
bool EqualQuality(const TuneCandidate& c, const TuneOptions& options);

struct TuneHooks {
  std::function<std::string()> stop;                 // polled between passes: why to stop, "" to go on
  std::function<void(const TuneResult&)> on_update;  // after every pass
  ProgressBar* progress = nullptr;
  RetrievalScorer retrieval;  // null: ModelRetrievalScorer (kvx eval's tasks on the model)
};

// Codecs, their settings, policies and their combinations (docs/tune.md);
// with head tables, head typing (duo, razor) alone and on the codecs.
std::vector<std::string> DefaultTuneSpace(const TuneHeadTables& heads = {});

// The bytes of `sessions` sessions of ctx tokens: each session's pages in
// every (layer, kv head), residual and sink pages included
// (kv::BytesForContext), scaled by the policies' steady-state share
// (kv::SteadyStateBytesPerToken), except one session at its prefill peak
// (a compress-once policy holds the whole prompt until it compresses); the
// spec resolved against `layout` (InvalidArgument when it does not).
Result<uint64_t> SteadyStateBytes(const kv::KVSpec& spec, const kv::KVLayout& layout, int ctx, int sessions);

// Searches options.space on `text` (its end is kept for validation).
// InvalidArgument before anything runs for bad options, a text too short
// for the chunks, or a budget no spec fits (naming the smallest spec of the
// space and its bytes).
Result<TuneResult> RunTune(const model::Model& model, ThreadPool* threads, std::span<const int32_t> text,
                           const TuneOptions& options, const TuneHooks& hooks);

// The candidates measured on rung 0 as Pareto points (series: the
// candidate's index, x: steady-state bytes, y: KLD), and the indices of the
// non-dominated ones, bytes ascending (every candidate's rung-0 figure is
// measured alike, so the front compares like with like).
struct ParetoPoint;
std::vector<ParetoPoint> TuneRung0Points(const TuneResult& result, std::vector<int>* which);
std::vector<int> TuneFront(const TuneResult& result);

// Rung 0's chunk: the shortest first_chunk x 2^k (at most LastChunk) in
// which every spec's policies evict at least half the share of their codec's
// bytes they evict at ctx (kv::SteadyStateBytesPerToken at the 3/4 of the
// chunk the split protocol prefills), else LastChunk. A fixed window (duo's
// streaming heads keep 128 sinks + 256 recent tokens) evicts nothing in a
// chunk shorter than the window, so there every such spec would score like
// its codec alone; ratio policies evict their share at any length.
int Rung0Chunk(std::span<const kv::KVSpec> specs, const kv::KVLayout& layout, const TuneOptions& options);

// At the deepest rung, specs whose KLD is within error of the best one left
// tie: a paired t test on the same positions (the measures' per-position KL,
// stats.h PairedBlockDifference) does not find them worse at the 5% level;
// measures without positions fall back to the difference being at most the
// two standard errors combined, sqrt(a^2 + b^2). The tie is ordered
// smallest bytes first: on this evidence they do not differ in quality, and
// the bytes a smaller one frees hold more sessions. `ranked` (indices into candidates, ordered by KLD at rung r,
// errors and rejected specs last) is reordered group by group; a group is
// anchored on its best KLD, so ties do not chain.
void PreferSmallerWithinError(std::vector<int>* ranked, const std::vector<TuneCandidate>& candidates, size_t r);

// Candidate m's KLD against `best`'s on the same positions (nullopt when
// their positions differ or are missing).
std::optional<PairedDifference> PairedKld(const TuneMeasure& best, const TuneMeasure& m);

// What RunTune needs of the text: tokens for the search and the validation.
int64_t TuneTextTokens(const TuneOptions& options);

// Reports (tune_report.cc). The JSON is what --kv @FILE reads: the chosen
// spec under kv::kSpecFileKey, then the provenance (`about`: model, budget,
// text...), the finalists and the Pareto front.
std::string TuneResultJson(const TuneResult& result, const TuneOptions& options, const std::string& about_json);
std::string TuneParetoSvg(const TuneResult& result);
std::string TuneSummary(const TuneResult& result, const TuneOptions& options);

}  // namespace kvx::eval
