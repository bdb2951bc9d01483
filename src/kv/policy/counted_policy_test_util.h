// A policy for tests of the spec path: it does nothing but count how often
// it is constructed, so a test can check that each policy of a spec is
// built once (kv/resolved_spec.h). Not part of the library.
#pragma once

#include <memory>
#include <string_view>

#include "kv/policy/policy.h"

namespace kvx::kv::testing {

class CountedPolicy : public KVPolicy {
 public:
  static constexpr std::string_view kName = "test_counted";
  static inline int built = 0;  // constructions so far
  CountedPolicy() { ++built; }
  std::string_view name() const override { return kName; }
  Status OnStepCommitted(KVManager&, SeqId) override { return Status::Ok(); }

  // Makes "policy=test_counted" available in PolicyRegistry::Global().
  static void Register() {
    PolicyRegistry::Global().Register(std::string(kName), [](PolicyParamReader&) -> Result<std::unique_ptr<KVPolicy>> {
      return std::unique_ptr<KVPolicy>(new CountedPolicy());
    });
  }
};

}  // namespace kvx::kv::testing
