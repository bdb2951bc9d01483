#include "eval/paired_test.h"

#include <gtest/gtest.h>

namespace kvx::eval {
namespace {

TEST(PairedTest, McNemarExactKnownValues) {
  // Two-sided exact binomial tail at p = 1/2, by hand: 2 * sum_{k<=min} C(n,k) / 2^n.
  EXPECT_DOUBLE_EQ(McNemarExactP(0, 0), 1.0);
  EXPECT_DOUBLE_EQ(McNemarExactP(1, 0), 1.0);              // 2 * 1/2
  EXPECT_NEAR(McNemarExactP(6, 0), 2.0 / 64, 1e-12);       // 0.03125
  EXPECT_NEAR(McNemarExactP(0, 6), 2.0 / 64, 1e-12);       // symmetric
  EXPECT_NEAR(McNemarExactP(5, 1), 14.0 / 64, 1e-12);      // 2 * (1 + 6) / 64
  EXPECT_NEAR(McNemarExactP(10, 5), 0.301758, 1e-6);       // R: binom.test(5, 15)$p.value
  // The user test: 18 of 46 retrievals lost, none gained.
  EXPECT_NEAR(McNemarExactP(18, 0), 2.0 / (1 << 18), 1e-15);
  // Large counts stay finite and in [0, 1].
  const double p = McNemarExactP(2000, 2000);
  EXPECT_GT(p, 0.9);
  EXPECT_LE(p, 1.0);
}

TEST(PairedTest, VerdictFollowsTheDiscordantPrompts) {
  const std::vector<uint8_t> full(46, 1);
  std::vector<uint8_t> lossy(46, 1);
  for (int i = 0; i < 18; ++i) lossy[i] = 0;
  PairedComparison c = ComparePaired(full, lossy);
  EXPECT_EQ(c.n, 46);
  EXPECT_EQ(c.reference_only, 18);
  EXPECT_EQ(c.candidate_only, 0);
  EXPECT_EQ(c.verdict, PairedVerdict::kWorse);
  EXPECT_EQ(PairedVerdictName(c.verdict), "worse");
  EXPECT_EQ(ComparePaired(lossy, full).verdict, PairedVerdict::kBetter);

  // Two misses on 50 prompts: p = 0.5, not a difference.
  std::vector<uint8_t> near(50, 1), base(50, 1);
  near[3] = near[7] = 0;
  c = ComparePaired(base, near);
  EXPECT_NEAR(c.p, 0.5, 1e-12);
  EXPECT_EQ(c.verdict, PairedVerdict::kIndistinguishable);

  // Concordant misses carry no information.
  std::vector<uint8_t> a = {0, 0, 0, 1}, b = {0, 0, 0, 1};
  EXPECT_DOUBLE_EQ(ComparePaired(a, b).p, 1.0);
}

TEST(PairedTest, DifferentPromptSetsAreNotPaired) {
  const PairedComparison c = ComparePaired({1, 1, 0}, {1, 0});
  EXPECT_EQ(c.n, 0);
  EXPECT_DOUBLE_EQ(c.p, 1.0);
  EXPECT_EQ(c.verdict, PairedVerdict::kIndistinguishable);
}

}  // namespace
}  // namespace kvx::eval
