#include "util/printable.h"

#include <gtest/gtest.h>

#include <string>

namespace kvx {
namespace {

using namespace std::string_literals;

TEST(PrintableTest, KeepsOrdinaryText) {
  EXPECT_EQ(Printable("llama.block_count"), "llama.block_count");
  EXPECT_EQ(Printable("plain é 日本 🙂 \\ \"q\""), "plain é 日本 🙂 \\ \"q\"");
  EXPECT_EQ(Printable(""), "");
}

TEST(PrintableTest, EscapesControlBytesAndNul) {
  // A NUL must not end the text (printf("%s") would stop there).
  EXPECT_EQ(Printable("ab\0cd"s), "ab\\x00cd");
  EXPECT_EQ(Printable("\x1B[2J\rX\n\t\x7F"), "\\x1B[2J\\x0DX\\x0A\\x09\\x7F");
}

TEST(PrintableTest, EscapesInvalidUtf8) {
  EXPECT_EQ(Printable("a\xFF" "b"), "a\\xFFb");
  EXPECT_EQ(Printable("\xC0\xAF"), "\\xC0\\xAF");             // overlong
  EXPECT_EQ(Printable("\xED\xA0\x80"), "\\xED\\xA0\\x80");    // surrogate
  EXPECT_EQ(Printable("\xF4\x90\x80\x80"), "\\xF4\\x90\\x80\\x80");  // > U+10FFFF
  EXPECT_EQ(Printable("x\xE6\x97"), "x\\xE6\\x97");           // cut character
}

TEST(PrintableTest, EscapesC1AndBidiControls) {
  EXPECT_EQ(Printable("\xC2\x9B" "31m"), "\\u{9B}31m");           // U+009B CSI
  EXPECT_EQ(Printable("a\xE2\x80\xAE" "b"), "a\\u{202E}b");       // right-to-left override
  EXPECT_EQ(Printable("\xE2\x81\xA6"), "\\u{2066}");
  EXPECT_EQ(Printable("\xC2\xA0"), "\xC2\xA0");                   // U+00A0 is printable
}

TEST(PrintableTest, CapsLengthAtACharacterBoundary) {
  EXPECT_EQ(Printable(std::string(300, 'a'), 4), "aaaa...(300 bytes)");
  EXPECT_EQ(Printable("ab日本", 4), "ab...(8 bytes)");  // 日 would end past byte 4
  EXPECT_EQ(Printable("abcd", 4), "abcd");
  EXPECT_EQ(QuotePrintable("k\x01"), "'k\\x01'");
}

TEST(PrintableTest, OutputHasNoControlBytes) {
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  const std::string p = Printable(all + all, 10000);
  for (char c : p) EXPECT_GE(static_cast<unsigned char>(c), 0x20);
  EXPECT_EQ(p.find('\x7F'), std::string::npos);
}

}  // namespace
}  // namespace kvx
