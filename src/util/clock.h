// Seconds on the monotonic clock (std::chrono::steady_clock) as a double:
// what every timing in kvx subtracts (phases, loads, swaps, progress).
//
// Thread-safety: safe from any thread.
#pragma once

#include <chrono>

namespace kvx::util {

inline double MonotonicSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace kvx::util
