#include "util/step_profile.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace kvx::util {
namespace {

using std::chrono::milliseconds;

// Turns the profile on for one test and off again (it is process-wide).
struct ProfileOn {
  ProfileOn() {
    ResetStepProfile();
    EnableStepProfile(true);
  }
  ~ProfileOn() {
    EnableStepProfile(false);
    ResetStepProfile();
  }
};

int64_t Ns(const StepProfileTotals& t, StepPhase p) { return t.ns[static_cast<int>(p)]; }

TEST(StepProfileTest, OffRecordsNothing) {
  ResetStepProfile();
  {
    ScopedPhase phase(StepPhase::kMatmul);
    std::this_thread::sleep_for(milliseconds(2));
  }
  const StepProfileTotals t = TakeStepProfile();
  for (int64_t ns : t.ns) EXPECT_EQ(ns, 0);
}

// A phase opened inside another pauses it: each interval counts once, and
// the phases add up to the wall time of the outermost one.
TEST(StepProfileTest, NestedPhasesAreExclusive) {
  ProfileOn on;
  const int64_t t0 = SteadyNowNs();
  {
    ScopedPhase step(StepPhase::kScheduler);
    std::this_thread::sleep_for(milliseconds(3));
    {
      ScopedPhase matmul(StepPhase::kMatmul);
      std::this_thread::sleep_for(milliseconds(6));
      ScopedPhase again(StepPhase::kMatmul);  // the same phase nested: still counted once
      std::this_thread::sleep_for(milliseconds(1));
    }
    std::this_thread::sleep_for(milliseconds(3));
  }
  const int64_t wall = SteadyNowNs() - t0;
  const StepProfileTotals t = TakeStepProfile();
  EXPECT_GE(Ns(t, StepPhase::kMatmul), 7'000'000);
  EXPECT_GE(Ns(t, StepPhase::kScheduler), 6'000'000);
  int64_t sum = 0;
  for (int64_t ns : t.ns) sum += ns;
  EXPECT_LE(sum, wall);
  EXPECT_GE(sum, wall - 1'000'000);  // nothing lost between the phases
}

TEST(StepProfileTest, ThreadTimeAddsUpFromEveryThread) {
  ProfileOn on;
  std::thread a([] { AddThreadTime(1000); });
  std::thread b([] { AddThreadTime(2000); });
  a.join();
  b.join();
  EXPECT_EQ(TakeStepProfile().observer_thread_ns, 3000);
}

}  // namespace
}  // namespace kvx::util
