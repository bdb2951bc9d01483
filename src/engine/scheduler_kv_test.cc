// What the scheduler does to the KV beside batching: the compression
// moment (policies that compress once, after the prompt) and in-flight
// prefix sharing (a request waits for a running one's shared prompt blocks
// rather than computing them too). Threads of its own: labelled `threads`
// (TSan stage).
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "engine/scheduler_test_util.h"

namespace kvx::engine {
namespace {

using namespace scheduler_test;  // NOLINT: the shared test helpers

// Policies that compress once (mode=once, SnapKV here) are compressed when
// the prompt is in, before the first token is sampled: each sample gives
// what `kvx run` gives (Generate with compress_at = the prompt's length);
// samples 1..n-1 fork the compressed sequence; the kept session is the
// compressed one, and its next turn is compressed again after its prompt.
TEST(SchedulerTest, CompressesOnceThePromptIsIn) {
  const std::string kv = "codec=f16,page=16;policy=snapkv,ratio=0.5,window=8,sinks=2";
  auto engine = MakeEngine(kv);
  auto alone_engine = MakeEngine(kv, 256, 1);
  ASSERT_TRUE(engine && alone_engine);
  auto sched = Scheduler::Create(*engine, {});
  ASSERT_TRUE(sched.ok());
  Scheduler* s = sched->get();
  Collector c;
  GenerationRequest a = FixedLengthRequest(Tokens(90, 21), 10, 50);
  a.n = 2;
  a.save_session = "chat";
  ASSERT_TRUE(s->Submit(a, c.Callback(0)).ok());
  const Outcome oa = c.Wait(0);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(oa.finish.at(i).status.ok()) << oa.finish.at(i).status.ToString();
    EXPECT_EQ(oa.finish.at(i).tokens, Alone(*alone_engine, a.prompt, 10, 50 + i, true)) << "sample " << i;
  }
  // The kept session: 99 tokens, about half of them in the KV.
  EXPECT_TRUE(s->RunBetweenSteps([s](Engine& e) -> Status {
                 KVX_ASSIGN_OR_RETURN(kv::SeqId seq, s->SessionSequence(0, "chat"));
                 const kv::KVManager& m = e.kv_manager();
                 if (!m.entries_removed(seq)) return Internal("the session was not compressed");
                 const int live = m.kv(seq).LiveEntries(0, 0);
                 if (live >= 70) return Internal("the session keeps " + std::to_string(live) + " of 99 entries");
                 return Status::Ok();
               }).ok());
  // The next turn: pending token + prompt, compressed again after it.
  GenerationRequest b = FixedLengthRequest(Tokens(40, 22), 6, 60);
  b.resume_session = "chat";
  ASSERT_TRUE(s->Submit(b, c.Callback(1)).ok());
  const Outcome ob = c.Wait(1);
  ASSERT_TRUE(ob.finish.at(0).status.ok()) << ob.finish.at(0).status.ToString();
  {
    auto session = alone_engine->NewSession();
    ASSERT_TRUE(session.ok());
    GenerateOptions go;
    go.n_predict = 10;
    go.sampler = Sampling(50);
    go.compress_at = static_cast<int>(a.prompt.size());
    std::vector<int32_t> first;
    GenerateStats st;
    ASSERT_TRUE(Generate(session->get(), a.prompt, go, nullptr, &first, &st).ok());
    ASSERT_EQ(first, oa.finish.at(0).tokens);
    const std::vector<int32_t> turn = Concat({first.back()}, b.prompt);
    go.n_predict = 6;
    go.sampler = Sampling(60);
    go.compress_at = static_cast<int>(turn.size());
    std::vector<int32_t> second;
    ASSERT_TRUE(Generate(session->get(), turn, go, nullptr, &second, &st).ok());
    EXPECT_EQ(ob.finish.at(0).tokens, second);
  }
  ExpectInvariants(*s);
  // Nothing compressed went into the prefix cache.
  EXPECT_EQ(s->Stats().cache_blocks, 0);
}

// Under preemption (recompute: prefill stops at the prompt's end, compresses
// there, then feeds the generated tokens) a compressed request gives the
// same tokens, and the pool stays within its budget.
TEST(SchedulerTest, CompressionUnderPreemption) {
  SchedulerOptions so;
  so.max_step_tokens = 32;
  so.max_running = 8;
  auto engine = MakeEngine("codec=f16,page=16,budget=40000;policy=snapkv,ratio=0.5,window=8,sinks=2", 256, 1);
  ASSERT_TRUE(engine);
  auto sched = Scheduler::Create(*engine, so);
  ASSERT_TRUE(sched.ok());
  Collector c;
  const std::vector<Job> jobs = MixedJobs();
  // All submitted between two steps, so they arrive together whatever the
  // machine's load (the pool then cannot hold them all: preemption).
  ASSERT_TRUE(SubmitTogether(**sched, jobs, c).ok());
  auto alone_engine = MakeEngine("codec=f16,page=16;policy=snapkv,ratio=0.5,window=8,sinks=2", 256, 1);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Outcome o = c.Wait(static_cast<int>(i));
    EXPECT_TRUE(o.finish.at(0).status.ok()) << i << ": " << o.finish.at(0).status.ToString();
    // Recomputed up to the prompt's end, compressed there: the same tokens.
    EXPECT_EQ(o.finish.at(0).tokens, Alone(*alone_engine, jobs[i].prompt, jobs[i].max_tokens, jobs[i].seed, true))
        << "request " << i;
  }
  ExpectInvariants(**sched);
  const SchedulerStats st = (*sched)->Stats();
  EXPECT_GT(st.preemptions, 0u);
  EXPECT_LE(st.pool_bytes_used, st.pool_budget_bytes);
}

// In-flight prefix sharing: N identical prompts arriving together compute
// the prompt once: the first (the leader) prefills it, the others wait for
// its blocks and start from them as soon as they are committed, before the
// leader finishes; every request gives what it gives alone.
TEST(SchedulerTest, IdenticalPromptsInOneRoundComputeThePrefixOnce) {
  auto engine = MakeEngine("codec=f16,page=16");
  auto alone_engine = MakeEngine("codec=f16,page=16", 256, 1);
  ASSERT_TRUE(engine && alone_engine);
  SchedulerOptions so;
  so.max_step_tokens = 16;  // the 100-token prompt takes 7 steps
  so.max_running = 8;
  auto sched = Scheduler::Create(*engine, so);
  ASSERT_TRUE(sched.ok());
  Scheduler* s = sched->get();
  const auto prompt = Tokens(100, 31);
  const int n = 4, leader_tokens = 30, follower_tokens = 8;
  std::mutex mu;
  std::vector<std::pair<int, bool>> order;  // (request, is a finish) as events arrive
  Collector c;
  auto logged = [&](int key) {
    return [&, key, inner = c.Callback(key)](const RequestEvent& e) {
      {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back({key, e.kind == RequestEvent::Kind::kFinish});
      }
      inner(e);
    };
  };
  // Submitted between two steps: they arrive in one admission round.
  ASSERT_TRUE(s->RunBetweenSteps([&](Engine&) -> Status {
                 for (int i = 0; i < n; ++i) {
                   const int max_tokens = i == 0 ? leader_tokens : follower_tokens;
                   KVX_RETURN_IF_ERROR(s->Submit(FixedLengthRequest(prompt, max_tokens, 70 + i), logged(i)).status());
                 }
                 return Status::Ok();
               }).ok());
  for (int i = 0; i < n; ++i) {
    const Outcome o = c.Wait(i);
    ASSERT_TRUE(o.finish.at(0).status.ok()) << o.finish.at(0).status.ToString();
    EXPECT_EQ(o.finish.at(0).tokens, Alone(*alone_engine, prompt, i == 0 ? leader_tokens : follower_tokens, 70 + i))
        << "request " << i;
    EXPECT_EQ(o.timing.cached_tokens, i == 0 ? 0 : 96) << "request " << i;
  }
  ExpectInvariants(*s);
  const SchedulerStats st = s->Stats();
  // The leader computes 100 tokens; each follower only what follows the
  // 6 cached blocks (the lookup leaves at least the last token: 4 tokens).
  EXPECT_EQ(st.prompt_tokens_computed, 100u + (n - 1) * 4u);
  EXPECT_EQ(st.prefix_waits, static_cast<uint64_t>(n - 1));
  // The followers did not wait for the leader's end: its blocks were
  // reachable once committed.
  std::lock_guard<std::mutex> lock(mu);
  auto at = [&](int key, bool finish) {
    return std::find(order.begin(), order.end(), std::pair<int, bool>{key, finish}) - order.begin();
  };
  for (int i = 1; i < n; ++i) EXPECT_LT(at(i, false), at(0, true)) << "request " << i;
}

// A leader cancelled in the middle of its prefill: the requests waiting for
// it are admitted on their own (the first from the blocks the leader
// committed, the next one waiting for the first) and give what they give
// alone. A short request started before them cancels the leader from its
// token callback, so the cancel lands after a fixed number of steps.
TEST(SchedulerTest, LeaderCancelledMidPrefillLeavesFollowersCorrect) {
  auto engine = MakeEngine("codec=f16,page=16");
  auto alone_engine = MakeEngine("codec=f16,page=16", 256, 1);
  ASSERT_TRUE(engine && alone_engine);
  SchedulerOptions so;
  so.max_step_tokens = 16;  // the 120-token prompt takes 8 steps alone
  so.max_running = 8;
  auto sched = Scheduler::Create(*engine, so);
  ASSERT_TRUE(sched.ok());
  Scheduler* s = sched->get();
  const auto prompt = Tokens(120, 41);
  Collector c;
  std::atomic<RequestId> leader{0};
  ASSERT_TRUE(s->RunBetweenSteps([&](Engine&) -> Status {
                 GenerationRequest pacer;
                 pacer.prompt = Tokens(4, 40);
                 pacer.max_tokens = 12;
                 pacer.sampling = Sampling(80);
                 auto inner = c.Callback(9);
                 KVX_RETURN_IF_ERROR(s->Submit(pacer, [&, inner](const RequestEvent& e) {
                                        if (e.kind == RequestEvent::Kind::kToken && e.index == 3) s->Cancel(leader.load());
                                        inner(e);
                                      }).status());
                 for (int i = 0; i < 3; ++i) {
                   KVX_ASSIGN_OR_RETURN(RequestId id,
                                        s->Submit(FixedLengthRequest(prompt, 6, 90 + i), c.Callback(i)));
                   if (i == 0) leader.store(id);
                 }
                 return Status::Ok();
               }).ok());
  const Outcome ol = c.Wait(0);
  EXPECT_EQ(ol.finish.at(0).reason, FinishReason::kCancelled);
  EXPECT_TRUE(ol.finish.at(0).tokens.empty());  // cancelled in its prefill
  for (int i = 1; i < 3; ++i) {
    const Outcome o = c.Wait(i);
    ASSERT_TRUE(o.finish.at(0).status.ok()) << o.finish.at(0).status.ToString();
    EXPECT_EQ(o.finish.at(0).tokens, Alone(*alone_engine, prompt, 6, 90 + i)) << "request " << i;
  }
  EXPECT_GT(c.Wait(1).timing.cached_tokens, 0);     // the leader's committed blocks
  EXPECT_EQ(c.Wait(2).timing.cached_tokens, 112);   // the first follower's
  EXPECT_EQ(c.Wait(9).finish.at(0).tokens, Alone(*alone_engine, Tokens(4, 40), 12, 80));
  ExpectInvariants(*s);
  EXPECT_EQ(s->Stats().prefix_waits, 2u);
}

}  // namespace
}  // namespace kvx::engine
