#include "kv/policy/quest.h"

#include <gtest/gtest.h>

#include "kv/kv_manager.h"

namespace kvx::kv {
namespace {

TEST(QuestPolicyTest, TurnsOnSelectionAfterTheFirstStepAndKeepsEveryEntry) {
  auto r = ResolveKVSpec("codec=int8,page=8;policy=quest,pages=3,dense_layers=1", KVLayout{2, 2, 16, 8}, 512, 1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto m = std::move(KVManager::Create(std::move(*r))).value();
  const SeqId a = m->AddSequence();
  std::vector<int32_t> toks(100, 1), pos(100);
  for (int i = 0; i < 100; ++i) pos[i] = i;
  const StepRequest req{a, toks, pos};
  ASSERT_TRUE(m->BeginStep({&req, 1}).ok());
  std::vector<float> kv(100 * 2 * 16, 0.5f);
  for (int l = 0; l < 2; ++l) ASSERT_TRUE(m->kv(a).Append(l, 100, pos.data(), kv.data(), kv.data()).ok());
  EXPECT_FALSE(m->kv(a).page_selection().enabled);
  ASSERT_TRUE(m->CommitStep().ok());
  const PageSelection& s = m->kv(a).page_selection();
  EXPECT_TRUE(s.enabled);
  EXPECT_EQ(s.pages, 3);
  EXPECT_EQ(s.dense_layers, 1);
  EXPECT_EQ(m->kv(a).table(1, 1).bounds_dim(), 16);
  EXPECT_EQ(m->kv(a).LiveEntries(1, 1), 100);  // nothing evicted
  EXPECT_TRUE(m->CheckInvariants().ok());
}

TEST(QuestPolicyTest, ParametersAreChecked) {
  EXPECT_TRUE(PolicyRegistry::Global().Create("quest", {{"budget", "512"}, {"sink_pages", "0"}}).ok());
  EXPECT_FALSE(PolicyRegistry::Global().Create("quest", {{"budget", "0"}}).ok());
  EXPECT_FALSE(PolicyRegistry::Global().Create("quest", {{"pages", "x"}}).ok());
  EXPECT_FALSE(PolicyRegistry::Global().Create("quest", {{"recent_pages", "0"}}).ok());
  EXPECT_FALSE(PolicyRegistry::Global().Create("quest", {{"ratio", "0.5"}}).ok());
  // prerope and a budget under the forced pages: refused when the manager is made, before any
  // sequence exists (not at the first step of a sequence).
  auto manager = [](const std::string& spec) -> Status {
    auto r = ResolveKVSpec(spec, KVLayout{1, 1, 16, 8}, 64, 1);
    if (!r.ok()) return r.status();
    return KVManager::Create(std::move(*r)).status();
  };
  EXPECT_TRUE(manager("codec=f16;policy=quest,budget=32").ok());
  const Status prerope = manager("codec=f16,prerope=1;policy=quest");
  EXPECT_FALSE(prerope.ok());
  EXPECT_NE(prerope.message().find("prerope"), std::string::npos) << prerope.ToString();
  const Status small = manager("codec=f16;policy=quest,budget=8,sink_pages=1,recent_pages=1");
  EXPECT_FALSE(small.ok());
  EXPECT_NE(small.message().find("raise the budget"), std::string::npos) << small.ToString();
}

}  // namespace
}  // namespace kvx::kv
