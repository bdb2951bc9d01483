// Head calibration for the head-typing policies (kv/policy/head_typing.h):
// one score per (layer, kv-head) saying how much that head retrieves, saved
// as a HeadTable for policy=duo / policy=razor.
//
//  duo    DuoAttention trains a gate per kv head to minimise the deviation
//         of the attention output when the head keeps only sinks + recent
//         tokens (streaming). kvx trains nothing: it measures, per query
//         head, the attention a streaming head would drop (on positions
//         outside the first `sinks` and the last `window`). With streaming,
//         o_full - o_stream = m (o_dropped - o_stream), m the dropped mass:
//         the output moves by m times how far the dropped tokens' mean value
//         lies from the kept ones'. Spread evenly over the far context
//         (early layers) that mean is close to the kept one; a spike on a few
//         tokens is not. So the score counts the dropped mass above the
//         uniform share, sum over dropped j of max(0, p_j - 1/n); a kv head's
//         score is the max over its query heads of its mean over the
//         observed queries (a kv head is retrieval if any of its query heads
//         is). The queries observed are those that need the far
//         context, on calibration data `calib`:
//           copy     (default) a span of natural text (`text`, which no eval
//                    task uses) repeated after a gap longer than the window,
//                    teacher forced: the queries that predict the repeat;
//           passkey  llama.cpp's passkey prompts, teacher forced: the
//                    queries that predict the key (the family kvx eval's
//                    passkey task scores: a leak, kept for comparison).
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
  std::string calib = "copy";                          // duo: copy | passkey
  std::string text;                                    // duo copy: the text's content (not a path)
  std::vector<int> lengths = {1024, 2048};             // duo: prompt lengths (tokens)
  std::vector<double> depths = {0.1, 0.3, 0.5, 0.7, 0.9};  // duo: depth of the key / the span's original
  int trials = 1;                                      // duo: prompts per (length, depth)
  int sinks = 128, window = 256;                       // duo: the streaming head's sinks + window
  int copy_span = 64;                                  // duo copy: tokens repeated
  int span = 128;                                      // razor: random tokens per copy
  int repeats = 4;                                     // razor: copies
  uint64_t seed = 1;
};

// InvalidArgument for an unknown method or data, a copy text too short, or
// prompts that do not fit the engine's context.
Result<kv::HeadTable> CalibrateHeads(engine::Engine& engine, const HeadCalibrationOptions& options);

}  // namespace kvx::eval
