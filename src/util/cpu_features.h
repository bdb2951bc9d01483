// What this CPU can run: the one CPUID reading behind every SIMD choice in
// kvx (the ops/ targets and their dispatch, the kv/codec/ attention kernels,
// the roofline probes). kvx is built for baseline x86-64; each SIMD path is
// compiled with a target-attribute string and runs only when every feature
// that string names is reported here.
//
// A feature counts only when the OS also saves the register state it needs
// (XCR0: ymm for AVX-class features, opmask and zmm for AVX-512), so a kernel
// that the CPU could decode but the OS would corrupt is never chosen.
// AVX-VNNI ("avxvnni", the VEX vpdpbusd) and AVX512-VNNI ("avx512vnni", the
// EVEX one) are different CPUID bits: Zen 4, Ice Lake-SP and Cascade Lake have
// only the second, Alder Lake only the first, Sapphire Rapids and Zen 5 both.
//
// Thread-safety: read once, then immutable; every function is thread-safe.
#pragma once

#include <atomic>
#include <string>
#include <string_view>
#include <vector>

namespace kvx::util {

// Whether the CPU (and OS) supports the feature named as in GCC/clang target
// attributes ("avx2", "fma", "f16c", "avx512vnni", "avxvnni", "sse4.1", ...).
// False for a name kvx does not know, so an unknown feature is never assumed.
bool CpuHasFeature(std::string_view gcc_name);

// Whether kvx knows how to detect the named feature (see CpuHasFeature).
bool IsKnownCpuFeature(std::string_view gcc_name);

// The features of a comma-separated target string ("avx2,fma,f16c") that the
// CPU lacks (unknown names included), in order; empty when all are present.
std::vector<std::string> MissingCpuFeatures(std::string_view target_string);

// The known features this CPU has, in a fixed order, e.g. "sse4.2 avx avx2
// fma f16c avx512f ... avx512vnni avxvnni".
std::string CpuFeatureList();

// The widest class of vector code any kernel may run: a test and benchmark
// hook, set only by ops::ForceSimdTarget (together with Highway's dispatch of
// the ops kernels), and read by the kernels that dispatch on their own (the
// kv attention kernels, kv/codec/simd_x86.h), so one forced target routes
// every kernel. kAvx512 (the default) limits nothing. Never a CPU check: a
// kernel still runs only where the CPU has its features.
enum class SimdClass { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
inline std::atomic<SimdClass>& SimdClassLimit() {
  static std::atomic<SimdClass> limit{SimdClass::kAvx512};
  return limit;
}
inline bool SimdClassAllowed(SimdClass c) { return SimdClassLimit().load(std::memory_order_relaxed) >= c; }

// The CPU's brand string (CPUID 0x80000002..4), e.g. "AMD EPYC 9R14", or
// "unknown" when the CPU does not report one.
std::string CpuBrand();

}  // namespace kvx::util
