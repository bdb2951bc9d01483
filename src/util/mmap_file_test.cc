#include "util/mmap_file.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "support/test_data.h"

namespace kvx {
namespace {

// procfs files report st_size 0: a reader that trusts the size reads
// nothing (`kvx run -f /proc/cpuinfo` generated from an empty prompt).
TEST(ReadFileToStringTest, ReadsFilesThatReportSizeZeroToTheEnd) {
  auto text = ReadFileToString("/proc/self/status");
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_NE(text->find("Name:"), std::string::npos) << *text;
  EXPECT_NE(text->find("VmRSS:"), std::string::npos) << "read to the end, not one buffer";
}

TEST(ReadFileToStringTest, LimitHoldsWhatTheSizeDoesNotTell) {
  auto text = ReadFileToString("/proc/self/status", 16);
  EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument) << text.status().ToString();
  EXPECT_NE(text.status().message().find("at most 16 bytes"), std::string::npos) << text.status().message();
}

TEST(ReadFileToStringTest, NonEmptyTextFileRefusesAnEmptyOne) {
  const std::string path = testing::TempDir() + "/empty_prompt.txt";
  std::ofstream(path) << "";
  auto text = ReadNonEmptyTextFile(path);
  EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument) << text.status().ToString();
  EXPECT_NE(text.status().message().find("is empty"), std::string::npos) << text.status().message();
  std::ofstream(path) << "x";
  ASSERT_TRUE(ReadNonEmptyTextFile(path).ok());
  EXPECT_EQ(*ReadNonEmptyTextFile(path), "x");
}

}  // namespace
}  // namespace kvx
