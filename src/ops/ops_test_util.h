// Test data shared by the ops/ unit tests: Gaussian vectors and quantized
// weight matrices.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "ops/matmul.h"
#include "ops/quant_blocks.h"
#include "ops/quantize.h"
#include "ops/simd_target.h"

namespace kvx::ops::testing {

// The SIMD targets a test that covers "every target" runs: those compiled in
// that this CPU can run (AvailableSimdTargets), best first, the baseline
// last. The compiled targets it cannot run are named, with the features the
// CPU lacks, in the test's output and XML properties, never executed.
inline std::vector<std::string> TestableTargets() {
  std::string skipped;
  for (const SkippedSimdTarget& t : SkippedSimdTargets()) {
    std::string missing;
    for (const std::string& f : t.missing) missing += (missing.empty() ? "" : " ") + f;
    std::cout << "[ SKIPPED  ] SIMD target " << t.name << ": this CPU lacks " << missing << "\n";
    skipped += (skipped.empty() ? "" : "; ") + t.name + " (lacks " + missing + ")";
  }
  if (!skipped.empty()) ::testing::Test::RecordProperty("skipped_simd_targets", skipped);
  return AvailableSimdTargets();
}

inline std::vector<float> Gaussian(int64_t n, uint32_t seed, float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(mean, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

// A quantized weight matrix; rows may be padded (row_bytes > RowBytesOf).
struct TestMatrix {
  std::vector<uint8_t> bytes;
  WeightView view;
};

inline TestMatrix MakeMatrix(gguf::TensorType t, int64_t n_in, int64_t n_out, uint32_t seed, size_t pad = 0) {
  TestMatrix m;
  const size_t rb = RowBytesOf(t, n_in) + pad;
  m.bytes.assign(rb * n_out, 0xAB);  // padding bytes are garbage on purpose
  const auto w = Gaussian(n_in * n_out, seed);
  for (int64_t o = 0; o < n_out; ++o) QuantizeRow(t, w.data() + o * n_in, m.bytes.data() + o * rb, n_in);
  m.view = WeightView{t, m.bytes.data(), n_in, n_out, rb};
  return m;
}

}  // namespace kvx::ops::testing
