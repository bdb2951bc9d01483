// Speed benchmark behind `kvx bench`: prefill and decode speed at several
// context depths, with the roofline measured in the same run, so every
// number comes with the bound it should be judged against.
//
// One bound per run (RunBound): every section divides by the same read
// bandwidth and the same peaks, probed twice (before and after the timed
// sections, the best of each kept: on a shared VM one probe can land in
// another job's burst). The bandwidth is the faster of the 256 MiB probe and
// a probe re-reading the decode weights' bytes (MeasureStreamReadGbps):
// caches that keep part of a token's bytes for the next token speed decode
// up, and the bound must include them; a row that reads more bytes is
// measured against that same (generous) rate, so no section reads above
// another's bound for the same speed.
//
// Decode at depth D: the cache is filled with D entries of random K/V
// (Session::AppendSyntheticKV; decode cost depends on the cached bytes, not
// their values), then tokens are decoded one at a time. Each decoded token
// must read the decode weights (Model::DecodeWeightBytesPerToken) plus every
// cached KV byte; the run's bandwidth / those bytes is its bound.
// Prefill: a batch of random tokens from an empty cache; ops = matmuls +
// one output row + attention (QK^T and PV over the causal triangle), a
// multiply-add counting 2 (plan.h CountPrefillOps). Its bound gives each kind
// of op its own measured peak (plan.h PrefillBoundSeconds): the matmuls the
// arithmetic they run (roofline.h UsesInt8Dot: the int8 dot-product peak when
// most matmul multiply-adds are on quantized weights, Q8_0, Q4_0, Q4_K, Q5_K,
// Q6_K with int8 activations, else the f32 FMA peak), attention the f32 FMA
// peak, since it runs float FMAs on every KV codec. Prefill is also reported
// against the matmul peak alone, the stricter figure.
//
// Thread-safety: uses the runtime's pool and threads; one at a time.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/session.h"
#include "eval/cpu_report.h"
#include "eval/plan.h"
#include "eval/roofline.h"
#include "util/step_profile.h"

namespace kvx::eval {

struct SpeedBenchOptions {
  std::vector<int> depths = {0, 1024, 4096, 8192};
  int prompt_tokens = 512;  // prefill batch
  int gen_tokens = 16;      // decoded tokens per repetition and depth
  int reps = 3;             // repetitions; medians are reported
  uint64_t seed = 1;
  // Batched decode (kvx bench --seqs): N concurrent sessions at each of
  // seq_depths, one token each per engine step; empty = not measured.
  std::vector<int> seqs;
  std::vector<int> seq_depths = {0, 4096};
  // kvx bench --profile: time the op groups of every step (util/step_profile.h).
  bool profile = false;
};

// Where a step's time went (kvx bench --profile): milliseconds per step in
// each phase, measured over the timed steps of one configuration.
struct StepProfileResult {
  bool measured = false;
  double step_ms = 0;  // mean wall time of a step, sampling included
  std::array<double, util::kStepPhases> phase_ms{};
  double observer_thread_ms = 0;  // observer callbacks summed over threads (part of attention)
  double unaccounted_ms() const;  // step_ms minus the phases: the bench loop's own time
  // From the totals of `steps` steps that took `wall_s` seconds in all.
  static StepProfileResult From(const util::StepProfileTotals& t, int steps, double wall_s);
  nlohmann::json ToJson() const;
};

// Decode of N concurrent sequences at one depth: every step runs one token
// of each through one batched forward pass (weights read once per step).
// Bound: a step must read the decode weights once plus every sequence's KV
// bytes (at the bandwidth bound), and run N tokens' matmul ops at the
// matmul peak plus their attention ops at the FMA peak; the bound is the
// slower of the two (roofline), in tokens/s over all sequences.
struct BatchDecodeResult {
  int seqs = 0;
  int depth = 0;
  double total_tok_s = 0;    // median over steps: seqs / step time
  double per_seq_tok_s = 0;  // total_tok_s / seqs
  double kv_bytes = 0;       // measured: pool bytes in use, all sequences
  double bytes_per_step = 0; // decode weights + kv_bytes
  double bound_gbps = 0;     // the run's RunBound::read_gbps
  double memory_bound_tok_s = 0;
  double compute_bound_tok_s = 0;
  double bound_tok_s = 0;    // min of the two
  std::string bound_kind;    // "memory" or "compute"
  double pct_of_bound = 0;
  StepProfileResult profile;
};

struct DepthResult {
  int depth = 0;
  double decode_tok_s = 0;      // median
  double kv_bytes = 0;          // measured: pool bytes in use at this depth (after compression with policies)
  double rss_bytes = 0;         // process resident set during the decode (CurrentRssBytes)
  double bytes_per_token = 0;   // decode weights + kv_bytes
  double bound_gbps = 0;        // the run's RunBound::read_gbps
  double bound_tok_s = 0;       // bound_gbps / bytes_per_token
  double pct_of_bound = 0;
};

// What the machine can do, measured once per run; every section's bound
// divides by these (SpeedBenchResult::ComputeBounds).
struct RunBound {
  double read_gbps = 0;         // max(bandwidth.read_gbps, stream_read_gbps)
  double stream_read_gbps = 0;  // re-reading the decode weights' bytes
  BandwidthResult bandwidth;    // the 256 MiB probes
  PeakFlopsResult peak;         // f32 FMA
  PeakInt8Result peak_int8;     // int8 dot products
  bool matmul_int8 = false;     // the matmuls run at the int8 peak (else the FMA peak)
  double matmul_peak_gops() const { return matmul_int8 ? peak_int8.gops : peak.gflops; }
};

// Probes the run's bound: the bandwidth (256 MiB and re-reading
// `decode_bytes`) and both peaks. Merge keeps the better of two readings.
RunBound MeasureRunBound(ThreadPool* pool, double decode_bytes, double int8_matmul_fraction);
RunBound MergeRunBounds(const RunBound& a, const RunBound& b);

struct SpeedBenchResult {
  std::string model;
  std::string kv_spec;
  int threads = 0;
  double weight_bytes = 0;          // whole file's tensors
  double decode_weight_bytes = 0;   // read per decoded token
  double kv_bytes_per_token = 0;    // kv::BytesPerToken for the spec
  double matmul_ops_per_token = 0;  // the layers' matmuls and the output head, a multiply-add counting 2
  double attention_ops_per_entry = 0;  // q.K and p.V per cached entry and token, every head and layer
  RunBound bound;                   // the one bound every section divides by
  std::string simd_target;          // what ops/ kernels dispatch to (ops::ActiveSimdTarget)
  CpuReport cpu;                    // the CPU and the kernels chosen on it
  int prompt_tokens = 0;
  double prefill_tok_s = 0;         // median
  double prefill_gflops = 0;        // G ops/s: float or int8 multiply-adds count 2
  double int8_matmul_fraction = 0;  // share of matmul multiply-adds on int8-path weights
  double prefill_matmul_ops = 0;    // CountPrefillOps for prompt_tokens
  double prefill_attention_ops = 0;
  std::string prefill_peak_kind;    // "int8" or "fma": the matmuls' peak
  double prefill_bound_gops = 0;    // all ops / PrefillBoundSeconds
  double prefill_pct_of_bound = 0;
  double prefill_pct_of_peak = 0;   // against the matmul peak alone
  StepProfileResult prefill_profile;  // per prefill of prompt_tokens (--profile)
  std::vector<DepthResult> depths;
  std::vector<BatchDecodeResult> batch;
  double peak_rss_bytes = 0;

  // Fills every section's bound and % of bound from `bound` and the
  // measured speeds and bytes: the one place a bound is computed.
  void ComputeBounds();

  nlohmann::json ToJson() const;
  std::string ToTable() const;  // Markdown
  std::string ProfileTable() const;  // Markdown; empty without --profile
};

// REQUIRES: runtime->n_ctx() >= max(depths, seq_depths) + gen_tokens + 1 and
// >= prompt_tokens; the engine's pool sized for max(seqs) sequences.
Result<SpeedBenchResult> RunSpeedBench(engine::Engine* runtime, const SpeedBenchOptions& options);

// The model and spec half of the plan inputs (machine and deployment fields
// left for the caller).
PlanInputs ModelPlanInputs(const engine::Engine& runtime);

// Share of the model's per-token matmul multiply-adds (the blk.* attention
// and FFN projections) whose weights ops/ computes with int8 dot products.
double Int8MatmulFraction(const model::Model& model);

// Brings `session` to `depth` cached entries. Without KV policies the
// entries are synthetic (decode cost depends on the cached bytes, not their
// values, and an 8k prefill per repetition would dominate the run). With
// policies the depth is a real forward pass over random tokens from `rng`,
// so the scorers see real attention, followed by the explicit compression
// moment: the decode then runs over what the policy kept (and continuous
// policies keep acting during it), which is the point of measuring a policy.
Status FillDepth(engine::Engine* rt, engine::Session* session, int depth, uint64_t seed, std::mt19937* rng);

// The median of `v` (0 when empty; the mean of the middle two when even).
double Median(std::vector<double> v);

// Peak resident set size of this process so far (bytes).
double PeakRssBytes();

// Resident set size of this process now (bytes; 0 where /proc is absent).
double CurrentRssBytes();

}  // namespace kvx::eval
