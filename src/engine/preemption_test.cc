#include "engine/preemption.h"

#include <gtest/gtest.h>

namespace kvx::engine {
namespace {

TEST(PreemptionTest, ParsesTheModesAndRefusesOthers) {
  EXPECT_EQ(ParsePreemptMode("auto").value(), PreemptMode::kAuto);
  EXPECT_EQ(ParsePreemptMode("swap").value(), PreemptMode::kSwap);
  EXPECT_EQ(ParsePreemptMode("recompute").value(), PreemptMode::kRecompute);
  const Result<PreemptMode> bad = ParsePreemptMode("Swap");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("\"auto\""), std::string::npos) << bad.status().message();
}

// 1 MB at 1 GB/s moves out and back in 2 ms; 100 tokens at 1 ms recompute
// in 100 ms: swap. The same bytes at 10 MB/s (200 ms): recompute.
TEST(PreemptionTest, ChoosesTheCheaperWay) {
  PreemptCost c{.bytes = 1000000, .tokens = 100, .copy_bytes_per_second = 1e9, .prefill_seconds_per_token = 1e-3};
  EXPECT_DOUBLE_EQ(c.SwapSeconds(), 0.002);
  EXPECT_DOUBLE_EQ(c.RecomputeSeconds(), 0.1);
  EXPECT_EQ(ChoosePreemption(c), PreemptKind::kSwap);
  c.copy_bytes_per_second = 1e7;
  EXPECT_EQ(ChoosePreemption(c), PreemptKind::kRecompute);
  c.copy_bytes_per_second = 1e9;
  c.prefill_seconds_per_token = 1e-6;  // a tiny model: 0.1 ms to recompute beats 2 ms of copies
  EXPECT_EQ(ChoosePreemption(c), PreemptKind::kRecompute);
}

TEST(PreemptionTest, AnUnknownSpeedRecomputes) {
  EXPECT_EQ(ChoosePreemption({.bytes = 1, .tokens = 1000, .copy_bytes_per_second = 0, .prefill_seconds_per_token = 1}),
            PreemptKind::kRecompute);
  EXPECT_EQ(ChoosePreemption({.bytes = 1, .tokens = 1000, .copy_bytes_per_second = 1e9, .prefill_seconds_per_token = 0}),
            PreemptKind::kRecompute);
}

TEST(PreemptionTest, MeasuresAPositiveBandwidth) { EXPECT_GT(MeasureCopyBandwidth(1 << 20), 1e6); }

}  // namespace
}  // namespace kvx::engine
