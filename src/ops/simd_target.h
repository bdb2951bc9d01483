// Which SIMD code the ops kernels run. kvx is built for baseline x86-64 and
// compiles its hot kernels once per SIMD target (Highway foreach_target:
// AVX3_DL = AVX-512 with VNNI, AVX2, and the scalar baseline); at run time
// each call dispatches to the best target the CPU supports. "AVX2_VNNI" is
// kvx's name for the AVX2 target on a CPU with AVX-VNNI, whose repacked Q8_0
// kernel then uses it (listed before "AVX2", which forces it off).
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

// Restricts dispatch to the named target (one of AvailableSimdTargets());
// "" restores the default. Returns false for an unknown/unavailable name.
bool ForceSimdTarget(const std::string& name);

}  // namespace kvx::ops
