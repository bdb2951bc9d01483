#include "util/byte_size.h"

#include <gtest/gtest.h>

namespace kvx {
namespace {

uint64_t Bytes(std::string_view text) {
  auto r = ParseByteSize(text);
  EXPECT_TRUE(r.ok()) << text << ": " << r.status().message();
  return r.ok() ? *r : 0;
}

TEST(ByteSizeTest, SuffixesAreBinaryAndCaseInsensitive) {
  EXPECT_EQ(Bytes("0"), 0u);
  EXPECT_EQ(Bytes("1000"), 1000u);
  EXPECT_EQ(Bytes("1000B"), 1000u);
  EXPECT_EQ(Bytes("3K"), 3072u);
  EXPECT_EQ(Bytes("3kib"), 3072u);
  EXPECT_EQ(Bytes("2 MiB"), 2ull << 20);
  EXPECT_EQ(Bytes(" 2m "), 2ull << 20);
  EXPECT_EQ(Bytes("5G"), 5ull << 30);
  EXPECT_EQ(Bytes("16GiB"), 16ull << 30);
  EXPECT_EQ(Bytes("18446744073709551615"), UINT64_MAX);
}

TEST(ByteSizeTest, RejectsWhatIsNotASizeNamingIt) {
  for (const char* bad : {"", "lots", "G", "1.5G", "-1", "1T", "1 2", "1,G", "budget=1G", "1 M iB", "0x10"}) {
    auto r = ParseByteSize(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("is not a size"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("K, M, G"), std::string::npos);
  }
  EXPECT_EQ(ParseByteSize("lots").status().message().rfind("'lots' is not a size", 0), 0u);
}

TEST(ByteSizeTest, RejectsOverflowInsteadOfWrapping) {
  for (const char* big : {"18446744073709551616", "99999999999999999999G", "17179869184G"}) {
    auto r = ParseByteSize(big);
    ASSERT_FALSE(r.ok()) << big;
    EXPECT_NE(r.status().message().find("is too large"), std::string::npos) << r.status().message();
  }
  EXPECT_EQ(Bytes("17179869183G"), 17179869183ull << 30);
}

TEST(ByteSizeTest, QuotesHostileTextPrintably) {
  auto r = ParseByteSize("1\x1B[2J");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("\\x1B[2J"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace kvx
