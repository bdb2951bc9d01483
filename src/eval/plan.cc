#include "eval/plan.h"

#include <cmath>
#include <cstdio>

namespace kvx::eval {

PrefillOps CountPrefillOps(const PlanInputs& in, double n) {
  PrefillOps ops;
  ops.matmul = n * in.matmul_flops_per_token + 2.0 * in.n_vocab * in.n_embd;
  ops.attention = 4.0 * in.n_layers * in.n_heads * in.head_dim * (n * (n + 1) / 2);
  return ops;
}

double PrefillBoundSeconds(const PlanInputs& in, double n) {
  if (in.matmul_peak_gops <= 0 || in.fma_peak_gflops <= 0) return 0;
  const PrefillOps ops = CountPrefillOps(in, n);
  return ops.matmul / (in.matmul_peak_gops * 1e9) + ops.attention / (in.fma_peak_gflops * 1e9);
}

PlanResult ComputePlan(const PlanInputs& in) {
  PlanResult r;
  r.kv_per_seq_bytes = in.kv_bytes_per_token * static_cast<double>(in.ctx);
  const double room = in.mem_bytes - in.weight_bytes;
  r.concurrency = room > 0 && r.kv_per_seq_bytes > 0 ? static_cast<long>(std::floor(room / r.kv_per_seq_bytes)) : 0;
  const PrefillOps ops = CountPrefillOps(in, static_cast<double>(in.ctx));
  r.prefill_flops = ops.Total();
  r.prefill_attention_flops = ops.attention;
  r.prefill_seconds = PrefillBoundSeconds(in, static_cast<double>(in.ctx));
  r.prefill_tok_s = r.prefill_seconds > 0 ? in.ctx / r.prefill_seconds : 0;
  const double bw = in.bandwidth_gbps * 1e9;
  r.decode_step_seconds = (in.decode_weight_bytes + r.concurrency * r.kv_per_seq_bytes) / bw;
  r.decode_throughput_tok_s = r.concurrency > 0 ? r.concurrency / r.decode_step_seconds : 0;
  r.single_decode_tok_s = bw / (in.decode_weight_bytes + r.kv_per_seq_bytes);
  r.switch_seconds = in.tier_gbps > 0 ? r.kv_per_seq_bytes / (in.tier_gbps * 1e9) : 0;
  return r;
}

std::string PlanResult::ToString(const PlanInputs& in) const {
  char buf[2048];
  std::snprintf(buf, sizeof(buf),
                "model %s, KV `%s`, context %ld tokens, memory %.2f GiB\n"
                "machine: bandwidth %.1f GB/s, matmul peak %.1f %s, attention peak %.1f GFLOP/s (f32 FMA), "
                "tier %.2f GB/s\n\n"
                "| quantity | value |\n|---|---|\n"
                "| weights | %.1f MiB |\n"
                "| KV bytes per token (steady state: after the policies, side bytes included) | %.0f |\n"
                "| KV per sequence at context | %.1f MiB |\n"
                "| concurrency (sequences that fit) | %ld |\n"
                "| prefill of one context (compute bound) | %.3f s (%.0f tok/s, %.2f T ops, %.0f%% attention) |\n"
                "| decode step at full concurrency | %.2f ms |\n"
                "| decode throughput at full concurrency | %.1f tok/s |\n"
                "| decode, one sequence at full depth | %.1f tok/s |\n"
                "| context switch (one sequence's KV to the tier) | %.3f s |\n",
                in.model.c_str(), in.kv_spec.c_str(), in.ctx, in.mem_bytes / 1073741824.0, in.bandwidth_gbps,
                in.matmul_peak_gops, in.matmul_peak_is_int8 ? "GOP/s (int8 dot products)" : "GFLOP/s (f32 FMA)",
                in.fma_peak_gflops, in.tier_gbps,
                in.weight_bytes / 1048576.0, in.kv_bytes_per_token,
                kv_per_seq_bytes / 1048576.0, concurrency, prefill_seconds, prefill_tok_s, prefill_flops / 1e12,
                prefill_flops > 0 ? 100.0 * prefill_attention_flops / prefill_flops : 0.0,
                decode_step_seconds * 1e3, decode_throughput_tok_s, single_decode_tok_s, switch_seconds);
  return buf;
}

}  // namespace kvx::eval
