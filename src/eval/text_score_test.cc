#include "eval/text_score.h"

#include <gtest/gtest.h>

namespace kvx::eval {
namespace {

TEST(TextScoreTest, ItemShapes) {
  EXPECT_EQ(ItemShape("1234567"), "number");
  EXPECT_EQ(ItemShape("rich-brick"), "word");
  EXPECT_EQ(ItemShape("8e4f2a1c-0b3d-4e5f-9a6b-7c8d9e0f1a2b"), "uuid");
  EXPECT_EQ(ItemShape("8E4F2A1C-0B3D-4E5F-9A6B-7C8D9E0F1A2B"), "uuid");
  EXPECT_EQ(ItemShape("ABCDE"), "caps5");
  EXPECT_EQ(ItemShape("VAR"), "caps3");
  EXPECT_EQ(ItemShape("the"), "other");
  EXPECT_EQ(ItemShape("a1-b2"), "other");
  EXPECT_EQ(ItemShape(""), "other");
}

TEST(TextScoreTest, ValuesFoundTakesTheFirstCandidates) {
  EXPECT_EQ(ValuesFound(": 1234567.", {"1234567"}), 1.0);
  EXPECT_EQ(ValuesFound(" \n 1234567 is it", {"1234567"}), 1.0);  // leading blank lines skipped
  EXPECT_EQ(ValuesFound(" 12345678.", {"1234567"}), 0.0);         // a longer number is another number
  EXPECT_EQ(ValuesFound(" 7654321, 1234567.", {"1234567"}), 0.0);  // only the first number counts
  EXPECT_EQ(ValuesFound(":\n1234567\n", {"1234567"}), 1.0);       // on the next line
  EXPECT_EQ(ValuesFound(" the calm-apple.", {"calm-apple"}), 1.0);
  EXPECT_EQ(ValuesFound(" Calm-Apple", {"calm-apple"}), 1.0);
  EXPECT_EQ(ValuesFound(" 8e4f2a1c-0b3d-4e5f-9a6b-7c8d9e0f1a2b.", {"8e4f2a1c-0b3d-4e5f-9a6b-7c8d9e0f1a2b"}), 1.0);
  EXPECT_EQ(ValuesFound(" 8e4f2a1c-0b3d", {"8e4f2a1c-0b3d-4e5f-9a6b-7c8d9e0f1a2b"}), 0.0);
  // Several values: a set, partial credit, no credit for reciting more.
  const std::vector<std::string> four = {"1111111", "2222222", "3333333", "4444444"};
  EXPECT_EQ(ValuesFound(" 4444444, 2222222, 1111111 and 3333333.", four), 1.0);
  EXPECT_EQ(ValuesFound(" 4444444, 2222222, 9999999 and 3333333.", four), 0.75);
  EXPECT_EQ(ValuesFound(" 5555555, 6666666, 7777777, 8888888, 1111111, 2222222", four), 0.0);
  EXPECT_EQ(ValuesFound(" 1111111, 1111111, 1111111, 1111111", four), 0.25);  // each candidate counts once
  // vt: the variable names, "VAR" is not one.
  const std::vector<std::string> vars = {"ABCDE", "FGHIJ", "KLMNO", "PQRST", "UVWXY"};
  EXPECT_EQ(ValuesFound(" VAR ABCDE, VAR FGHIJ, VAR KLMNO, VAR PQRST, VAR UVWXY", vars), 1.0);
  EXPECT_EQ(ValuesFound(" ABCDE FGHIJ KLMNO PQRST ZZZZZ", vars), 0.8);
  EXPECT_EQ(ValuesFound("", vars), 0.0);
}

// Generation stops when ValuesDecided: no continuation may change the score.
TEST(TextScoreTest, ValuesDecidedOnlyWhenTheScoreIsFixed) {
  const std::vector<std::string> one = {"1234567"};
  EXPECT_FALSE(ValuesDecided("", one));
  EXPECT_FALSE(ValuesDecided(" \n", one));
  EXPECT_FALSE(ValuesDecided(" 123", one));        // the number may go on
  EXPECT_FALSE(ValuesDecided(" 1234567", one));    // ... even when complete so far
  EXPECT_TRUE(ValuesDecided(" 1234567.", one));
  EXPECT_TRUE(ValuesDecided(" 12345.", one));      // a wrong number decides too
  EXPECT_FALSE(ValuesDecided(" none\n", one));     // no candidate yet
  EXPECT_FALSE(ValuesDecided(" the number is", one));
  const std::vector<std::string> two = {"1111111", "2222222"};
  EXPECT_FALSE(ValuesDecided(" 1111111, 22", two));
  EXPECT_TRUE(ValuesDecided(" 1111111, 2222222 and", two));
  // Whatever follows a decided output, the score stays.
  for (const char* out : {" 1234567.", " 12345.", " 12345, 1234567 and"}) {
    for (const char* more : {"", "9", " 1234567", "\n1234567"}) {
      EXPECT_EQ(ValuesFound(std::string(out) + more, one), ValuesFound(out, one)) << out << more;
    }
  }
}

}  // namespace
}  // namespace kvx::eval
