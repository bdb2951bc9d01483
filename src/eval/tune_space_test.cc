// DefaultTuneSpace's codec-only settings (tune.cc), on their own beside
// tune_test.cc (which runs searches on a model): when a codec's defaults
// change (kv::DefaultsOf), the space keeps every setting it searched before,
// spelled out, and holds the new default too.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "eval/tune.h"
#include "kv/kv_spec.h"

namespace kvx::eval {
namespace {

std::set<std::string> CanonicalSpace() {
  std::set<std::string> out;
  for (const std::string& s : DefaultTuneSpace()) out.insert(kv::ParseKVSpec(s).value().ToString());
  return out;
}

TEST(TuneSpaceTest, KeepsTheSettingsBareCodecsMeantBeforeIssue41AndTheNewDefaults) {
  const std::set<std::string> space = CanonicalSpace();
  for (const char* setting : {
           "codec=int4,page=16",                                    // int4 unrotated (bare int4 before)
           "codec=int4,page=16,sym=1",                              // q4_0's counterpart, unrotated
           "codec=int2,page=16",                                    // int2 unclipped (bare int2 before)
           "codec=kivi4,page=128,group=64,residual=0,prerope=1",   // kivi4 without rotation (bare kivi4 before)
           "codec=int4,page=16,rotate=hadamard",                    // today's bare codec=int4
           "codec=int2,page=16,clip=1",                             // today's bare codec=int2
           "codec=kivi4,page=128,group=64,residual=0,rotate=hadamard,prerope=1",  // today's bare codec=kivi4
       }) {
    EXPECT_TRUE(space.count(setting)) << setting << " is not in DefaultTuneSpace";
  }
}

}  // namespace
}  // namespace kvx::eval
