// PolicyParamReader: reads and range-checks a policy's --kv parameters
// (PolicyParams), so every policy rejects bad input with the same kind of
// message: the policy, the key, the value, the valid range and an example.
// Finish() rejects keys no reader asked for (a typo is an error, not a
// silently ignored default), listing the keys the policy takes.
//
// Thread-safety: value type, one thread.
#pragma once

#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kv/policy/policy.h"
#include "util/status.h"

namespace kvx::kv {

class PolicyParamReader {
 public:
  PolicyParamReader(std::string policy, const PolicyParams& params) : policy_(std::move(policy)), params_(params) {}

  // Each reads `key` into *out when present (leaving the default otherwise)
  // and records the key as known. The first error is kept and returned by
  // Finish(); later reads are no-ops.
  PolicyParamReader& Int(std::string_view key, int* out, int lo, int hi);
  PolicyParamReader& Double(std::string_view key, double* out, double lo, double hi);  // [lo, hi]
  PolicyParamReader& Choice(std::string_view key, std::string* out, const std::vector<std::string>& choices);
  PolicyParamReader& Bool(std::string_view key, bool* out);
  bool Has(std::string_view key) const { return params_.count(key) != 0; }

  // The first error, or InvalidArgument for a key nothing read.
  Status Finish() const;
  const std::string& policy() const { return policy_; }

 private:
  bool Seen(std::string_view key, std::string* value);
  std::string policy_;
  const PolicyParams& params_;
  std::set<std::string, std::less<>> known_;
  Status error_ = Status::Ok();
};

}  // namespace kvx::kv
