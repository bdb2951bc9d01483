#include "eval/ruler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "eval/text_score.h"
#include "support/char_tokenizer.h"

namespace kvx::eval {
namespace {

using testing::CharTokenizer;

int Count(std::string_view text, std::string_view what) {
  int n = 0;
  for (size_t p = text.find(what); p != std::string_view::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

// 400 sentences of 27-29 characters, each ending in "is here.".
Haystack SyntheticHaystack() {
  std::string raw;
  for (int i = 0; i < 400; ++i) raw += "Sentence  number " + std::to_string(i) + " is\nhere. ";
  return MakeHaystack(raw);
}
constexpr int kSentenceTokens = 30;  // the longest sentence and its space

TEST(RulerTest, HaystackCollapsesWhitespaceAndSplitsSentences) {
  const Haystack h = MakeHaystack("  One  two.\n\nThree?  Four!Five. Six");
  EXPECT_EQ(h.sentences, (std::vector<std::string>{"One two.", "Three?", "Four!Five.", "Six"}));
  EXPECT_EQ(h.text, "one two. three? four!five. six");
  EXPECT_EQ(SyntheticHaystack().sentences.size(), 400u);
  EXPECT_EQ(SyntheticHaystack().sentences[7], "Sentence number 7 is here.");
}

struct NiahCase {
  const char* name;
  NiahSpec spec;
  const char* shape;
};

// Every property the issue asks of a prompt builder, on every niah task:
// the needles are present once each, the asked one (the earliest value) at
// the requested depth, the answers nowhere else in the prompt, and the
// prompt fills the length without exceeding it (answer tokens reserved).
TEST(RulerTest, NiahPromptsHoldTheirNeedlesOnceAtTheDepth) {
  auto tok = CharTokenizer();
  const Haystack hay = SyntheticHaystack();
  const NiahSpec multikey{NeedleKind::kWord, NeedleKind::kNumber, 4, 1};
  const NiahSpec multivalue{NeedleKind::kWord, NeedleKind::kNumber, 1, 4};
  for (const NiahCase& c : {NiahCase{"word", {NeedleKind::kWord, NeedleKind::kWord, 1, 1}, "word"},
                            NiahCase{"number", {}, "number"},
                            NiahCase{"uuid", {NeedleKind::kWord, NeedleKind::kUuid, 1, 1}, "uuid"},
                            NiahCase{"multikey", multikey, "number"}, NiahCase{"multivalue", multivalue, "number"}}) {
    SCOPED_TRACE(c.name);
    const std::vector<int> lengths = {900, 2000};
    const std::vector<double> depths = {0.0, 0.3, 0.5, 1.0};
    const int n_gen = 40;
    auto plan = BuildNiahPlan(*tok, hay, c.spec, lengths, depths, 3, n_gen, 11);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    ASSERT_EQ(plan->cells.size(), 8u);
    ASSERT_EQ(plan->items.size(), 24u);
    std::set<std::string> all_answers;
    for (const GenItem& it : plan->items) {
      const GridCell& cell = plan->cells[static_cast<size_t>(it.cell)];
      const int tokens = static_cast<int>(it.prompt.size());
      EXPECT_LE(tokens + n_gen, cell.length);
      EXPECT_GT(tokens + n_gen, cell.length - kSentenceTokens);  // one more sentence would not fit
      EXPECT_EQ(it.n_gen, n_gen);
      ASSERT_EQ(static_cast<int>(it.answers.size()), c.spec.n_values);
      const std::string text = testing::CharText(*tok, it.prompt);
      const size_t ctx_begin = text.find("afterwards.\n") + 12;
      const size_t ctx_end = text.rfind("\nWhat ");
      ASSERT_LT(ctx_begin, ctx_end);
      const std::string context = text.substr(ctx_begin, ctx_end - ctx_begin);
      const int m = Count(context, "is here.");
      ASSERT_GT(m, 0);
      // The asked key: in the question, and in its value needles only.
      const std::string needle0 = NiahNeedle(c.spec.value, "", it.answers[0]);
      const size_t key_end = context.find(" is: " + it.answers[0] + ".");
      ASSERT_NE(key_end, std::string::npos);
      const size_t key_begin = context.rfind(" for ", key_end) + 5;
      const std::string key = context.substr(key_begin, key_end - key_begin);
      EXPECT_EQ(ItemShape(key), "word") << key;
      EXPECT_NE(text.substr(ctx_end).find(" for " + key + " mentioned"), std::string::npos);
      EXPECT_EQ(Count(context, key), c.spec.n_values);
      size_t first_at = std::string::npos;
      for (const std::string& a : it.answers) {
        EXPECT_EQ(ItemShape(a), c.shape) << a;
        EXPECT_TRUE(all_answers.insert(a).second) << "value drawn twice: " << a;
        // Once in the whole prompt: in its needle, nowhere in the haystack.
        EXPECT_EQ(Count(text, a), 1) << a;
        const size_t at = context.find(NiahNeedle(c.spec.value, key, a));
        ASSERT_NE(at, std::string::npos) << a;
        first_at = std::min(first_at, at);
      }
      // The earliest value of the asked key sits before sentence round(depth * m).
      EXPECT_EQ(context.find(NiahNeedle(c.spec.value, key, it.answers[0])), first_at);
      EXPECT_EQ(Count(context.substr(0, first_at), "is here."), std::llround(cell.depth * m))
          << "depth " << cell.depth << ", " << m << " sentences";
      // Distractors: the other keys, once each.
      EXPECT_EQ(Count(context, "One of the special magic"), c.spec.n_keys * c.spec.n_values);
    }
    // Seeded: the same seed gives the same prompts, another seed others.
    auto again = BuildNiahPlan(*tok, hay, c.spec, lengths, depths, 3, n_gen, 11);
    auto other = BuildNiahPlan(*tok, hay, c.spec, lengths, depths, 3, n_gen, 12);
    EXPECT_EQ(again->items[5].prompt, plan->items[5].prompt);
    EXPECT_NE(other->items[5].prompt, plan->items[5].prompt);
  }
}

// Keys and values already in the haystack are never drawn: the same seed
// over a haystack that now holds every string the first plan drew must draw
// others, and still find each answer once in its prompt.
TEST(RulerTest, NiahNeverDrawsWhatTheHaystackHolds) {
  auto tok = CharTokenizer();
  const NiahSpec words{NeedleKind::kWord, NeedleKind::kWord, 2, 1};
  auto first = BuildNiahPlan(*tok, SyntheticHaystack(), words, {1200}, {0.5}, 4, 16, 3);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  std::set<std::string> drawn;
  std::string raw;
  for (int i = 0; i < 400; ++i) raw += "Sentence number " + std::to_string(i) + " is here. ";
  for (const GenItem& it : first->items) {
    const std::string text = testing::CharText(*tok, it.prompt);
    for (size_t p = text.find(" for "); p != std::string::npos; p = text.find(" for ", p + 1)) {
      const size_t e = text.find(' ', p + 5);
      const std::string w = text.substr(p + 5, e - p - 5);
      if (ItemShape(w) == "word") drawn.insert(w);
    }
    for (const std::string& a : it.answers) drawn.insert(a);
  }
  ASSERT_GE(drawn.size(), 12u);  // 4 trials x (2 keys + 2 values)
  for (const std::string& w : drawn) raw += "Here the " + w + " sits. ";
  const Haystack taken = MakeHaystack(raw);
  auto second = BuildNiahPlan(*tok, taken, words, {1200}, {0.5}, 4, 16, 3);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  for (const GenItem& it : second->items) {
    const std::string text = testing::CharText(*tok, it.prompt);
    for (const std::string& w : drawn) EXPECT_EQ(text.find(" for " + w + " "), std::string::npos) << w;
    for (const std::string& a : it.answers) {
      EXPECT_EQ(drawn.count(a), 0u) << a;
      EXPECT_EQ(Count(text, a), 1) << a;
    }
  }
}

TEST(RulerTest, NiahQuestionIsSingularForOneValue) {
  auto tok = CharTokenizer();
  auto one = BuildNiahPlan(*tok, SyntheticHaystack(), {}, {600}, {0.5}, 1, 16, 1);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  const std::string t = testing::CharText(*tok, one->items[0].prompt);
  EXPECT_EQ(t.find("A special magic number is hidden within the following text."), 0u) << t;
  EXPECT_NE(t.find("The special magic number for "), std::string::npos);
  EXPECT_EQ(t.substr(t.size() - 33), "mentioned in the provided text is");
  const NiahSpec many{NeedleKind::kWord, NeedleKind::kUuid, 1, 4};
  auto four = BuildNiahPlan(*tok, SyntheticHaystack(), many, {1500}, {0.5}, 1, 16, 1);
  ASSERT_TRUE(four.ok()) << four.status().ToString();
  const std::string f = testing::CharText(*tok, four->items[0].prompt);
  EXPECT_EQ(f.find("Some special magic uuids are hidden"), 0u) << f;
  EXPECT_EQ(f.substr(f.size() - 34), "mentioned in the provided text are");
}

TEST(RulerTest, NiahBadInputIsAClearError) {
  auto tok = CharTokenizer();
  const Haystack hay = SyntheticHaystack();
  auto bare = NiahBareTokens(*tok, {});
  ASSERT_TRUE(bare.ok());
  auto too_short = BuildNiahPlan(*tok, hay, {}, {*bare + 16 - 1}, {0.5}, 1, 16, 1);
  ASSERT_FALSE(too_short.ok());
  EXPECT_NE(too_short.status().message().find("too short"), std::string::npos) << too_short.status().message();
  auto exact = BuildNiahPlan(*tok, hay, {}, {*bare + 16}, {0.5}, 1, 16, 1);
  EXPECT_TRUE(exact.ok()) << exact.status().ToString();  // exactly the bare prompt
  auto no_text = BuildNiahPlan(*tok, MakeHaystack("  "), {}, {600}, {0.5}, 1, 16, 1);
  EXPECT_FALSE(no_text.ok());
  auto small = BuildNiahPlan(*tok, MakeHaystack("Tiny. Haystack."), {}, {2000}, {0.5}, 1, 16, 1);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("too short for length 2000"), std::string::npos);
}

TEST(RulerTest, VtPromptsHoldTheChainOnceFromTheDepth) {
  auto tok = CharTokenizer();
  const int n_gen = 32;
  auto plan = BuildVtPlan(*tok, {2500, 4000}, {0.0, 0.4, 1.0}, 2, n_gen, 5);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->items.size(), 12u);
  const int noise_tokens = static_cast<int>(kVtNoise.size()) + 1;
  for (const GenItem& it : plan->items) {
    const GridCell& cell = plan->cells[static_cast<size_t>(it.cell)];
    EXPECT_LE(static_cast<int>(it.prompt.size()) + n_gen, cell.length);
    EXPECT_GT(static_cast<int>(it.prompt.size()) + n_gen, cell.length - noise_tokens);
    const std::string text = testing::CharText(*tok, it.prompt);
    // The solved example comes first; the asked instance is after it.
    const size_t main = text.rfind("Memorize and track");
    ASSERT_NE(main, std::string::npos);
    ASSERT_GT(main, 0u);
    const std::string prompt = text.substr(main);
    const size_t q = prompt.find("\nQuestion: ");
    const std::string context = prompt.substr(0, q);
    ASSERT_EQ(it.answers.size(), static_cast<size_t>(kVtHops + 1));
    const int m = Count(context, kVtNoise);
    size_t prev = 0;
    for (size_t i = 0; i < it.answers.size(); ++i) {
      EXPECT_EQ(ItemShape(it.answers[i]), "caps5");
      EXPECT_EQ(Count(text, it.answers[i]), i + 1 < it.answers.size() ? 2 : 1) << it.answers[i];  // set, then read
      const std::string stmt =
          "VAR " + it.answers[i] + " = " + (i == 0 ? std::string() : "VAR " + it.answers[i - 1]);
      const size_t at = context.find(stmt);
      ASSERT_NE(at, std::string::npos) << stmt;
      EXPECT_EQ(Count(context, stmt), 1);
      EXPECT_GE(at, prev);  // the chain in order
      prev = at;
      if (i == 0) {
        EXPECT_EQ(Count(context.substr(0, at), kVtNoise), std::llround(cell.depth * m));
        // The value: in the first assignment and twice in the question only.
        const std::string value = context.substr(at + stmt.size(), 5);
        EXPECT_EQ(ItemShape(value), "number");
        EXPECT_EQ(Count(prompt, value), 3) << value;
        EXPECT_EQ(Count(context, value), 1) << value;
      }
    }
    EXPECT_EQ(prompt.substr(prompt.size() - 9), "they are:");
  }
  auto bare = VtBareTokens(*tok);
  ASSERT_TRUE(bare.ok());
  EXPECT_FALSE(BuildVtPlan(*tok, {*bare + n_gen - 1}, {0.5}, 1, n_gen, 5).ok());
  EXPECT_TRUE(BuildVtPlan(*tok, {*bare + n_gen}, {0.5}, 1, n_gen, 5).ok());
}

}  // namespace
}  // namespace kvx::eval
