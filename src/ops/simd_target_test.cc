#include "ops/simd_target.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "util/cpu_features.h"

namespace kvx::ops {
namespace {

bool Contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

std::vector<std::string> Split(const std::string& csv) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= csv.size()) {
    const size_t e = std::min(csv.find(',', b), csv.size());
    if (e > b) out.push_back(csv.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

// From the real CPUID bits: every target dispatch may choose has every
// feature its kernels are compiled with, and the active one is the best.
TEST(SimdTargetTest, DispatchNeverChoosesATargetWhoseFeaturesTheCpuLacks) {
  const std::vector<std::string> available = AvailableSimdTargets();
  ASSERT_FALSE(available.empty());
  for (const std::string& name : available) {
    EXPECT_TRUE(util::MissingCpuFeatures(SimdTargetFeatures(name)).empty())
        << name << " is available but its string '" << SimdTargetFeatures(name) << "' names a missing feature";
  }
  EXPECT_EQ(ActiveSimdTarget(), available.front());
  for (const SkippedSimdTarget& t : SkippedSimdTargets()) {
    EXPECT_FALSE(t.missing.empty()) << t.name;
    EXPECT_FALSE(Contains(available, t.name)) << t.name;
    EXPECT_FALSE(ForceSimdTarget(t.name)) << t.name << " could be forced although the CPU lacks a feature";
    for (const std::string& f : t.missing) EXPECT_FALSE(util::CpuHasFeature(f)) << f;
  }
  ForceSimdTarget("");
  RecordProperty("active", ActiveSimdTarget());
  RecordProperty("cpu", util::CpuBrand());
}

// One forced target routes every kernel: the kernels that dispatch outside
// Highway (the kv attention kernels) read the vector class it allows.
TEST(SimdTargetTest, ForcingATargetLimitsTheOtherKernelsToItsClass) {
  const std::vector<std::string> available = AvailableSimdTargets();
  ASSERT_TRUE(ForceSimdTarget(available.back()));
  EXPECT_FALSE(util::SimdClassAllowed(util::SimdClass::kAvx2)) << available.back();
  if (Contains(available, "AVX2")) {
    ASSERT_TRUE(ForceSimdTarget("AVX2"));
    EXPECT_TRUE(util::SimdClassAllowed(util::SimdClass::kAvx2));
    EXPECT_FALSE(util::SimdClassAllowed(util::SimdClass::kAvx512));
  }
  ASSERT_TRUE(ForceSimdTarget(""));
  EXPECT_TRUE(util::SimdClassAllowed(util::SimdClass::kAvx512));
  EXPECT_FALSE(ForceSimdTarget("NOT_A_TARGET"));
  EXPECT_TRUE(util::SimdClassAllowed(util::SimdClass::kAvx512)) << "a refused target must not leave a limit";
}

// The features each target's string names are the ones its kernels need and
// no more: AVX3_DL's 256-bit dot products must be the EVEX form of
// AVX512-VNNI (+VL), never AVX-VNNI's VEX form, which Zen 4, Ice Lake-SP and
// Cascade Lake lack; only the AVX2_VNNI variant adds AVX-VNNI.
TEST(SimdTargetTest, TargetStringsNameTheRightVnni) {
  const std::vector<std::string> avx3 = Split(SimdTargetFeatures("AVX3_DL"));
  if (!avx3.empty()) {
    EXPECT_TRUE(Contains(avx3, "avx512vnni"));
    EXPECT_TRUE(Contains(avx3, "avx512vl"));
    EXPECT_FALSE(Contains(avx3, "avxvnni")) << SimdTargetFeatures("AVX3_DL");
  }
  const std::vector<std::string> avx2 = Split(SimdTargetFeatures("AVX2"));
  if (!avx2.empty()) {
    EXPECT_TRUE(Contains(avx2, "avx2"));
    EXPECT_FALSE(Contains(avx2, "avxvnni"));
    for (const std::string& f : avx2) EXPECT_EQ(f.rfind("avx512", 0), std::string::npos) << f;
    std::vector<std::string> vnni = Split(SimdTargetFeatures("AVX2_VNNI"));
    EXPECT_TRUE(Contains(vnni, "avxvnni"));
  }
  // Every name in every string is one kvx can check.
  for (const char* t : {"AVX3_DL", "AVX2", "AVX2_VNNI"}) {
    for (const std::string& f : Split(SimdTargetFeatures(t))) EXPECT_TRUE(util::IsKnownCpuFeature(f)) << t << ": " << f;
  }
}

}  // namespace
}  // namespace kvx::ops
