#include "ops/simd_target.h"

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

}  // namespace

std::string ActiveSimdTarget() {
  const auto t = Available();
  return t.empty() ? "SCALAR" : hwy::TargetName(t.front());
}

std::vector<std::string> AvailableSimdTargets() {
  std::vector<std::string> names;
  for (int64_t t : Available()) names.emplace_back(hwy::TargetName(t));
  return names;
}

bool ForceSimdTarget(const std::string& name) {
  if (name.empty()) {
    hwy::SetSupportedTargetsForTest(0);
    return true;
  }
  hwy::SetSupportedTargetsForTest(0);
  for (int64_t t : Available()) {
    if (name == hwy::TargetName(t)) {
      hwy::SetSupportedTargetsForTest(t);
      return true;
    }
  }
  return false;
}

}  // namespace kvx::ops
