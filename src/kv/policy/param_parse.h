// Parsing of policy parameters (the --kv policy group's key=value text) for
// the policies of issue 21b (quest, duo, razor, ...): integers and fractions
// with range checks, each error an InvalidArgument naming the policy, the
// key, the value and the range.
#pragma once

#include <string>
#include <string_view>

#include "util/status.h"

namespace kvx::kv {

inline Result<int> ParseIntParam(std::string_view policy, std::string_view key, const std::string& value, int lo,
                                 int hi) {
  size_t used = 0;
  long v = 0;
  try {
    v = std::stol(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size() || v < lo || v > hi) {
    return InvalidArgument("policy " + std::string(policy) + ": " + std::string(key) + "=" + value +
                           " must be an integer in " + std::to_string(lo) + ".." + std::to_string(hi));
  }
  return static_cast<int>(v);
}

inline Result<double> ParseFractionParam(std::string_view policy, std::string_view key, const std::string& value,
                                         double lo, double hi) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size() || !(v >= lo && v <= hi)) {
    return InvalidArgument("policy " + std::string(policy) + ": " + std::string(key) + "=" + value +
                           " must be a number in " + std::to_string(lo) + ".." + std::to_string(hi));
  }
  return v;
}

}  // namespace kvx::kv
