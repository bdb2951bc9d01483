#include "model/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

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
  EXPECT_TRUE(SamplerOptions().Validate().ok());
}

}  // namespace
}  // namespace kvx::model
