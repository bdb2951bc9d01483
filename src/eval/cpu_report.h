// Which CPU a measurement came from and which kernels ran on it: the CPU's
// brand and features (util/cpu_features.h), the ops/ target matmuls dispatch
// to and the ones this build cannot run here, the kv/ attention kernels' path
// and the roofline int8 probe's instruction. `kvx bench` and `kvx inspect`
// print it, and bench reports carry it, so every figure names its machine.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvx::eval {

struct CpuReport {
  std::string brand;                        // "AMD EPYC 9R14"
  std::string features;                     // space-separated, util::CpuFeatureList
  std::string matmul_target;                // ops::ActiveSimdTarget
  std::vector<std::string> matmul_targets;  // every target this CPU runs, best first
  std::vector<std::string> skipped;         // "AVX3_DL (lacks avx512vnni)"
  std::string kv_attention;                 // "AVX-512", "AVX2" or "scalar"
  std::string int8_probe;                   // roofline's int8 instruction set

  std::string ToText() const;  // three lines, each ending in '\n'
  nlohmann::json ToJson() const;
};

CpuReport DescribeCpu();

}  // namespace kvx::eval
