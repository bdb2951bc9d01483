// Internal to RunEval (eval_runner.cc): the ppl/kld pass over the text, chunk
// by chunk over every spec, and the KV measurement every task takes after a
// sequence (pool bytes, tokens, live-slot fraction). Kept apart from the
// runner, which plans the inputs and runs the generation tasks.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "engine/session.h"
#include "eval/eval.h"
#include "kv/sequence_kv.h"
#include "model/model.h"

namespace kvx::eval {

// One spec under evaluation: its engine and the one session it runs in.
struct EvalRun {
  engine::Engine* engine = nullptr;
  engine::Session* session = nullptr;
};

// Live entries over the slots of the pages listed (fragmentation after
// eviction; a page listed by two tables, MiniCache's, counts in both). 1 for
// a sequence with no pages.
double LiveSlotFraction(const kv::SequenceKV& seq);

// Records the run's KV footprint now (KvMeasure::Observe keeps the larger):
// the pool's pages, plus what a cache keeps beside its tables (entry scales,
// key-channel masks), the session's tokens and its live-slot fraction.
void ObserveKv(const EvalRun& run, uint64_t f16_bytes_per_token, KvMeasure* kv);

// What ppl and kld report of one run.
struct TextTaskResult {
  std::optional<PplResult> ppl;  // when Task::kPpl is asked
  std::optional<KldResult> kld;  // when Task::kKld is asked, for every run but the baseline
  double seconds = 0;            // time spent on this run's chunks
};

// Progress of the pass: the label of the run starting a chunk, and the
// weight (tokens) of each chunk done or skipped.
struct TextPassHooks {
  std::function<void(size_t run, std::string_view task)> set_label;
  std::function<void(double weight)> advance;
};

// ppl (and kld against runs[0], the baseline) over the first n_chunks chunks
// of opt.chunk tokens of `text`, chunk-major: each chunk runs on every spec
// before the next, so the baseline's distributions are held for one chunk at
// a time. Uses the split protocol (EvalOptions::compress, kld_context) when
// some spec has a policy and compression is on. A run that fails keeps its
// first error and skips its remaining chunks; the others go on.
std::vector<TextTaskResult> RunTextTasks(const model::Model& model, const EvalOptions& opt,
                                         std::span<const int32_t> text, int n_chunks, std::span<const EvalRun> runs,
                                         uint64_t f16_bytes_per_token, const TextPassHooks& hooks);

}  // namespace kvx::eval
