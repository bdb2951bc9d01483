#include "eval/cpu_report.h"

#include "eval/roofline.h"
#include "kv/codec/simd_x86.h"
#include "ops/simd_target.h"
#include "util/cpu_features.h"

namespace kvx::eval {
namespace {

std::string Join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

std::string KvAttentionPath() {
#ifdef KVX_KV_HAVE_X86_SIMD
  if (kv::simd::HasAvx512()) return "AVX-512";
  if (kv::simd::HasAvx2Fma()) return "AVX2";
#endif
  return "scalar";
}

}  // namespace

CpuReport DescribeCpu() {
  CpuReport r;
  r.brand = util::CpuBrand();
  r.features = util::CpuFeatureList();
  r.matmul_target = ops::ActiveSimdTarget();
  r.matmul_targets = ops::AvailableSimdTargets();
  for (const ops::SkippedSimdTarget& t : ops::SkippedSimdTargets()) {
    r.skipped.push_back(t.name + " (lacks " + Join(t.missing, " ") + ")");
  }
  r.kv_attention = KvAttentionPath();
  r.int8_probe = Int8ProbeIsa();
  return r;
}

std::string CpuReport::ToText() const {
  std::string s = "cpu: " + brand + "\n";
  s += "cpu features: " + (features.empty() ? std::string("none beyond the baseline") : features) + "\n";
  s += "kernels: matmul " + matmul_target + " (runs here: " + Join(matmul_targets, ", ") +
       (skipped.empty() ? "" : "; not on this CPU: " + Join(skipped, ", ")) + "), KV attention " + kv_attention +
       ", int8 peak probe " + int8_probe + "\n";
  return s;
}

nlohmann::json CpuReport::ToJson() const {
  return {{"brand", brand},           {"features", features},         {"matmul_target", matmul_target},
          {"matmul_targets", matmul_targets}, {"skipped_targets", skipped}, {"kv_attention", kv_attention},
          {"int8_probe", int8_probe}};
}

}  // namespace kvx::eval
