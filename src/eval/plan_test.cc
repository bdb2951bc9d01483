#include "eval/plan.h"

#include <gtest/gtest.h>

namespace kvx::eval {
namespace {

TEST(PlanTest, FollowsTheModelsFormulas) {
  PlanInputs in;
  in.n_layers = 2;
  in.n_heads = 4;
  in.head_dim = 8;
  in.n_embd = 32;
  in.n_vocab = 100;
  in.weight_bytes = 1000;
  in.decode_weight_bytes = 900;
  in.matmul_flops_per_token = 50;
  in.kv_bytes_per_token = 10;
  in.ctx = 100;
  in.mem_bytes = 1000 + 3 * 1000 + 500;  // room for 3.5 sequences of 1000 bytes
  in.bandwidth_gbps = 1e-6;              // 1000 bytes/s
  in.matmul_peak_gops = 4e-6;            // 4000 ops/s
  in.fma_peak_gflops = 1e-6;             // 1000 FLOP/s
  in.tier_gbps = 1e-7;                   // 100 bytes/s
  const PlanResult r = ComputePlan(in);
  EXPECT_DOUBLE_EQ(r.kv_per_seq_bytes, 1000);
  EXPECT_EQ(r.concurrency, 3);
  const double matmul = 100 * 50 + 2.0 * 100 * 32, attention = 4.0 * 2 * 4 * 8 * (100 * 101 / 2);
  EXPECT_DOUBLE_EQ(r.prefill_flops, matmul + attention);
  EXPECT_DOUBLE_EQ(r.prefill_attention_flops, attention);
  // Each kind of op at its own peak.
  EXPECT_NEAR(r.prefill_seconds, matmul / 4000 + attention / 1000, 1e-9);
  EXPECT_NEAR(r.prefill_tok_s, 100 / r.prefill_seconds, 1e-9);
  EXPECT_NEAR(r.decode_step_seconds, (900 + 3000) / 1000.0, 1e-12);
  EXPECT_NEAR(r.decode_throughput_tok_s, 3 / 3.9, 1e-12);
  EXPECT_NEAR(r.single_decode_tok_s, 1000 / 1900.0, 1e-12);
  EXPECT_NEAR(r.switch_seconds, 10, 1e-9);
}

TEST(PlanTest, NothingFitsGivesZeroConcurrency) {
  PlanInputs in;
  in.weight_bytes = 2000;
  in.mem_bytes = 1000;
  in.kv_bytes_per_token = 1;
  in.ctx = 10;
  in.bandwidth_gbps = 1;
  in.matmul_peak_gops = in.fma_peak_gflops = 1;
  EXPECT_EQ(ComputePlan(in).concurrency, 0);
  EXPECT_EQ(ComputePlan(in).decode_throughput_tok_s, 0);
}

TEST(PlanTest, UnknownPeakGivesNoPrefillBound) {
  PlanInputs in;
  in.n_layers = in.n_heads = in.head_dim = 1;
  in.matmul_flops_per_token = 10;
  in.ctx = 10;
  in.matmul_peak_gops = 1;  // fma_peak_gflops unknown
  EXPECT_EQ(ComputePlan(in).prefill_seconds, 0);
  EXPECT_EQ(ComputePlan(in).prefill_tok_s, 0);
}

}  // namespace
}  // namespace kvx::eval
