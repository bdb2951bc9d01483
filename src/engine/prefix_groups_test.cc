#include "engine/prefix_groups.h"

#include <gtest/gtest.h>

namespace kvx::engine {
namespace {

std::vector<int32_t> Seq(std::initializer_list<int32_t> head, int tail_len, int32_t tail) {
  std::vector<int32_t> v(head);
  for (int i = 0; i < tail_len; ++i) v.push_back(tail + i);
  return v;
}

TEST(PrefixGroupsTest, GroupsSharedPrefixesInWholeBlocks) {
  const std::vector<int32_t> sys = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};  // 10 tokens: 2 blocks of 4
  auto with = [&](std::vector<int32_t> tail) {
    std::vector<int32_t> v = sys;
    v.insert(v.end(), tail.begin(), tail.end());
    return v;
  };
  const std::vector<std::vector<int32_t>> prompts = {
      with({50, 51}), Seq({9}, 6, 100), with({40}), Seq({1, 2}, 3, 70), with({60, 61, 62}), Seq({9}, 6, 200)};
  const auto groups = GroupByPrefix(prompts, 4);
  // Sorted: [1,2,3..] x3 (sys) and [1,2,70..] share 2 tokens (< a block): separate.
  ASSERT_EQ(groups.size(), 4u);
  EXPECT_EQ(groups[0].members, (std::vector<int>{2, 0, 4}));  // sys + 40 < sys + 50 < sys + 60
  EXPECT_EQ(groups[0].prefix_tokens, 8);                      // 10 shared, whole blocks of 4
  EXPECT_EQ(groups[1].members, (std::vector<int>{3}));
  EXPECT_EQ(groups[1].prefix_tokens, 0);
  EXPECT_EQ(groups[2].members, (std::vector<int>{1}));  // [9,100..] and [9,200..] share one token
  EXPECT_EQ(groups[3].members, (std::vector<int>{5}));
}

TEST(PrefixGroupsTest, PrefixLeavesEveryMemberATokenToCompute) {
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4}, {1, 2, 3, 4}, {1, 2, 3, 4, 5}};
  const auto groups = GroupByPrefix(prompts, 2);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].members.size(), 3u);
  EXPECT_EQ(groups[0].prefix_tokens, 2);  // 3 usable (4 - 1), whole blocks of 2
  // Every prompt is in exactly one group, and empty input gives no group.
  EXPECT_TRUE(GroupByPrefix({}, 4).empty());
  EXPECT_EQ(GroupByPrefix({{5}}, 4)[0].prefix_tokens, 0);
}

}  // namespace
}  // namespace kvx::engine
