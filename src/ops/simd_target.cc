#include "ops/simd_target.h"

#include <atomic>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "ops/matmul_internal.h"

#include "hwy/highway.h"
#include "hwy/targets.h"

namespace kvx::ops {
namespace {

// HWY_TARGETS is the set compiled by foreach_target under this library's
// build flags (the same flags compile matmul_simd.cc). Lower bits are better.
std::vector<int64_t> Available() {
  std::vector<int64_t> out;
  const int64_t targets = hwy::SupportedTargets() & (HWY_TARGETS | HWY_STATIC_TARGET);
  for (int64_t bit = 1; bit != 0 && bit <= targets; bit <<= 1) {
    if (targets & bit) out.push_back(bit);
  }
  return out;
}

// AVX-VNNI (the VEX vpdpbusd on 256 bits: Alder Lake and later Intel cores,
// Zen 5) is not a Highway target: the AVX2 target's kernels check this flag.
// kvx names the pair "AVX2_VNNI" so that tests and benchmarks can run the
// AVX2 kernels with and without it on one machine.
constexpr char kAvx2Vnni[] = "AVX2_VNNI";

bool CpuHasAvxVnni() {
#if defined(__x86_64__) || defined(__i386__)
  // CPUID leaf 7, subleaf 1, EAX bit 4 (clang 14 lacks the builtin's
  // "avxvnni" name). The ymm state it needs is checked by the AVX2 target.
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0 && (eax & (1u << 4)) != 0;
  }();
  return has;
#else
  return false;
#endif
}

std::atomic<bool>& AvxVnniFlag() {
  static std::atomic<bool> flag(CpuHasAvxVnni());
  return flag;
}

// Names of the available targets, best first, with AVX2_VNNI before AVX2
// when the CPU has it.
std::vector<std::string> Names(bool with_vnni) {
  std::vector<std::string> names;
  for (int64_t t : Available()) {
    if (t == HWY_AVX2 && with_vnni) names.emplace_back(kAvx2Vnni);
    names.emplace_back(hwy::TargetName(t));
  }
  return names;
}

}  // namespace

namespace internal {
bool AvxVnniEnabled() { return AvxVnniFlag().load(std::memory_order_relaxed); }
}  // namespace internal

std::string ActiveSimdTarget() {
  const auto t = Available();
  if (t.empty()) return "SCALAR";
  if (t.front() == HWY_AVX2 && internal::AvxVnniEnabled()) return kAvx2Vnni;
  return hwy::TargetName(t.front());
}

std::vector<std::string> AvailableSimdTargets() {
  // Once a target is forced, Available() holds only it; the VNNI variant is
  // listed when the flag is on (the default on such a CPU, or forced).
  return Names(AvxVnniFlag().load(std::memory_order_relaxed));
}

bool ForceSimdTarget(const std::string& name) {
  hwy::SetSupportedTargetsForTest(0);
  AvxVnniFlag().store(CpuHasAvxVnni(), std::memory_order_relaxed);
  if (name.empty()) return true;
  const bool vnni = name == kAvx2Vnni;
  if (vnni && !CpuHasAvxVnni()) return false;
  const std::string hwy_name = vnni ? hwy::TargetName(HWY_AVX2) : name;
  for (int64_t t : Available()) {
    if (hwy_name == hwy::TargetName(t)) {
      hwy::SetSupportedTargetsForTest(t);
      AvxVnniFlag().store(vnni, std::memory_order_relaxed);
      return true;
    }
  }
  return false;
}

}  // namespace kvx::ops
