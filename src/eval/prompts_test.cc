#include "eval/prompts.h"

#include <gtest/gtest.h>

#include <set>

#include "support/char_tokenizer.h"

namespace kvx::eval {
namespace {

using testing::CharTokenizer;

TEST(PromptsTest, PasskeyTextMatchesLlamaCpp) {
  const std::string p = PasskeyPromptText(2, 1, 123);
  EXPECT_EQ(p,
            "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. I will "
            "quiz you about the important information there. The grass is green. The sky is blue. The sun is "
            "yellow. Here we go. There and back again. The pass key is 123. Remember it. 123 is the pass key. The "
            "grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. What is the pass "
            "key? The pass key is");
  // Depth 1: after the last unit.
  const std::string end = PasskeyPromptText(1, 1, 5);
  EXPECT_NE(end.find("back again. The pass key is 5."), std::string::npos);
}

TEST(PromptsTest, PasskeyPlanFillsTheLength) {
  auto tok = CharTokenizer();
  auto plan = BuildPasskeyPlan(*tok, {400, 800}, {0.0, 0.5, 1.0}, 2, 16, 7);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->cells.size(), 6u);
  ASSERT_EQ(plan->items.size(), 12u);
  const int junk_tokens = 91;  // one junk unit, one token per character
  for (const GenItem& it : plan->items) {
    const int length = plan->cells[it.cell].length;
    EXPECT_LE(static_cast<int>(it.prompt.size()) + 16, length);
    EXPECT_GT(static_cast<int>(it.prompt.size()) + 16 + junk_tokens, length);  // one more unit would not fit
    const std::string text = testing::CharText(*tok, it.prompt);
    EXPECT_NE(text.find("The pass key is " + it.expected + ". Remember it."), std::string::npos);
    const int key = std::stoi(it.expected);
    EXPECT_GE(key, 1);
    EXPECT_LE(key, 50000);
  }
  // Depth 0: the needle comes right after the prefix; depth 1: right before the question.
  const std::string d0 = testing::CharText(*tok, plan->items[0].prompt);
  EXPECT_NE(d0.find("there. The pass key is"), std::string::npos);
  const std::string d1 = testing::CharText(*tok, plan->items[4].prompt);
  EXPECT_NE(d1.find("is the pass key. What is the pass key?"), std::string::npos);
  // Same seed, same prompts.
  auto again = BuildPasskeyPlan(*tok, {400, 800}, {0.0, 0.5, 1.0}, 2, 16, 7);
  EXPECT_EQ(again->items[3].prompt, plan->items[3].prompt);
  EXPECT_FALSE(BuildPasskeyPlan(*tok, {100}, {0.5}, 1, 16, 7).ok());  // too short for the bare prompt
}

TEST(PromptsTest, PromptsAreSplitBeforeTheQuestion) {
  // question_start: the context's tokens, the question after (KV policies
  // compress between them with the question excluded).
  auto tok = CharTokenizer();
  auto passkey = BuildPasskeyPlan(*tok, {400}, {0.5}, 2, 16, 7);
  ASSERT_TRUE(passkey.ok());
  for (const GenItem& it : passkey->items) {
    ASSERT_GT(it.question_start, 0);
    const std::vector<int32_t> q(it.prompt.begin() + it.question_start, it.prompt.end());
    EXPECT_EQ(testing::CharText(*tok, q), "What is the pass key? The pass key is");
    const std::vector<int32_t> ctx(it.prompt.begin(), it.prompt.begin() + it.question_start);
    EXPECT_NE(testing::CharText(*tok, ctx).find("The pass key is " + it.expected), std::string::npos);
  }
  std::string hay;
  for (int i = 0; i < 200; ++i) hay += "Sentence number " + std::to_string(i) + " is here. ";
  auto needle = BuildNeedlePlan(*tok, hay, {300}, {0.5}, 32);
  ASSERT_TRUE(needle.ok());
  const GenItem& it = needle->items[0];
  ASSERT_GT(it.question_start, 0);
  EXPECT_EQ(static_cast<int>(it.prompt.size()) - it.question_start, static_cast<int>(kNeedleQuestion.size()));
}

TEST(PromptsTest, NeedleInsertion) {
  EXPECT_EQ(InsertNeedle("A b. C d. E f.", "N.", 0.0), "N. A b. C d. E f.");
  EXPECT_EQ(InsertNeedle("A b. C d. E f.", "N.", 0.5), "A b. N. C d. E f.");
  EXPECT_EQ(InsertNeedle("A b. C d. E f.", "N.", 1.0), "A b. C d. E f. N.");
  EXPECT_EQ(InsertNeedle("", "N.", 0.5), "N.");
  EXPECT_EQ(InsertNeedle("no period here", "N.", 0.7), "N. no period here");
}

TEST(PromptsTest, NeedlePlanFillsTheLength) {
  auto tok = CharTokenizer();
  std::string hay;
  for (int i = 0; i < 200; ++i) hay += "Sentence number " + std::to_string(i) + " is here. ";
  auto plan = BuildNeedlePlan(*tok, hay, {300, 600}, {0.0, 1.0}, 32);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->items.size(), 4u);
  for (const GenItem& it : plan->items) {
    const int length = plan->cells[it.cell].length;
    EXPECT_LE(static_cast<int>(it.prompt.size()) + 32, length);
    EXPECT_GE(static_cast<int>(it.prompt.size()) + 32, length - 2);  // character tokens: fills to the token
    const std::string text = testing::CharText(*tok, it.prompt);
    EXPECT_NE(text.find(std::string(kNeedle)), std::string::npos);
    EXPECT_EQ(text.substr(text.size() - 40), std::string(kNeedleQuestion).substr(kNeedleQuestion.size() - 40));
    EXPECT_EQ(it.expected, kNeedleAnswer);
  }
  EXPECT_EQ(testing::CharText(*tok, plan->items[0].prompt).find("The best thing"), 0u);
  EXPECT_FALSE(BuildNeedlePlan(*tok, "short.", {300}, {0.5}, 32).ok());  // haystack too short
}

TEST(PromptsTest, LinesPlanKeepsTheAskedLineAtItsDepth) {
  auto tok = CharTokenizer();
  std::string record;
  for (int i = 0; i < 20; ++i)
    record += "line n-" + std::to_string(i) + ": REGISTER_CONTENT is <" + std::to_string(100 + i) + ">\\n";
  const std::string row = "{\"random_idx\": [\"n-15\", 15], \"expected_number\": 115, \"prompt\": \"Header.\\n\\n" +
                          record +
                          "\\nNow the record is over. Tell me what is the <REGISTER_CONTENT> in line n-15? "
                          "I need the number. \"}\n";
  std::vector<int> dropped;
  auto plan = BuildLinesPlan(*tok, row, {4, 10, 40, 1000}, 5, 8, 600, &dropped);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(dropped, (std::vector<int>{40, 1000}));  // 20 lines (the whole record) do not fit in 600
  ASSERT_EQ(plan->cells.size(), 2u);
  ASSERT_EQ(plan->items.size(), 2u);  // one case
  const std::string four = testing::CharText(*tok, plan->items[0].prompt);
  // depth 15/19 of 4 lines -> the asked line is the 3rd of the window (n-13 .. n-16).
  EXPECT_NE(four.find("Header.\n\nline n-13: REGISTER_CONTENT is <113>\nline n-14"), std::string::npos) << four;
  EXPECT_NE(four.find("line n-16: REGISTER_CONTENT is <116>\n\nNow the record is over."), std::string::npos);
  EXPECT_EQ(four.find("n-12:"), std::string::npos);
  EXPECT_NE(four.find("I need the number.\nline n-15: REGISTER_CONTENT is <"), std::string::npos);
  EXPECT_EQ(four.substr(four.size() - 21), "REGISTER_CONTENT is <");
  EXPECT_EQ(plan->items[0].expected, "115");
  EXPECT_FALSE(BuildLinesPlan(*tok, "{\"x\": 1}\n", {4}, 1, 8, 600, nullptr).ok());
  EXPECT_FALSE(BuildLinesPlan(*tok, "not json\n", {4}, 1, 8, 600, nullptr).ok());
}

TEST(PromptsTest, CopySequences) {
  auto tok = CharTokenizer();
  const std::vector<int32_t> cand = CopyCandidateTokens(*tok);
  EXPECT_EQ(cand.size(), 96u);  // "▁", "\n" and 94 printable characters; no <unk>, <s>, </s>
  EXPECT_EQ(std::set<int32_t>(cand.begin(), cand.end()).count(1), 0u);
  const auto seqs = BuildRandomCopySequences(cand, 8, {0, 5}, 3, 1);
  ASSERT_EQ(seqs.size(), 6u);
  EXPECT_EQ(seqs[0].distance_index, 0);
  EXPECT_TRUE(seqs[0].filler.empty());
  EXPECT_EQ(seqs[5].filler.size(), 5u);
  EXPECT_EQ(seqs[5].span.size(), 8u);
  EXPECT_NE(seqs[0].span, seqs[1].span);
  EXPECT_EQ(BuildRandomCopySequences(cand, 8, {0, 5}, 3, 1)[4].span, seqs[4].span);  // seeded

  std::vector<int32_t> text(200);
  for (int i = 0; i < 200; ++i) text[i] = i;
  auto ts = BuildTextCopySequences(text, 10, {0, 30}, 20, 3);
  ASSERT_TRUE(ts.ok());
  for (const CopySequence& s : *ts) {
    ASSERT_EQ(s.span.size(), 10u);
    for (size_t i = 1; i < s.span.size(); ++i) EXPECT_EQ(s.span[i], s.span[0] + static_cast<int>(i));  // a window
    if (!s.filler.empty()) {
      const bool disjoint = s.filler.back() < s.span.front() || s.span.back() < s.filler.front();
      EXPECT_TRUE(disjoint);
    }
  }
  EXPECT_FALSE(BuildTextCopySequences(text, 10, {150}, 1, 3).ok());
}

}  // namespace
}  // namespace kvx::eval
