#include "eval/prefill_cache.h"

#include <gtest/gtest.h>

#include "kv/kv_spec.h"
#include "kv/policy/policy.h"

namespace kvx::eval {
namespace {

TEST(PrefillCacheTest, SharesWholeCallsButTheLastTwo) {
  // 1000 tokens in calls of 256: 256 256 256 232. The last two run again
  // (the 232 alone may be shorter than a window), with a window or without.
  EXPECT_EQ(SharedPrefixLength(32, 1000, 256), 512);
  EXPECT_EQ(SharedPrefixLength(0, 1000, 256), 512);
  EXPECT_EQ(SharedPrefixLength(32, 1024, 256), 512);  // 4 whole calls
  EXPECT_EQ(SharedPrefixLength(32, 512, 256), 0);
  EXPECT_EQ(SharedPrefixLength(0, 512, 256), 0);
  EXPECT_EQ(SharedPrefixLength(std::nullopt, 4096, 256), 0);  // the whole prompt matters
  EXPECT_EQ(SharedPrefixLength(300, 4096, 256), 0);           // a window longer than a call
  EXPECT_EQ(SharedPrefixLength(256, 4096, 256), 14 * 256);
}

TEST(PrefillCacheTest, PageKeyIgnoresPoliciesAndBudget) {
  auto a = kv::ParseKVSpec("codec=int4,page=32;policy=snapkv,ratio=0.5");
  auto b = kv::ParseKVSpec("codec=int4,page=32,budget=64MiB;policy=tova");
  auto c = kv::ParseKVSpec("codec=int4,page=16;policy=tova");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(PrefillCache::PageKey(*a), PrefillCache::PageKey(*b));
  EXPECT_NE(PrefillCache::PageKey(*a), PrefillCache::PageKey(*c));
}

// Which policies say their state after a prompt depends on its last calls
// only (KVPolicy::prompt_window); a wrong "yes" would make the cache change
// results, so the whole-prompt ones are pinned here too.
TEST(PrefillCacheTest, PoliciesDeclareWhatTheyObserveOfAPrompt) {
  auto window = [](const std::string& name, const kv::PolicyParams& params) -> std::optional<int> {
    auto p = kv::PolicyRegistry::Global().Create(name, params);
    EXPECT_TRUE(p.ok()) << name << ": " << p.status().ToString();
    return p.ok() ? (*p)->prompt_window() : std::optional<int>(-1);
  };
  EXPECT_EQ(window("snapkv", {{"ratio", "0.5"}, {"window", "48"}}), 48);
  EXPECT_EQ(window("tova", {{"ratio", "0.5"}, {"mode", "once"}}), 1);
  EXPECT_EQ(window("knorm", {{"ratio", "0.5"}}), 0);
  EXPECT_EQ(window("think", {{"lambda", "0.5"}, {"window", "16"}}), 16);
  EXPECT_EQ(window("quest", {}), 0);
  EXPECT_EQ(window("minicache", {}), 0);
  EXPECT_EQ(window("pyramidkv", {{"ratio", "0.5"}}), 32);
  EXPECT_EQ(window("cake", {{"ratio", "0.5"}}), 32);
  EXPECT_EQ(window("adakv", {{"ratio", "0.5"}}), 32);
  EXPECT_EQ(window("scissorhands", {{"ratio", "0.5"}, {"mode", "once"}}), 32);
  EXPECT_EQ(window("random", {{"ratio", "0.5"}}), 0);
  EXPECT_EQ(window("h2o", {{"ratio", "0.5"}, {"mode", "once"}}), std::nullopt);  // sums over every query
  EXPECT_EQ(window("h2o", {{"ratio", "0.5"}}), std::nullopt);                    // continuous
  EXPECT_EQ(window("snapkv", {{"ratio", "0.5"}, {"mode", "continuous"}}), std::nullopt);
  EXPECT_EQ(window("streamingllm", {}), std::nullopt);                           // evicts every step
  EXPECT_EQ(window("mikv", {{"ratio", "0.5"}, {"mode", "once"}}), std::nullopt);      // H2O's sums
  EXPECT_EQ(window("kvmerger", {{"ratio", "0.5"}, {"mode", "once"}}), std::nullopt);  // H2O's sums
}

}  // namespace
}  // namespace kvx::eval
