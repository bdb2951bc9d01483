// The analytical deployment model of "Challenges in Deploying Long-Context
// Transformers: A Theoretical Peak Performance Analysis" (Yao Fu, 2024),
// applied to a CPU and a KV spec. Everything follows from the model's shape,
// the spec's bytes per token and two measured machine numbers:
//
//   kv_per_seq    = kv_bytes_per_token * ctx
//   concurrency   = floor((mem - weights) / kv_per_seq)          sequences that fit
//   prefill_time  = matmul ops / matmul peak                     compute-bound
//                 + attention ops / FMA peak
//   decode_step   = (decode weights + concurrency * kv_per_seq) / bandwidth
//   throughput    = concurrency / decode_step                     tokens/s, all sequences
//   switch_time   = kv_per_seq / tier bandwidth                   offload one sequence's KV
//
// The paper has one peak (a GPU's tensor cores run both). On a CPU the
// matmuls on quantized weights run int8 dot products (vpdpbusd: ~4x the f32
// FMA rate) while attention runs f32 FMAs on every KV codec, so each kind of
// op is bounded by its own measured peak. With one int8 peak for both, a
// 32k-token SmolLM2-135M prefill (attention ~85% of its ops) came out ~3x
// too fast.
//
// Compressing the KV cache raises concurrency, shortens the decode step and
// the context switch; it leaves prefill alone. These are bounds (100% of
// peak); `kvx plan --measure` prints measured numbers beside them.
// Thread-safety: pure functions.
#pragma once

#include <string>

namespace kvx::eval {

struct PlanInputs {
  // Model.
  std::string model;
  int n_layers = 0, n_heads = 0, head_dim = 0, n_embd = 0, n_vocab = 0;
  double weight_bytes = 0;         // resident weights
  double decode_weight_bytes = 0;  // read per decode step
  double matmul_flops_per_token = 0;
  double kv_bytes_per_token = 0;   // for the KV spec at ctx: kv::SteadyStateBytesPerToken (policies included)
  std::string kv_spec;
  // Deployment.
  long ctx = 0;
  double mem_bytes = 0;
  // Machine (measured).
  double bandwidth_gbps = 0;
  double matmul_peak_gops = 0;  // the arithmetic the matmuls run: int8 dot products or f32 FMAs
  bool matmul_peak_is_int8 = false;
  double fma_peak_gflops = 0;   // f32 FMA: attention
  double tier_gbps = 0;  // bandwidth to the tier a switched-out sequence goes to
};

struct PlanResult {
  double kv_per_seq_bytes = 0;
  long concurrency = 0;
  double prefill_flops = 0;            // all ops, a multiply-add counting 2
  double prefill_attention_flops = 0;  // the part run at the FMA peak
  double prefill_seconds = 0;
  double prefill_tok_s = 0;
  double decode_step_seconds = 0;       // at full concurrency
  double decode_throughput_tok_s = 0;   // at full concurrency
  double single_decode_tok_s = 0;       // one sequence at depth ctx
  double switch_seconds = 0;
  std::string ToString(const PlanInputs& in) const;
};

PlanResult ComputePlan(const PlanInputs& in);

// Ops to prefill n tokens from an empty cache, a multiply-add counting 2:
// the layers' matmuls and one output row, and causal attention (QK^T and
// PV: 4 * layers * heads * head_dim * n(n+1)/2).
struct PrefillOps {
  double matmul = 0;
  double attention = 0;
  double Total() const { return matmul + attention; }
};
PrefillOps CountPrefillOps(const PlanInputs& in, double n);

// Seconds to prefill n tokens at the peaks: matmul ops at matmul_peak_gops,
// attention ops at fma_peak_gflops (0 when a peak is unknown).
double PrefillBoundSeconds(const PlanInputs& in, double n);

}  // namespace kvx::eval
