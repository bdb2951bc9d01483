// Which SIMD code the ops kernels run. kvx is built for baseline x86-64 and
// compiles its hot kernels once per SIMD target (Highway foreach_target:
// AVX3_DL = AVX-512 with AVX512-VNNI, AVX2, and the scalar baseline); at run
// time each call dispatches to the best target the CPU supports. "AVX2_VNNI"
// is kvx's name for the AVX2 target on a CPU with AVX-VNNI, whose repacked
// Q8_0 kernel then uses it (listed before "AVX2", which forces it off).
//
// A target is dispatched to only when the CPU has every feature of the string
// its kernels are compiled with (util/cpu_features.h reads CPUID), whatever
// Highway's own check says: Highway 1.0.3 compiled AVX3_DL with AVX-VNNI but
// selected it on AVX512-VNNI alone (see ops/hwy_fix).
//
// Thread-safety: the queries are thread-safe. ForceSimdTarget is a test and
// benchmark hook: call it only while no kernel is running.
#pragma once

#include <string>
#include <vector>

namespace kvx::ops {

// Name of the target kernels dispatch to now, e.g. "AVX3_DL", "AVX2", "SCALAR".
std::string ActiveSimdTarget();

// Targets compiled into this build that this CPU can run, best first.
std::vector<std::string> AvailableSimdTargets();

// Targets compiled into this build that this CPU cannot run, each with the
// features of its string that the CPU lacks ("AVX3_DL: avx512vnni ...").
struct SkippedSimdTarget {
  std::string name;
  std::vector<std::string> missing;
};
std::vector<SkippedSimdTarget> SkippedSimdTargets();

// The comma-separated target string the named target's kernels are compiled
// with ("" for the baseline or an unknown name).
std::string SimdTargetFeatures(const std::string& name);

// Restricts dispatch to the named target (one of AvailableSimdTargets());
// "" restores the default. Returns false for an unknown/unavailable name.
// The one way to force a SIMD path in tests and benchmarks: it also limits
// the kernels outside Highway (the kv attention kernels) to the target's
// vector class (util::SimdClassLimit): AVX2 for "AVX2", scalar for the
// baseline target (the last of AvailableSimdTargets()).
bool ForceSimdTarget(const std::string& name);

}  // namespace kvx::ops
