#include "eval/roofline.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ops/matmul_internal.h"

namespace kvx::eval {
namespace {

// Few iterations: these tests check what the probes compute and count, never
// how fast the machine is.
constexpr long kIters = 1000;

TEST(RooflineTest, PeakFlopsIsPositiveWithAKnownIsa) {
  ThreadPool pool(2);
  const PeakFlopsResult r = MeasurePeakFlops(&pool, kIters);
  EXPECT_GT(r.gflops, 0);
  EXPECT_TRUE(r.isa == "avx512" || r.isa == "avx2" || r.isa == "sse2" || r.isa == "scalar") << r.isa;
}

TEST(RooflineTest, BandwidthProbesReadSomething) {
  ThreadPool pool(2);
  const BandwidthResult dram = MeasureBandwidth(&pool, size_t{1} << 20, 2);
  EXPECT_GT(dram.read_gbps, 0);
  EXPECT_GT(dram.triad_gbps, 0);
  EXPECT_GT(MeasureStreamReadGbps(&pool, size_t{1} << 20, 2), 0);
  EXPECT_GT(MeasureStreamReadGbps(&pool, 3, 1), 0);  // under one float: still a defined pass
}

TEST(RooflineTest, PeakInt8MatchesTheDetectedIsa) {
  ThreadPool pool(2);
  const std::string isa = Int8ProbeIsa();
  ASSERT_TRUE(isa == "avx512vnni" || isa == "avxvnni" || isa == "avx2" || isa == "none") << isa;
  const PeakInt8Result r = MeasurePeakInt8(&pool, kIters);
  EXPECT_EQ(r.isa, isa);
  if (isa == "none") {
    EXPECT_EQ(r.gops, 0);
  } else {
    EXPECT_GT(r.gops, 0);
  }
}

// Every multiply-accumulate the probe counts must have run: the kernel's
// accumulator lanes sum to exactly (product) x (counted MACs).
TEST(RooflineTest, Int8KernelPerformsTheCountedMultiplyAccumulates) {
  const std::string isa = Int8ProbeIsa();
  if (isa == "none") GTEST_SKIP() << "no int8 dot-product instructions on this CPU";
  const int64_t macs = Int8ProbeMacsPerIter(isa);
  EXPECT_EQ(macs, isa == "avx512vnni" ? 12 * 64 : isa == "avxvnni" ? 12 * 32 : 8 * 32);
  for (long iters : {1L, 7L, kIters}) {
    EXPECT_EQ(RunInt8ProbeKernel(isa, iters), int64_t{kInt8ProbeProduct} * macs * iters) << isa << " " << iters;
  }
  EXPECT_EQ(RunInt8ProbeKernel(isa, 0), 0);
}

// The weaker kernels run too on a CPU that has the stronger ones (the
// selection only picks the best).
TEST(RooflineTest, EverySupportedInt8KernelIsExact) {
  const std::vector<std::string> isas = Int8ProbeIsas();
  EXPECT_EQ(Int8ProbeIsa(), isas.empty() ? "none" : isas.front());
  for (const std::string& isa : isas) {
    EXPECT_EQ(RunInt8ProbeKernel(isa, 100), int64_t{kInt8ProbeProduct} * Int8ProbeMacsPerIter(isa) * 100) << isa;
  }
  EXPECT_EQ(Int8ProbeMacsPerIter("none"), 0);
  EXPECT_EQ(Int8ProbeMacsPerIter("neon"), 0);
}

// speed_bench picks the peak by weight type; it must agree with the path
// ops/ actually takes (an internal of ops/, hence checked here).
TEST(RooflineTest, UsesInt8DotMatchesTheMatMulIntegerPath) {
  for (uint32_t t = 0; t < 64; ++t) {
    const auto type = static_cast<gguf::TensorType>(t);
    EXPECT_EQ(UsesInt8Dot(type), ops::internal::IsIntPathType(type)) << t;
  }
}

}  // namespace
}  // namespace kvx::eval
