// kvx bench with several --kv specs: decode speed of each spec at the same
// depths in one process, in interleaved rounds (A, B, C, A, B, C, ...), so
// a change of load on a shared machine reaches every spec alike and the
// ratio between two specs is a ratio inside one run. docs/benchmarks.md.
//
// Each spec gets its own engine over the one model and thread pool, and one
// session per depth filled once (FillDepth: synthetic entries without a
// policy; with one, a real forward pass and the compression moment, so the
// decode runs over what the policy kept). A round decodes `gen_tokens`
// tokens of every spec in turn, continuing where the last round stopped;
// its speed is 1 / the median time per token. Per spec: the median over
// rounds, and the median over rounds of its speed / the first spec's speed
// in the same round.
//
// Thread-safety: runs the model on the given pool; one call at a time.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kv/kv_spec.h"
#include "model/model.h"
#include "util/status.h"
#include "util/thread_pool.h"

namespace kvx::eval {

struct DecodeCompareOptions {
  std::vector<int> depths = {8192};
  int gen_tokens = 16;  // decoded tokens per spec and round
  int rounds = 3;
  uint64_t seed = 1;
};

struct DecodeCompareRow {
  std::string spec;  // canonical
  int depth = 0;
  double kv_bytes = 0;                // the pool's bytes in use after the last round
  std::vector<double> round_tok_s;    // one per round, in order
  double tok_s = 0;                   // median of round_tok_s
  double vs_first = 0;                // median over rounds of tok/s / the first spec's in that round
};

struct DecodeCompareResult {
  std::string model;
  int threads = 0, gen_tokens = 0, rounds = 0;
  std::vector<DecodeCompareRow> rows;  // depth-major, specs in the order given
  // The spec index of every round measured, in the order run (interleaving
  // made visible: 0, 1, 2, 0, 1, 2, ... at each depth).
  std::vector<int> order;

  nlohmann::json ToJson() const;
  std::string ToTable() const;  // Markdown
};

// InvalidArgument when a spec does not resolve for the model or the engine
// cannot hold max(depths) + rounds x gen_tokens tokens.
Result<DecodeCompareResult> RunDecodeCompare(const model::Model& model, ThreadPool* threads,
                                             const std::vector<kv::KVSpec>& specs, const DecodeCompareOptions& options);

}  // namespace kvx::eval
