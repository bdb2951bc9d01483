// Head calibration for the head-typing policies (kv/policy/head_typing.h):
// one score per (layer, kv-head) saying how much that head retrieves, saved
// as a HeadTable for policy=duo / policy=razor.
//
//  duo    DuoAttention optimizes a gate per kv head by training (an MSE
//         between full and sink+window attention outputs on passkey
//         prompts, L1-regularized). kvx substitutes a calibration pass
//         without training: llama.cpp's passkey prompts (eval/prompts.h) at
//         the given lengths and depths are run, and at the last prompt
//         token (the one that predicts the key's first digit) each query
//         head's attention mass on the key's digit tokens is measured; a
//         kv head's score is the max over its query heads of the mean mass
//         (a kv head is retrieval if any of its query heads is).
//  razor  RazorAttention's data-free criterion: `repeats` copies of a span
//         of `span` random tokens; over the last copy's queries, each query
//         head's mean attention to earlier copies of the current token
//         (echo) and to the tokens right after them (induction); a head's
//         score is max(echo, induction), a kv head's the max over its
//         query heads. (The paper protects the top induction heads and the
//         top echo heads separately; one ranking of the max is used here.)
//
// The engine is used as is (its KV spec should keep every entry: no
// policy); the probe is added to its KV manager as a policy with an
// observer, so it stays with the engine.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "kv/policy/head_typing.h"
#include "util/status.h"

namespace kvx::eval {

struct HeadCalibrationOptions {
  std::string method = "duo";                          // duo | razor
  std::vector<int> lengths = {1024, 2048};             // duo: prompt lengths (tokens)
  std::vector<double> depths = {0.1, 0.3, 0.5, 0.7, 0.9};  // duo: key depths
  int trials = 1;                                      // duo: prompts per (length, depth)
  int span = 128;                                      // razor: random tokens per copy
  int repeats = 4;                                     // razor: copies
  uint64_t seed = 1;
};

// InvalidArgument for an unknown method or prompts that do not fit the
// engine's context.
Result<kv::HeadTable> CalibrateHeads(engine::Engine& engine, const HeadCalibrationOptions& options);

}  // namespace kvx::eval
