// PolicyParamReader: reads and range-checks a policy's --kv parameters
// (PolicyParams), so every policy rejects bad input with the same kind of
// message: the policy, the key, the value, the valid range and an example.
// The keys a policy reads are the keys it takes: PolicyRegistry::Create
// calls Finish() after the policy's factory, which refuses every other key
// ("'beta' does not apply to policy snapkv ...; it takes: ..."), so a key
// is either read or refused, never accepted and ignored. A policy reads a
// key only where it acts (beta only with layers=pyramid); NotApplicable
// says why a known key was not read.
//
// Thread-safety: value type, one thread.
#pragma once

#pragma once

#include <map>
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
  // Free text (a file name): any non-empty value.
  PolicyParamReader& Text(std::string_view key, std::string* out);
  bool Has(std::string_view key) const { return params_.count(key) != 0; }

  // Records why `key` is not read here (e.g. "only layers=pyramid uses
  // it"), for Finish's message when the key is given anyway.
  PolicyParamReader& NotApplicable(std::string_view key, std::string why);

  // The first error, or InvalidArgument for a key nothing read.
  Status Finish() const;
  const std::string& policy() const { return policy_; }
  // The first parse or range error (Ok when none).
  const Status& error() const { return error_; }
  // The keys read so far, each with a valid value other than its default
  // (the next integer of the range, another choice, ...): what a test
  // sets to check that the key acts.
  const PolicyParams& examples() const { return examples_; }

 private:
  bool Seen(std::string_view key, std::string* value);
  std::string policy_;
  const PolicyParams& params_;
  PolicyParams examples_;
  std::map<std::string, std::string, std::less<>> not_applicable_;
  Status error_ = Status::Ok();
};

}  // namespace kvx::kv
