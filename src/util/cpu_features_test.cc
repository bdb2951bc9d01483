#include "util/cpu_features.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

namespace kvx::util {
namespace {

// The flags Linux reports for the first CPU in /proc/cpuinfo (empty when the
// file is absent): an independent reading of the same CPUID bits, also masked
// by the register state the OS enables.
std::set<std::string> ProcCpuFlags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string w; words >> w;) flags.insert(w);
    return flags;
  }
  return {};
}

TEST(CpuFeaturesTest, AgreesWithTheKernelsReadingOfCpuid) {
  const std::set<std::string> flags = ProcCpuFlags();
  if (flags.empty() || !flags.count("sse2")) GTEST_SKIP() << "no x86 flags in /proc/cpuinfo";
  // kvx's name -> the kernel's name for the same bit.
  const std::map<std::string, std::string> names = {
      {"sse2", "sse2"}, {"ssse3", "ssse3"}, {"sse4.1", "sse4_1"}, {"sse4.2", "sse4_2"},
      {"popcnt", "popcnt"}, {"pclmul", "pclmulqdq"}, {"aes", "aes"}, {"avx", "avx"},
      {"fma", "fma"}, {"f16c", "f16c"}, {"bmi", "bmi1"}, {"avx2", "avx2"},
      {"bmi2", "bmi2"}, {"lzcnt", "abm"}, {"avx512f", "avx512f"}, {"avx512dq", "avx512dq"},
      {"avx512cd", "avx512cd"}, {"avx512bw", "avx512bw"}, {"avx512vl", "avx512vl"},
      {"avx512vbmi", "avx512vbmi"}, {"avx512vbmi2", "avx512_vbmi2"}, {"gfni", "gfni"},
      {"vaes", "vaes"}, {"vpclmulqdq", "vpclmulqdq"}, {"avx512vnni", "avx512_vnni"},
      {"avx512bitalg", "avx512_bitalg"}, {"avx512vpopcntdq", "avx512_vpopcntdq"},
      {"avxvnni", "avx_vnni"}, {"avx512bf16", "avx512_bf16"}};
  for (const auto& [kvx_name, linux_name] : names) {
    ASSERT_TRUE(IsKnownCpuFeature(kvx_name)) << kvx_name;
    EXPECT_EQ(CpuHasFeature(kvx_name), flags.count(linux_name) == 1)
        << kvx_name << " (/proc/cpuinfo: " << linux_name << ")";
  }
  RecordProperty("cpu", CpuBrand());
  RecordProperty("features", CpuFeatureList());
}

TEST(CpuFeaturesTest, UnknownNamesAreNeverPresent) {
  EXPECT_FALSE(IsKnownCpuFeature("avx1024"));
  EXPECT_FALSE(CpuHasFeature("avx1024"));
  EXPECT_FALSE(CpuHasFeature(""));
}

TEST(CpuFeaturesTest, MissingFeaturesOfATargetString) {
  EXPECT_EQ(MissingCpuFeatures("avx1024,sse9"), (std::vector<std::string>{"avx1024", "sse9"}));
  EXPECT_TRUE(MissingCpuFeatures("").empty());
  const std::string list = CpuFeatureList();
  // Every listed feature is present; a string of them misses nothing.
  std::string csv = list;
  for (char& c : csv) c = c == ' ' ? ',' : c;
  EXPECT_TRUE(MissingCpuFeatures(csv).empty()) << csv;
  if (!CpuHasFeature("avxvnni")) {
    EXPECT_EQ(MissingCpuFeatures("avx2,avxvnni"), (std::vector<std::string>{"avxvnni"}));
  }
}

TEST(CpuFeaturesTest, FeaturesImplyTheirBase) {
  // The OS-state rule: no AVX-512 feature without AVX2's ymm state.
  if (CpuHasFeature("avx512f")) {
    EXPECT_TRUE(CpuHasFeature("avx"));
  }
  if (CpuHasFeature("avxvnni")) {
    EXPECT_TRUE(CpuHasFeature("avx"));
  }
  EXPECT_FALSE(CpuBrand().empty());
}

}  // namespace
}  // namespace kvx::util
