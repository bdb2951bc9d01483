#include "ops/simd_target.h"

#include <atomic>

#include "ops/matmul_internal.h"
#include "util/cpu_features.h"

#include "hwy/highway.h"
#include "hwy/targets.h"

namespace kvx::ops {
namespace {

// AVX-VNNI (the VEX vpdpbusd on 256 bits: Alder Lake and later Intel cores,
// Zen 5) is not a Highway target: the AVX2 target's kernels check this flag.
// kvx names the pair "AVX2_VNNI" so that tests and benchmarks can run the
// AVX2 kernels with and without it on one machine.
constexpr char kAvx2Vnni[] = "AVX2_VNNI";

// A compiled target (or the AVX2_VNNI variant) with its string and what this
// CPU lacks of it.
struct Target {
  int64_t bit;
  std::string name;
  std::string features;
  std::vector<std::string> missing;
};

std::string Join(const std::string& a, const std::string& b) { return a.empty() ? b : a + "," + b; }

// Every compiled target, best first, AVX2_VNNI before AVX2; computed once.
const std::vector<Target>& Compiled() {
  static const std::vector<Target> targets = [] {
    std::vector<Target> out;
    for (const internal::CompiledTarget& t : internal::CompiledTargets()) {
      const std::string name = hwy::TargetName(t.bit);
      if (t.bit == HWY_AVX2) {
        const std::string vnni = Join(t.features, KVX_AVX2_VNNI_FEATURES);
        out.push_back({t.bit, kAvx2Vnni, vnni, util::MissingCpuFeatures(vnni)});
      }
      out.push_back({t.bit, name, t.features, util::MissingCpuFeatures(t.features)});
    }
    return out;
  }();
  return targets;
}

bool CpuHasAvxVnni() {
  for (const Target& t : Compiled()) {
    if (t.name == kAvx2Vnni) return t.missing.empty();
  }
  return false;
}

// Highway targets compiled here whose strings name a feature the CPU lacks:
// Highway must never choose them (hwy::DisableTargets), whatever it detects.
int64_t UnverifiedTargetBits() {
  int64_t bits = 0;
  for (const Target& t : Compiled()) {
    if (!t.missing.empty() && t.name != kAvx2Vnni) bits |= t.bit;
  }
  return bits;
}

// Runs before main (this file is linked whenever a kernel is: the kernels
// read AvxVnniEnabled), so no dispatch happens before the check.
const bool kDispatchVerified = [] {
  hwy::DisableTargets(UnverifiedTargetBits());
  return true;
}();

// Highway's supported targets among those compiled, best first (lower bits
// are better), minus the unverified ones.
std::vector<int64_t> Available() {
  std::vector<int64_t> out;
  const int64_t targets =
      hwy::SupportedTargets() & (HWY_TARGETS | HWY_STATIC_TARGET) & ~UnverifiedTargetBits();
  for (int64_t bit = 1; bit != 0 && bit <= targets; bit <<= 1) {
    if (targets & bit) out.push_back(bit);
  }
  return out;
}

// The vector class a target string allows the kernels outside Highway (the
// kv attention kernels): AVX-512 with avx512f, AVX2 with avx2, else scalar.
util::SimdClass SimdClassOf(const std::string& features) {
  if (features.find("avx512f") != std::string::npos) return util::SimdClass::kAvx512;
  if (features.find("avx2") != std::string::npos) return util::SimdClass::kAvx2;
  return util::SimdClass::kScalar;
}

std::atomic<bool>& AvxVnniFlag() {
  static std::atomic<bool> flag(CpuHasAvxVnni());
  return flag;
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
  std::vector<std::string> names;
  const bool with_vnni = AvxVnniFlag().load(std::memory_order_relaxed);
  for (int64_t t : Available()) {
    if (t == HWY_AVX2 && with_vnni) names.emplace_back(kAvx2Vnni);
    names.emplace_back(hwy::TargetName(t));
  }
  return names;
}

std::vector<SkippedSimdTarget> SkippedSimdTargets() {
  std::vector<SkippedSimdTarget> out;
  for (const Target& t : Compiled()) {
    if (!t.missing.empty()) out.push_back({t.name, t.missing});
  }
  return out;
}

std::string SimdTargetFeatures(const std::string& name) {
  for (const Target& t : Compiled()) {
    if (t.name == name) return t.features;
  }
  return "";
}

bool ForceSimdTarget(const std::string& name) {
  (void)kDispatchVerified;
  hwy::SetSupportedTargetsForTest(0);
  AvxVnniFlag().store(CpuHasAvxVnni(), std::memory_order_relaxed);
  util::SimdClassLimit().store(util::SimdClass::kAvx512, std::memory_order_relaxed);
  if (name.empty()) return true;
  const bool vnni = name == kAvx2Vnni;
  if (vnni && !CpuHasAvxVnni()) return false;
  const std::string hwy_name = vnni ? hwy::TargetName(HWY_AVX2) : name;
  for (int64_t t : Available()) {
    if (hwy_name == hwy::TargetName(t)) {
      hwy::SetSupportedTargetsForTest(t);
      AvxVnniFlag().store(vnni, std::memory_order_relaxed);
      util::SimdClassLimit().store(SimdClassOf(SimdTargetFeatures(name)), std::memory_order_relaxed);
      return true;
    }
  }
  return false;
}

}  // namespace kvx::ops
