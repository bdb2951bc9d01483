// kvx tune's head tables. Head typing (policy=duo, policy=razor) needs a
// per-model table of retrieval scores (eval/head_calibration.h); tune loads
// it from a file, or calibrates it once and writes it there (by default in
// the tune cache, named by the model's fingerprint, so a second tune of the
// same model reuses it). The calibration data is disjoint from what tune
// scores: duo on the copy task over natural text no eval task reads (the
// Jargon File by default: not the KLD text, not the retrieval prompts),
// razor on random tokens (data-free).
//
// Thread-safety: one call at a time per model (it creates an engine on it).
#pragma once

#include <cstdint>
#include <string>

#include "eval/head_calibration.h"
#include "model/model.h"
#include "util/status.h"
#include "util/thread_pool.h"

namespace kvx::eval {

// "<fingerprint>-heads-duo-copy.json" / "<fingerprint>-heads-razor.json":
// a name the tune cache's result look-up (tune_cache.h) never matches.
std::string TuneHeadTableName(uint64_t fingerprint, const HeadCalibrationOptions& options);

// The table at `path`: loaded when the file exists (it must fit the
// model's layers and kv heads), else calibrated on `model` with `options`
// (its lengths capped at the model's trained context) and written there
// (directories created). `*calibrated` says which happened. InvalidArgument
// for a path a --kv spec cannot hold (',' or ';'), or a table of another
// shape, naming the file.
Result<std::string> EnsureHeadTable(const model::Model& model, ThreadPool* threads, const std::string& path,
                                    HeadCalibrationOptions options, bool* calibrated);

}  // namespace kvx::eval
