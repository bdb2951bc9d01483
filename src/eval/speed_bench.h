// Speed benchmark behind `kvx bench`: prefill and decode speed at several
// context depths, with the roofline measured in the same run, so every
// number comes with the bound it should be judged against.
//
// Decode at depth D: the cache is filled with D entries of random K/V
// (Session::AppendSyntheticKV; decode cost depends on the cached bytes, not
// their values), then tokens are decoded one at a time. Each decoded token
// must read the decode weights (Model::DecodeWeightBytesPerToken) plus every
// cached KV byte; bandwidth / those bytes is its bound.
// Prefill: a batch of random tokens from an empty cache; FLOPs = matmuls +
// attention (QK^T and PV over the causal triangle) + one output row.
//
// Thread-safety: uses the runtime's pool and threads; one at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/runtime.h"
#include "eval/plan.h"
#include "eval/roofline.h"

namespace kvx::eval {

struct SpeedBenchOptions {
  std::vector<int> depths = {0, 1024, 4096, 8192};
  int prompt_tokens = 512;  // prefill batch
  int gen_tokens = 16;      // decoded tokens per repetition and depth
  int reps = 3;             // repetitions; medians are reported
  uint64_t seed = 1;
};

struct DepthResult {
  int depth = 0;
  double decode_tok_s = 0;      // median
  double kv_bytes = 0;          // measured: pool bytes in use at this depth
  double bytes_per_token = 0;   // decode weights + kv_bytes
  double bound_tok_s = 0;       // read bandwidth / bytes_per_token
  double pct_of_bound = 0;
};

struct SpeedBenchResult {
  std::string model;
  std::string kv_spec;
  int threads = 0;
  double weight_bytes = 0;          // whole file's tensors
  double decode_weight_bytes = 0;   // read per decoded token
  double kv_bytes_per_token = 0;    // kv::BytesPerToken for the spec
  BandwidthResult bandwidth;
  PeakFlopsResult peak;
  int prompt_tokens = 0;
  double prefill_tok_s = 0;         // median
  double prefill_gflops = 0;
  double prefill_pct_of_peak = 0;
  std::vector<DepthResult> depths;
  double peak_rss_bytes = 0;

  nlohmann::json ToJson() const;
  std::string ToTable() const;  // Markdown
};

// REQUIRES: runtime->n_ctx() >= max(depths) + gen_tokens + 1 and >= prompt_tokens.
Result<SpeedBenchResult> RunSpeedBench(engine::Runtime* runtime, const SpeedBenchOptions& options);

// The model and spec half of the plan inputs (machine and deployment fields
// left for the caller).
PlanInputs ModelPlanInputs(const engine::Runtime& runtime);

// Peak resident set size of this process so far (bytes).
double PeakRssBytes();

}  // namespace kvx::eval
