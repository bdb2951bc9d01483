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

// Named sessions under pool pressure: three idle sessions fill a pool of
// ~64 KB; a new request that needs more than the rest is admitted once the
// least recently used sessions are swapped to host RAM (it gives what it
// gives alone), and a swapped session's next turn is served from its host
// copy: the same tokens as one request over the whole history.
TEST(SchedulerSwapTest, IdleSessionsGiveWayUnderPressureAndComeBackExactly) {
  auto engine = MakeEngine("codec=f16,page=16,budget=64K", 256, 4);
  auto alone = MakeEngine("codec=f16,page=16", 256, 1);
  auto sched = Scheduler::Create(*engine, {});
  ASSERT_TRUE(sched.ok());
  Collector c;
  std::vector<GenerationRequest> turns;
  std::vector<Outcome> first;
  for (int i = 0; i < 3; ++i) {
    GenerationRequest r = FixedLengthRequest(Tokens(58, 30 + i), 6, static_cast<uint64_t>(i));
    r.save_session = "s" + std::to_string(i);
    ASSERT_TRUE((*sched)->Submit(r, c.Callback(i)).ok());
    first.push_back(c.Wait(i));
    ASSERT_EQ(first.back().finish.at(0).status.ToString(), "OK");
    turns.push_back(r);
  }
  const GenerationRequest big = FixedLengthRequest(Tokens(120, 40), 6, 9);
  ASSERT_TRUE((*sched)->Submit(big, c.Callback(3)).ok());
  const Outcome o = c.Wait(3);
  ASSERT_EQ(o.finish.at(0).status.ToString(), "OK");
  EXPECT_EQ(o.finish.at(0).tokens, Alone(*alone, big.prompt, 6, 9));
  SchedulerStats st = (*sched)->Stats();
  EXPECT_EQ(st.sessions, 3);
  EXPECT_GT(st.sessions_swapped_out, 0u);
  // Every session's next turn, swapped or not: the history's continuation.
  for (int i = 0; i < 3; ++i) {
    GenerationRequest next = FixedLengthRequest(Tokens(5, 50 + i), 6, 20 + static_cast<uint64_t>(i));
    next.resume_session = "s" + std::to_string(i);
    ASSERT_TRUE((*sched)->Submit(next, c.Callback(4 + i)).ok());
    const Outcome on = c.Wait(4 + i);
    ASSERT_EQ(on.finish.at(0).status.ToString(), "OK") << "session " << i;
    const auto history = Concat(Concat(turns[i].prompt, first[i].finish.at(0).tokens), next.prompt);
    EXPECT_EQ(on.finish.at(0).tokens, Alone(*alone, history, 6, 20 + static_cast<uint64_t>(i))) << "session " << i;
  }
  // Asked for its sequence (to save it to a file), a swapped session comes back into the pool.
  Scheduler* sp = sched->get();
  ASSERT_TRUE(sp->RunBetweenSteps([sp](Engine& e) -> Status {
                  for (int i = 0; i < 3; ++i) {
                    KVX_ASSIGN_OR_RETURN(kv::SeqId seq, sp->SessionSequence(0, "s" + std::to_string(i)));
                    if (e.kv_manager().length(seq) != 58 + 6 - 1) return Internal("session length");
                  }
                  return Status::Ok();
                }).ok());
  ExpectInvariants(**sched);
}

}  // namespace
}  // namespace kvx::engine::scheduler_test
