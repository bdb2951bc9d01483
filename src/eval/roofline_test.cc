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

// The probes' readings must lie between what any machine running this suite
// reaches, even a busy one (the floors), and what the hardware could do at
// all (the ceilings): a ceiling is the most a core can issue per cycle on the
// probe's instruction set at 6.5 GHz (above any x86 boost clock), times the
// threads. A miscounted rate (FLOPs or bytes counted twice, the wrong lane
// width, seconds taken for nanoseconds, a loop the compiler removed) lands
// outside; positive readings alone let all of these pass.
constexpr double kMaxClockHz = 6.5e9;

// FLOPs per cycle and core: 2 FMA pipes x lanes x 2 (SSE2: a multiply pipe
// and an add pipe, 4 lanes, 1 FLOP each).
double MaxFlopsPerCycle(const std::string& isa) {
  if (isa == "avx512") return 2 * 16 * 2;
  if (isa == "avx2") return 2 * 8 * 2;
  if (isa == "sse2") return 2 * 4;
  return 2 * 2;  // scalar: a multiply and an add per cycle, with ILP across the chains
}

TEST(RooflineTest, PeakFlopsIsWithinWhatTheIsaCanDo) {
  ThreadPool pool(2);
  // 100k iterations: 38 MFLOP per thread on AVX-512, long enough that thread
  // dispatch does not hide the rate (about a millisecond at the peak).
  const PeakFlopsResult r = MeasurePeakFlops(&pool, 100'000);
  ASSERT_TRUE(r.isa == "avx512" || r.isa == "avx2" || r.isa == "sse2" || r.isa == "scalar") << r.isa;
  EXPECT_GE(r.gflops, 1.0) << r.isa;
  EXPECT_LE(r.gflops, pool.size() * MaxFlopsPerCycle(r.isa) * kMaxClockHz / 1e9) << r.isa;
}

// The one-thread probe timed in CPU time: the same instruction set, a rate
// one core can reach (what the kernel benchmarks divide by).
TEST(RooflineTest, ThreadCpuFlopsProbeReadsOneCoresPlausibleRate) {
  ThreadPool pool(1);
  const PeakFlopsResult all = MeasurePeakFlops(&pool, 100'000);
  const PeakFlopsResult one = MeasurePeakFlopsThreadCpu(100'000, 3);
  EXPECT_EQ(one.isa, all.isa);
  EXPECT_GE(one.gflops, 1.0) << one.isa;
  EXPECT_LE(one.gflops, MaxFlopsPerCycle(one.isa) * kMaxClockHz / 1e9) << one.isa;
}

TEST(RooflineTest, BandwidthProbesReadPlausibleRates) {
  ThreadPool pool(2);
  // A 1 MiB array sits in L2/L3: at most 256 bytes per cycle and core (four
  // 64-byte loads; current cores sustain two or three), at least 1 GB/s.
  const double ceiling = pool.size() * 256.0 * kMaxClockHz / 1e9;
  const BandwidthResult r = MeasureBandwidth(&pool, size_t{1} << 20, 2);
  EXPECT_EQ(r.bytes, size_t{1} << 20);
  for (double gbps : {r.read_gbps, r.triad_gbps, MeasureStreamReadGbps(&pool, size_t{1} << 20, 2)}) {
    EXPECT_GE(gbps, 1.0);
    EXPECT_LE(gbps, ceiling);
  }
  EXPECT_GT(MeasureStreamReadGbps(&pool, 3, 1), 0);  // under one float: still a defined pass
}

TEST(RooflineTest, PeakInt8MatchesTheDetectedIsa) {
  ThreadPool pool(2);
  const std::string isa = Int8ProbeIsa();
  ASSERT_TRUE(isa == "avx512vnni" || isa == "avxvnni" || isa == "avx2" || isa == "none") << isa;
  const PeakInt8Result r = MeasurePeakInt8(&pool, 100'000);
  EXPECT_EQ(r.isa, isa);
  if (isa == "none") {
    EXPECT_EQ(r.gops, 0);
  } else {
    // Ceiling: two dot-product instructions per cycle and core, each of
    // (its MACs per iteration / its chains) MACs of 2 ops; floor 1 G op/s.
    const int chains = isa == "avx2" ? 8 : 12;
    const double ops_per_cycle = 2.0 * 2 * Int8ProbeMacsPerIter(isa) / chains;
    EXPECT_GE(r.gops, 1.0) << isa;
    EXPECT_LE(r.gops, pool.size() * ops_per_cycle * kMaxClockHz / 1e9) << isa;
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
