#include "model/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <vector>

namespace kvx::model {
namespace {

TEST(SamplerTest, GreedyTakesLowestIdOnTies) {
  SamplerOptions o;
  o.temperature = 0;
  Sampler s(o);
  const float logits[] = {1, 3, 3, 2};
  EXPECT_EQ(s.Sample(logits, 4), 1);
  EXPECT_EQ(ArgMax(logits, 4), 1);
}

// ArgMax scans in 16 lanes and then a tail: the maximum anywhere (first
// lane, a lane's last element, the tail), the lowest index on ties across
// lanes, NaNs skipped, and all -inf or all NaN giving 0.
TEST(SamplerTest, ArgMaxFindsTheFirstMaximumAnywhere) {
  for (int n : {1, 15, 16, 17, 37, 64}) {
    for (int at = 0; at < n; ++at) {
      std::vector<float> v(n);
      for (int i = 0; i < n; ++i) v[i] = std::sin(0.7f * i) - 2.0f;
      v[at] = 5.0f;
      EXPECT_EQ(ArgMax(v.data(), n), at) << n;
      if (at + 16 < n) {
        v[at + 16] = 5.0f;  // same lane, later: still the first
        EXPECT_EQ(ArgMax(v.data(), n), at) << n;
      }
    }
  }
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float with_nan[] = {nan, 1, nan, 3, 2};
  EXPECT_EQ(ArgMax(with_nan, 5), 3);
  const float all_neg_inf[] = {-inf, -inf, -inf};
  EXPECT_EQ(ArgMax(all_neg_inf, 3), 0);
  const float all_nan[] = {nan, nan};
  EXPECT_EQ(ArgMax(all_nan, 2), 0);
  const float pos_inf[] = {1, inf, 2, inf};
  EXPECT_EQ(ArgMax(pos_inf, 4), 1);
}

TEST(SamplerTest, SameSeedSameTokens) {
  SamplerOptions o;
  o.temperature = 1.0f;
  o.top_k = 0;
  o.top_p = 1.0f;
  o.min_p = 0;
  o.seed = 42;
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[i] = 0.05f * i;
  Sampler a(o), b(o);
  std::vector<int> ta, tb;
  for (int i = 0; i < 50; ++i) {
    ta.push_back(a.Sample(logits.data(), 100));
    tb.push_back(b.Sample(logits.data(), 100));
  }
  EXPECT_EQ(ta, tb);
  o.seed = 43;
  Sampler c(o);
  std::vector<int> tc;
  for (int i = 0; i < 50; ++i) tc.push_back(c.Sample(logits.data(), 100));
  EXPECT_NE(ta, tc);
}

TEST(SamplerTest, TopKRestrictsToBestK) {
  SamplerOptions o;
  o.temperature = 5.0f;
  o.top_k = 2;
  o.top_p = 1.0f;
  o.min_p = 0;
  Sampler s(o);
  const float logits[] = {0, 1, 5, 4, 2};
  for (int i = 0; i < 200; ++i) {
    const int t = s.Sample(logits, 5);
    EXPECT_TRUE(t == 2 || t == 3) << t;
  }
}

TEST(SamplerTest, TopPAndMinPCut) {
  SamplerOptions o;
  o.temperature = 1.0f;
  o.top_k = 0;
  o.top_p = 0.5f;  // the first token alone has p > 0.5
  o.min_p = 0;
  Sampler s(o);
  const float logits[] = {10, 0, 0, 0};
  for (int i = 0; i < 50; ++i) EXPECT_EQ(s.Sample(logits, 4), 0);
  o.top_p = 1.0f;
  o.min_p = 0.5f;  // tokens with p < 0.5 * p_max are dropped
  const float logits2[] = {1.0f, 0.9f, -3.0f};
  Sampler m(o);
  for (int i = 0; i < 100; ++i) EXPECT_NE(m.Sample(logits2, 3), 2);
}

TEST(SamplerTest, TemperatureFollowsDistribution) {
  SamplerOptions o;
  o.temperature = 1.0f;
  o.top_k = 0;
  o.top_p = 1.0f;
  o.min_p = 0;
  o.seed = 7;
  Sampler s(o);
  const float logits[] = {0.0f, std::log(3.0f)};  // p = 0.25, 0.75
  int ones = 0;
  const int n = 4000;
  for (int i = 0; i < n; ++i) ones += s.Sample(logits, 2);
  EXPECT_NEAR(ones / static_cast<double>(n), 0.75, 0.03);
}

// Top-p keeps the smallest best-first prefix holding top_p of the mass; the
// sampler sorts it in rounds (64, then 256, ...), so a cut past the first
// round must land where a full sort puts it.
TEST(SamplerTest, TopPCutIsTheSortedPrefixAcrossRounds) {
  const int n = 1000;
  std::vector<float> logits(n);
  for (int i = 0; i < n; ++i) logits[(i * 389) % n] = -0.002f * i;  // distinct, shuffled: rank i at id (389 i) % n
  std::vector<double> p(n);
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += p[i] = std::exp(-0.002 * i);
  int cut = 0;  // ranks [0, cut) are kept
  for (double cum = 0; cut < n && cum < 0.5 * sum;) cum += p[cut++];
  ASSERT_GT(cut, 64);  // beyond the first round
  SamplerOptions o;
  o.temperature = 1.0f;
  o.top_k = 0;
  o.top_p = 0.5f;
  o.min_p = 0;
  o.seed = 3;
  Sampler s(o);
  int deepest = 0;
  for (int k = 0; k < 4000; ++k) {
    const int id = s.Sample(logits.data(), n);
    int rank = 0;
    while ((rank * 389) % n != id) ++rank;
    ASSERT_LT(rank, cut) << "token of rank " << rank << " is outside the top-p prefix of " << cut;
    deepest = std::max(deepest, rank);
  }
  EXPECT_GT(deepest, cut - 20);  // the prefix's tail is reachable
}

// Without a cut-off the draw covers the whole vocabulary in proportion.
TEST(SamplerTest, NoCutOffDrawsFromTheWholeVocabulary) {
  SamplerOptions o;
  o.temperature = 2.0f;
  o.top_k = 0;
  o.top_p = 1.0f;
  o.min_p = 0;
  o.seed = 11;
  const int n = 4;
  const float logits[] = {0.0f, 2.0f * std::log(2.0f), 2.0f * std::log(3.0f), 2.0f * std::log(4.0f)};  // p = 1:2:3:4 at t = 2
  Sampler s(o);
  std::vector<int> count(n);
  const int draws = 10000;
  for (int i = 0; i < draws; ++i) count[s.Sample(logits, n)]++;
  for (int i = 0; i < n; ++i) EXPECT_NEAR(count[i] / static_cast<double>(draws), (i + 1) / 10.0, 0.02) << i;
}

TEST(SamplerTest, RepetitionPenaltyDiscouragesRepeats) {
  SamplerOptions o;
  o.temperature = 0;
  o.repeat_penalty = 2.0f;
  Sampler s(o);
  s.Accept(0);
  const float logits[] = {2.0f, 1.5f};  // 2.0/2 = 1.0 < 1.5
  EXPECT_EQ(s.Sample(logits, 2), 1);
}

TEST(SamplerTest, ValidateRejectsBadOptions) {
  SamplerOptions o;
  o.top_p = 0;
  EXPECT_FALSE(o.Validate().ok());
  o = SamplerOptions();
  o.min_p = 1.5f;
  EXPECT_FALSE(o.Validate().ok());
  // Out of range is an error everywhere, never a silent "off".
  for (float p : {-1.0f, 0.0f, 1.0001f, 2.0f, NAN, INFINITY}) {
    o = SamplerOptions();
    o.top_p = p;
    EXPECT_FALSE(o.Validate().ok()) << p;
    o = SamplerOptions();
    o.min_p = p == 0.0f ? -0.5f : p;
    EXPECT_FALSE(o.Validate().ok()) << p;
  }
  o = SamplerOptions();
  o.top_k = -1;
  EXPECT_FALSE(o.Validate().ok());
  o = SamplerOptions();
  o.repeat_penalty = INFINITY;
  EXPECT_FALSE(o.Validate().ok());
  o = SamplerOptions();
  o.temperature = NAN;
  EXPECT_FALSE(o.Validate().ok());
  o = SamplerOptions();
  o.top_p = 1.0f;
  o.min_p = 1.0f;
  o.top_k = 0;
  EXPECT_TRUE(o.Validate().ok());
  EXPECT_TRUE(SamplerOptions().Validate().ok());
}

}  // namespace
}  // namespace kvx::model
