// The registry as a whole: every policy registers itself (a registration the
// linker dropped fails here), and every key a policy accepts acts.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "kv/policy/head_typing.h"
#include "kv/policy/policy.h"

namespace kvx::kv {
namespace {

// Each policy's own registrar adds it (kvx_kv is linked whole-archive): a
// policy missing here lost its registration, one too many needs listing.
TEST(RegistryTest, EveryPolicyIsRegistered) {
  const std::vector<std::string> expected = {
      "adakv",        "cake",        "duo",    "h2o",       "knorm",  "kvmerger",     "mikv",  "minicache", "pyramidkv",
      "quest",        "random",      "razor",  "scissorhands", "snapkv", "streamingllm", "think", "tova"};
  EXPECT_EQ(PolicyRegistry::Global().Names(), expected);
}

// What every policy needs to be built at all: duo and razor read a head table.
PolicyParams BaseParams(const std::string& policy) {
  if (policy != "duo" && policy != "razor") return {};
  static const std::string path = [] {
    HeadTable t;
    t.method = "duo";
    t.n_layers = 2;
    t.n_kv_heads = 2;
    t.scores = {0.1, 0.7, 0.9, 0.05};
    const std::string p = std::string(::testing::TempDir()) + "/registry_heads.json";
    EXPECT_TRUE(t.Save(p).ok());
    return p;
  }();
  return {{"heads", path}};
}

// Every policy x every key any policy takes: a key the policy does not read
// is refused, naming it ("does not apply"); a key it reads, set to a value
// other than its default, either is refused for that value or changes the
// parameters the policy reports it acts with (KVPolicy::Parameters). So a
// key accepted and ignored fails here, and so does a key read but not
// reported.
TEST(RegistryTest, EveryKeyActsOrIsRefused) {
  PolicyRegistry& registry = PolicyRegistry::Global();
  std::map<std::string, PolicyParams> declared;
  PolicyParams any_example;  // one valid value per key, from a policy that takes it
  for (const std::string& name : registry.Names()) {
    auto keys = registry.KeyExamples(name, BaseParams(name));
    ASSERT_TRUE(keys.ok()) << name << ": " << keys.status().ToString();
    declared[name] = *keys;
    for (const auto& [k, v] : *keys) any_example.emplace(k, v);
  }
  EXPECT_GE(any_example.size(), 30u) << "the key universe shrank: are the policies reading their keys?";
  int acted = 0, refused = 0;
  for (const std::string& name : registry.Names()) {
    auto base = registry.Create(name, BaseParams(name));
    ASSERT_TRUE(base.ok()) << name << ": " << base.status().ToString();
    const PolicyParams defaults = (*base)->Parameters();
    for (const auto& [key, example] : any_example) {
      SCOPED_TRACE(name + " " + key);
      PolicyParams params = BaseParams(name);
      auto own = declared[name].find(key);
      params[key] = own != declared[name].end() ? own->second : example;
      auto p = registry.Create(name, params);
      if (own == declared[name].end()) {
        ASSERT_FALSE(p.ok()) << key << "=" << example << " was accepted by " << name << ", which does not read it";
        EXPECT_NE(p.status().message().find("'" + key + "' does not apply to policy " + name), std::string::npos)
            << p.status().message();
        ++refused;
        continue;
      }
      if (!p.ok()) {  // a value this policy refuses (e.g. a budget under its protected entries)
        EXPECT_EQ(p.status().message().find("does not apply"), std::string::npos) << p.status().message();
        continue;
      }
      const PolicyParams got = (*p)->Parameters();
      EXPECT_NE(got, defaults) << key << "=" << params[key] << " is accepted by " << name
                               << " but changes none of its parameters";
      ++acted;
    }
  }
  EXPECT_GT(acted, 50);
  EXPECT_GT(refused, 300);
}

// The refusal names the key, the policy, why and what it takes.
TEST(RegistryTest, AKeyThatDoesNotApplySaysWhatTheRulesAre) {
  auto p = PolicyRegistry::Global().Create("snapkv", {{"layers", "uniform"}, {"beta", "10"}});
  ASSERT_FALSE(p.ok());
  const std::string m = p.status().message();
  EXPECT_NE(m.find("'beta' does not apply to policy snapkv (only layers=pyramid uses it; layers=uniform); it takes: "),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("kernel"), std::string::npos) << m;
  EXPECT_TRUE(PolicyRegistry::Global().Create("snapkv", {{"layers", "pyramid"}, {"beta", "10"}}).ok());
}

}  // namespace
}  // namespace kvx::kv
