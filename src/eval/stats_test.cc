#include "eval/stats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <span>
#include <vector>

#include "eval/text_score.h"

namespace kvx::eval {
namespace {

TEST(StatsTest, MeanAndStdErr) {
  MeanAccumulator m;
  EXPECT_EQ(m.Mean(), 0.0);
  EXPECT_EQ(m.StdErr(), 0.0);
  for (double x : {1.0, 2.0, 3.0, 4.0}) m.Add(x);
  EXPECT_DOUBLE_EQ(m.Mean(), 2.5);
  // var (population) = 1.25; stderr = sqrt(1.25 / 3)
  EXPECT_NEAR(m.StdErr(), std::sqrt(1.25 / 3.0), 1e-12);
  EXPECT_EQ(m.count(), 4);
}

TEST(StatsTest, PercentileInterpolatesLikeNumpy) {
  // numpy.percentile([1, 2, 3, 4, 10], [0, 50, 90, 99, 100]) = 1, 3, 7.6, 9.76, 10
  const std::vector<double> v = {10, 3, 1, 4, 2};
  EXPECT_DOUBLE_EQ(Percentile(v, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(Percentile(v, 0.5), 3.0);
  EXPECT_NEAR(Percentile(v, 0.9), 7.6, 1e-12);
  EXPECT_NEAR(Percentile(v, 0.99), 9.76, 1e-12);
  EXPECT_DOUBLE_EQ(Percentile(v, 1.0), 10.0);
  EXPECT_DOUBLE_EQ(Percentile({}, 0.5), 0.0);
  EXPECT_DOUBLE_EQ(Percentile({7}, 0.99), 7.0);
  EXPECT_DOUBLE_EQ(Percentile(v, 2.0), 10.0);  // clamped
}

TEST(StatsTest, LogSoftmaxNormalisesAndSurvivesLargeLogits) {
  const float logits[3] = {1000.0f, 1000.0f, 0.0f};
  double lp[3];
  LogSoftmax(logits, 3, lp);
  EXPECT_NEAR(lp[0], std::log(0.5), 1e-12);
  EXPECT_NEAR(lp[1], std::log(0.5), 1e-12);
  EXPECT_LT(lp[2], -990);
  double total = 0;
  for (double x : lp) total += std::exp(x);
  EXPECT_NEAR(total, 1.0, 1e-12);
}

TEST(StatsTest, KlDivergence) {
  const float a[4] = {0.5f, -1.0f, 2.0f, 0.0f};
  const float b[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  double la[4], lb[4];
  LogSoftmax(a, 4, la);
  LogSoftmax(b, 4, lb);
  EXPECT_EQ(KlDivergence(la, la, 4), 0.0);  // exactly, not approximately
  double expected = 0;
  for (int i = 0; i < 4; ++i) expected += std::exp(la[i]) * (la[i] - lb[i]);
  EXPECT_NEAR(KlDivergence(la, lb, 4), expected, 1e-15);
  EXPECT_GT(KlDivergence(la, lb, 4), 0.0);
  // KL(uniform || p) = log 4 - H-like term; check against the closed form.
  double kl_ub = 0;
  for (int i = 0; i < 4; ++i) kl_ub += 0.25 * (std::log(0.25) - la[i]);
  EXPECT_NEAR(KlDivergence(lb, la, 4), kl_ub, 1e-12);
}

TEST(TextScoreTest, FirstInteger) {
  EXPECT_EQ(FirstInteger(" 12345. Remember"), 12345);
  EXPECT_EQ(FirstInteger("the key is 7 and 8"), 7);
  EXPECT_EQ(FirstInteger("<2416>"), 2416);
  EXPECT_EQ(FirstInteger("00042"), 42);
  EXPECT_FALSE(FirstInteger("no digits here").has_value());
  EXPECT_FALSE(FirstInteger("").has_value());
  EXPECT_FALSE(FirstInteger("1234567890123456789012").has_value());
}

TEST(TextScoreTest, FirstIntegerDecidedOnlyWhenItsDigitsEnded) {
  // Generation stops at a decided answer, so a text cut there must score as
  // the whole text would.
  for (const std::string text : {" 12345. Remember", "the key is 7 and 8", "<2416>", "x 9 y"}) {
    size_t cut = 1;
    while (!FirstIntegerDecided(text.substr(0, cut))) ++cut;
    EXPECT_EQ(FirstInteger(text.substr(0, cut)), FirstInteger(text)) << text;
  }
  EXPECT_FALSE(FirstIntegerDecided(""));
  EXPECT_FALSE(FirstIntegerDecided("the key is "));
  EXPECT_FALSE(FirstIntegerDecided("the key is 123"));  // the next token may add digits
  EXPECT_TRUE(FirstIntegerDecided("the key is 123."));
}

TEST(TextScoreTest, Rouge1) {
  const RougeScore same = Rouge1("Eat a sandwich.", "eat a SANDWICH");
  EXPECT_DOUBLE_EQ(same.f1, 1.0);
  const RougeScore none = Rouge1("hello", "eat a sandwich");
  EXPECT_DOUBLE_EQ(none.f1, 0.0);
  // candidate "a a b" vs reference "a b c": overlap clipped to 2 (a once, b once).
  const RougeScore r = Rouge1("a a b", "a b c");
  EXPECT_NEAR(r.precision, 2.0 / 3.0, 1e-12);
  EXPECT_NEAR(r.recall, 2.0 / 3.0, 1e-12);
  EXPECT_NEAR(r.f1, 2.0 / 3.0, 1e-12);
  EXPECT_DOUBLE_EQ(Rouge1("", "a").f1, 0.0);
  EXPECT_EQ(Words("Dolores Park, on a sunny-day!"),
            (std::vector<std::string>{"dolores", "park", "on", "a", "sunny", "day"}));
}

TEST(TextScoreTest, FirstSentence) {
  EXPECT_EQ(FirstSentence(" eat a sandwich. Then go home."), "eat a sandwich.");
  EXPECT_EQ(FirstSentence("\n\nline one\nline two"), "line one\n");
  EXPECT_EQ(FirstSentence("no end"), "no end");
  EXPECT_EQ(FirstSentence(""), "");
}

TEST(TextScoreTest, SanitizeUtf8) {
  EXPECT_EQ(SanitizeUtf8("plain é 日本 🙂"), "plain é 日本 🙂");
  EXPECT_EQ(SanitizeUtf8(std::string("a\xE6\x97")), "a\xEF\xBF\xBD\xEF\xBF\xBD");                // cut character
  EXPECT_EQ(SanitizeUtf8(std::string("\xC0\xAF")), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // overlong
  EXPECT_EQ(SanitizeUtf8(std::string("\xED\xA0\x80")), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
}

}  // namespace
}  // namespace kvx::eval

namespace kvx::eval {
namespace {

TEST(WilsonIntervalTest, KnownValuesAndEdges) {
  const Interval i = WilsonInterval(8, 10);  // textbook: [0.4902, 0.9433]
  EXPECT_NEAR(i.lo, 0.4902, 1e-4);
  EXPECT_NEAR(i.hi, 0.9433, 1e-4);
  const Interval none = WilsonInterval(0, 20);
  EXPECT_EQ(none.lo, 0.0);
  EXPECT_GT(none.hi, 0.1);  // not the empty [0, 0] of the normal approximation
  const Interval all = WilsonInterval(20, 20);
  EXPECT_LT(all.lo, 0.9);
  EXPECT_EQ(all.hi, 1.0);  // exactly: a rate of 1 is never above it
  EXPECT_EQ(WilsonInterval(20, 20).hi, 1.0);
  EXPECT_EQ(WilsonInterval(0, 0).hi, 1.0);
}

TEST(McNemarTest, KnownExactValues) {
  // Two-sided exact binomial on the discordant pairs: 2 * sum_{i<=k} C(n,i) / 2^n.
  // (lgamma terms: equal to ~1e-15, not bit-exact)
  EXPECT_NEAR(McNemarExactP(0, 6), 2.0 / 64, 1e-12);             // n 6, k 0
  EXPECT_NEAR(McNemarExactP(9, 1), 2.0 * 11 / 1024, 1e-12);      // n 10, k 1: (1 + 10) / 2^10
  EXPECT_NEAR(McNemarExactP(2, 8), 2.0 * 56 / 1024, 1e-12);      // (1 + 10 + 45) / 2^10
  EXPECT_NEAR(McNemarExactP(3, 17), 2.0 * 1351 / 1048576, 1e-12);  // 1 + 20 + 190 + 1140
  EXPECT_NEAR(McNemarExactP(0, 5), 2.0 / 32, 1e-12);             // 5 to 0 is not significant at 0.05
  EXPECT_DOUBLE_EQ(McNemarExactP(5, 5), 1.0);                  // capped at 1
  EXPECT_DOUBLE_EQ(McNemarExactP(4, 5), McNemarExactP(5, 4));  // symmetric
}

TEST(McNemarTest, AllConcordantIsIndistinguishable) {
  // Every prompt the same for both caches: no discordant pair, no evidence.
  EXPECT_DOUBLE_EQ(McNemarExactP(0, 0), 1.0);
  EXPECT_EQ(McNemarVerdict(0, 0), PairedVerdict::kIndistinguishable);
}

TEST(McNemarTest, VerdictFollowsTheDirectionOfTheDiscordantPrompts) {
  // only_a: hits of a (the reference) alone; only_b: hits of b alone.
  EXPECT_EQ(McNemarVerdict(0, 6), PairedVerdict::kBetter);
  EXPECT_EQ(McNemarVerdict(6, 0), PairedVerdict::kWorse);
  EXPECT_EQ(McNemarVerdict(9, 1), PairedVerdict::kWorse);
  EXPECT_EQ(McNemarVerdict(0, 5), PairedVerdict::kIndistinguishable);
  EXPECT_EQ(McNemarVerdict(9, 1, /*alpha=*/0.01), PairedVerdict::kIndistinguishable);
  EXPECT_STREQ(VerdictName(PairedVerdict::kWorse), "worse");
}

TEST(BootstrapTest, IntervalHoldsTheMeanAndIsReproducible) {
  std::vector<double> v;
  for (int i = 0; i < 60; ++i) v.push_back(i % 3 == 0 ? 1.0 : 0.25 * (i % 4));
  double mean = 0;
  for (double x : v) mean += x / v.size();
  const Interval a = BootstrapMeanInterval(v), b = BootstrapMeanInterval(v);
  EXPECT_LT(a.lo, mean);
  EXPECT_GT(a.hi, mean);
  EXPECT_GT(a.hi - a.lo, 0.05);  // 60 values with sd ~0.37: about +-0.09
  EXPECT_LT(a.hi - a.lo, 0.3);
  EXPECT_EQ(a.lo, b.lo);  // seeded
  EXPECT_EQ(a.hi, b.hi);
  const Interval constant = BootstrapMeanInterval(std::vector<double>(10, 0.5));
  EXPECT_DOUBLE_EQ(constant.lo, 0.5);
  EXPECT_DOUBLE_EQ(constant.hi, 0.5);
  EXPECT_EQ(BootstrapMeanInterval({}).hi, 0.0);
}

TEST(StudentTTest, KnownTailsAndQuantiles) {
  EXPECT_NEAR(StudentTTwoSidedP(1.0, 1.0), 0.5, 1e-6);          // Cauchy: atan(1) = pi/4
  EXPECT_NEAR(StudentTTwoSidedP(2.228139, 10.0), 0.05, 1e-5);   // the t table's 0.975 quantile at 10 df
  EXPECT_NEAR(StudentTTwoSidedP(1.959964, 1e7), 0.05, 1e-5);    // the normal limit
  EXPECT_NEAR(StudentTTwoSidedP(0.0, 5.0), 1.0, 1e-12);
  EXPECT_NEAR(StudentTTwoSidedP(-2.228139, 10.0), StudentTTwoSidedP(2.228139, 10.0), 1e-12);
  EXPECT_NEAR(StudentTTwoSidedP(100.0, 1.0), 2 * (0.5 - std::atan(100.0) / M_PI), 1e-6);  // a heavy tail
  EXPECT_NEAR(StudentTCritical(10.0), 2.228139, 1e-5);
  EXPECT_NEAR(StudentTCritical(15.0), 2.131450, 1e-5);
  EXPECT_NEAR(StudentTCritical(63.0), 1.998341, 1e-5);
}

TEST(PairedDifferenceTest, BlockMeansDecideTheVerdict) {
  std::vector<float> a(256), b(256), c(256);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = 0.01f * static_cast<float>((i * 37) % 11);          // noisy, shared by both
    b[i] = a[i] + 0.002f + 0.001f * static_cast<float>(i % 3);  // always higher: worse
    c[i] = a[i] + ((i / 32) % 2 ? 0.004f : -0.004f);            // up in one block, down in the next
  }
  const PairedDifference same = PairedBlockDifference(a, a);
  EXPECT_EQ(same.mean, 0.0);
  EXPECT_EQ(same.p, 1.0);
  EXPECT_EQ(same.Verdict(), PairedVerdict::kIndistinguishable);

  const PairedDifference worse = PairedBlockDifference(a, b);
  EXPECT_EQ(worse.n_blocks, 8);
  EXPECT_EQ(worse.n_positions, 256);
  EXPECT_NEAR(worse.mean, 0.003, 1e-4);
  EXPECT_LT(worse.p, 0.001);
  EXPECT_EQ(worse.Verdict(), PairedVerdict::kWorse);
  EXPECT_EQ(PairedBlockDifference(b, a).Verdict(), PairedVerdict::kBetter);
  EXPECT_LT(worse.ci95.lo, worse.mean);
  EXPECT_GT(worse.ci95.hi, worse.mean);

  // Alternating blocks: the mean is 0 and the blocks disagree, so no verdict.
  const PairedDifference mixed = PairedBlockDifference(a, c);
  EXPECT_NEAR(mixed.mean, 0.0, 1e-6);
  EXPECT_GT(mixed.p, 0.5);
  EXPECT_EQ(mixed.Verdict(), PairedVerdict::kIndistinguishable);

  // Unequal lengths or fewer than two blocks: no test.
  EXPECT_EQ(PairedBlockDifference(a, std::span<const float>(b).first(100)).n_blocks, 0);
  EXPECT_EQ(PairedBlockDifference(std::span<const float>(a).first(40), std::span<const float>(b).first(40)).p, 1.0);
}

}  // namespace
}  // namespace kvx::eval
