#include "eval/speed_bench.h"

#include <gtest/gtest.h>

namespace kvx::eval {
namespace {

// A report with every section filled as RunSpeedBench fills them (speeds and
// bytes measured), and a bound whose 256 MiB reading is slower than its
// re-read one, as on a machine whose caches keep part of the weights.
SpeedBenchResult Report() {
  SpeedBenchResult r;
  r.decode_weight_bytes = 140e6;
  r.matmul_ops_per_token = 2 * 135e6;
  r.attention_ops_per_entry = 4.0 * 30 * 9 * 64;
  r.bound.bandwidth.read_gbps = 31.3;
  r.bound.stream_read_gbps = 39.5;
  r.bound.read_gbps = 39.5;
  r.bound.peak.gflops = 400;
  r.bound.peak_int8.gops = 1600;
  r.bound.matmul_int8 = true;
  r.prefill_gflops = 500;
  r.prefill_matmul_ops = 512 * r.matmul_ops_per_token;
  r.prefill_attention_ops = r.attention_ops_per_entry * 512 * 513 / 2;
  for (int depth : {0, 4096}) {
    DepthResult d;
    d.depth = depth;
    d.decode_tok_s = 200;
    d.bytes_per_token = r.decode_weight_bytes + depth * 23400.0;
    r.depths.push_back(d);
    for (int seqs : {1, 8, 32}) {
      BatchDecodeResult b;
      b.seqs = seqs;
      b.depth = depth;
      b.total_tok_s = 200.0 * seqs;
      b.bytes_per_step = r.decode_weight_bytes + seqs * depth * 23400.0;
      r.batch.push_back(b);
    }
  }
  r.ComputeBounds();
  return r;
}

TEST(SpeedBenchTest, EverySectionDividesByTheRunsOneBandwidth) {
  const SpeedBenchResult r = Report();
  for (const DepthResult& d : r.depths) {
    EXPECT_EQ(d.bound_gbps, r.bound.read_gbps) << "decode at depth " << d.depth;
    EXPECT_DOUBLE_EQ(d.bound_tok_s, r.bound.read_gbps * 1e9 / d.bytes_per_token);
  }
  for (const BatchDecodeResult& b : r.batch) {
    EXPECT_EQ(b.bound_gbps, r.bound.read_gbps) << b.seqs << " sequences at depth " << b.depth;
  }
  const nlohmann::json j = r.ToJson();
  for (const auto& d : j["decode"]) EXPECT_EQ(d["bound_gbps"], j["bound"]["read_gbps"]);
  for (const auto& b : j["batch"]) EXPECT_EQ(b["bound_gbps"], j["bound"]["read_gbps"]);
}

// The same speed over the same bytes reads the same % of bound in the decode
// section and in the batch section's one-sequence rows.
TEST(SpeedBenchTest, OneSequenceReadsTheSamePercentInDecodeAndBatchSections) {
  const SpeedBenchResult r = Report();
  for (const DepthResult& d : r.depths) {
    const BatchDecodeResult* one = nullptr;
    for (const BatchDecodeResult& b : r.batch) {
      if (b.seqs == 1 && b.depth == d.depth) one = &b;
    }
    ASSERT_NE(one, nullptr);
    ASSERT_EQ(one->bound_kind, "memory");
    EXPECT_DOUBLE_EQ(one->bound_tok_s, d.bound_tok_s) << "depth " << d.depth;
    EXPECT_DOUBLE_EQ(one->pct_of_bound, d.pct_of_bound) << "depth " << d.depth;
  }
}

// Prefill and the batch's compute bound use the run's peaks: the matmuls at
// the int8 peak, attention at the FMA peak.
TEST(SpeedBenchTest, ComputeBoundsUseTheRunsPeaks) {
  const SpeedBenchResult r = Report();
  const double mm = r.prefill_matmul_ops, at = r.prefill_attention_ops;
  const double prefill_bound = (mm + at) / (mm / 1600 + at / 400);
  EXPECT_NEAR(r.prefill_bound_gops, prefill_bound, 1e-9 * prefill_bound);
  EXPECT_NEAR(r.prefill_pct_of_bound, 100 * 500 / prefill_bound, 1e-9);
  EXPECT_NEAR(r.prefill_pct_of_peak, 100 * 500.0 / 1600, 1e-9);
  for (const BatchDecodeResult& b : r.batch) {
    const double step_s = b.seqs * (r.matmul_ops_per_token / 1600e9 + r.attention_ops_per_entry * (b.depth + 1) / 400e9);
    EXPECT_NEAR(b.compute_bound_tok_s, b.seqs / step_s, 1e-9 * b.seqs / step_s);
    EXPECT_EQ(b.bound_tok_s, std::min(b.memory_bound_tok_s, b.compute_bound_tok_s));
  }
}

TEST(SpeedBenchTest, MergeKeepsTheBetterReadingOfEachProbe) {
  RunBound a, b;
  a.bandwidth.read_gbps = 30;
  a.stream_read_gbps = 41;
  a.read_gbps = 41;
  a.peak.gflops = 200;
  a.peak_int8.gops = 1700;
  b.bandwidth.read_gbps = 35;
  b.stream_read_gbps = 38;
  b.read_gbps = 38;
  b.peak.gflops = 420;
  b.peak_int8.gops = 900;
  const RunBound m = MergeRunBounds(a, b);
  EXPECT_EQ(m.bandwidth.read_gbps, 35);
  EXPECT_EQ(m.stream_read_gbps, 41);
  EXPECT_EQ(m.read_gbps, 41);
  EXPECT_EQ(m.peak.gflops, 420);
  EXPECT_EQ(m.peak_int8.gops, 1700);
}

}  // namespace
}  // namespace kvx::eval
