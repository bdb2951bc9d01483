// Swap preemption (engine/preemption.h, scheduler_swap.cc): a pool for
// about 1.5 requests preempts requests (several, some with two samples);
// swapped out to host RAM and back, or recomputed, or chosen by cost, every
// request gives the tokens it gives alone (seeded sampling: the same
// logits at every step, not only the same argmax), and the kind is counted.
#include <gtest/gtest.h>

#include "engine/scheduler_test_util.h"

namespace kvx::engine::scheduler_test {
namespace {

struct PressureRun {
  SchedulerStats stats;
  int checked = 0;  // samples compared with generating alone
  int preempted_with_samples = 0;  // requests of two samples preempted at least once
};

// Six requests (the odd ones with two samples) on a pool too small for
// them all; every sample's tokens against generating alone.
PressureRun RunUnderPressure(SchedulerOptions so) {
  so.max_step_tokens = 32;
  so.max_running = 8;
  auto engine = MakeEngine("codec=f16,page=16,budget=40000", 256, 8);
  auto alone = MakeEngine("codec=f16,page=16", 256, 1);
  auto sched = Scheduler::Create(*engine, so);
  EXPECT_TRUE(sched.ok()) << sched.status().ToString();
  Collector c;
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 6; ++i) {
    GenerationRequest r = FixedLengthRequest(Tokens(40 + 6 * i, 20 + i), 24, static_cast<uint64_t>(i));
    r.n = i % 3 == 2 ? 1 : 2;
    r.stop_at_eog = true;  // as generating alone does
    requests.push_back(r);
  }
  EXPECT_TRUE((*sched)
                  ->RunBetweenSteps([&](Engine&) -> Status {
                    for (size_t i = 0; i < requests.size(); ++i) {
                      KVX_RETURN_IF_ERROR((*sched)->Submit(requests[i], c.Callback(static_cast<int>(i))).status());
                    }
                    return Status::Ok();
                  })
                  .ok());
  PressureRun run;
  for (size_t i = 0; i < requests.size(); ++i) {
    const Outcome o = c.Wait(static_cast<int>(i));
    if (requests[i].n > 1 && o.timing.preemptions > 0) run.preempted_with_samples++;
    for (int k = 0; k < requests[i].n; ++k) {
      EXPECT_EQ(o.finish.at(k).status.ToString(), "OK");
      std::vector<int32_t> want = Alone(*alone, requests[i].prompt, 24, requests[i].sampling.seed + k);
      EXPECT_EQ(o.finish.at(k).tokens, want) << "request " << i << " sample " << k;
      run.checked++;
    }
  }
  ExpectInvariants(**sched);
  run.stats = (*sched)->Stats();
  EXPECT_EQ(run.stats.preemptions, run.stats.preempt_swaps + run.stats.preempt_recomputes);
  EXPECT_EQ(run.stats.swapped_bytes, 0u);  // everything swapped out came back
  return run;
}

// Runs RunUnderPressure and checks that every preemption was of `kind`.
PressureRun ExpectOnly(PreemptKind kind, SchedulerOptions so) {
  PressureRun run = RunUnderPressure(so);
  const bool swap = kind == PreemptKind::kSwap;
  EXPECT_GT(swap ? run.stats.preempt_swaps : run.stats.preempt_recomputes, 0u) << PreemptKindName(kind);
  EXPECT_EQ(swap ? run.stats.preempt_recomputes : run.stats.preempt_swaps, 0u) << PreemptKindName(kind);
  return run;
}

TEST(SchedulerSwapTest, SwappedRequestsGiveTheTokensOfAnUninterruptedRun) {
  SchedulerOptions so;
  so.preempt = PreemptMode::kSwap;
  const PressureRun run = ExpectOnly(PreemptKind::kSwap, so);
  EXPECT_EQ(run.checked, 10);
  EXPECT_GT(run.stats.preempt_swaps, 1u);  // several requests swapped (and resumed)
  EXPECT_GT(run.preempted_with_samples, 0);  // n > 1 too
  EXPECT_GT(run.stats.copy_bytes_per_second, 0);
}

// Recompute mode never swaps; auto compares the measured costs — with host
// copies assumed impossibly slow (1 byte/s) it recomputes, impossibly fast
// it swaps (the prefill speed is the steps' own measurement); a swap space
// too small for any request recomputes even in swap mode. The same tokens
// every time.
TEST(SchedulerSwapTest, EachModeAndCostPicksItsKind) {
  struct Case {
    PreemptMode mode;
    double copy_bytes_per_second;
    uint64_t swap_bytes;
    PreemptKind want;
  };
  for (const Case& c : {Case{PreemptMode::kRecompute, 0, 0, PreemptKind::kRecompute},
                        Case{PreemptMode::kAuto, 1, 0, PreemptKind::kRecompute},
                        Case{PreemptMode::kAuto, 1e18, 0, PreemptKind::kSwap},
                        Case{PreemptMode::kSwap, 0, 1, PreemptKind::kRecompute}}) {
    SchedulerOptions so;
    so.preempt = c.mode;
    so.copy_bytes_per_second = c.copy_bytes_per_second;
    so.swap_bytes = c.swap_bytes;
    ExpectOnly(c.want, so);
  }
}

}  // namespace
}  // namespace kvx::engine::scheduler_test
