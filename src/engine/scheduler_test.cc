// The scheduler on a tiny synthetic model: a request gives the tokens it
// gives alone (engine::Generate) whatever its company, its chunking, cache
// hits, preemption or its sample index; cancel frees at once; sessions
// continue exactly; the KV manager's and the cache's invariants hold after
// every scenario. Threads of its own: labelled `threads` (TSan stage).
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


// Runs `jobs` concurrently (two rounds: the second hits the prefix cache)
// and checks every request's tokens against generating alone.
void ExpectSameAsAlone(const std::string& kv, SchedulerOptions so, int n_seqs, bool expect_preemption) {
  auto engine = MakeEngine(kv, 256, n_seqs);
  auto alone_engine = MakeEngine(kv, 256, 1);
  ASSERT_TRUE(engine && alone_engine);
  auto sched = Scheduler::Create(*engine, so);
  ASSERT_TRUE(sched.ok()) << sched.status().ToString();
  const std::vector<Job> jobs = MixedJobs();
  for (int round = 0; round < 2; ++round) {
    Collector c;
    for (size_t i = 0; i < jobs.size(); ++i) {
      ASSERT_TRUE((*sched)->Submit(JobRequest(jobs[i]), c.Callback(static_cast<int>(i))).ok());
    }
    for (size_t i = 0; i < jobs.size(); ++i) {
      SCOPED_TRACE("round " + std::to_string(round) + " request " + std::to_string(i));
      const Outcome o = c.Wait(static_cast<int>(i));
      const auto want = Alone(*alone_engine, jobs[i].prompt, jobs[i].max_tokens, jobs[i].seed);
      ASSERT_EQ(o.finish.at(0).status.ToString(), "OK");
      EXPECT_EQ(o.finish.at(0).tokens, want);
      EXPECT_EQ(o.streamed.at(0), want);
      EXPECT_EQ(o.timing.generated_tokens, static_cast<int>(want.size()));
      EXPECT_GT(o.timing.ttft_seconds, 0);
    }
    ExpectInvariants(**sched);
  }
  const SchedulerStats st = (*sched)->Stats();
  EXPECT_GT(st.prefix_hit_tokens, 0u);  // the second round, and the shared system prompt
  EXPECT_EQ(st.requests_finished, 2 * jobs.size());
  EXPECT_EQ(st.ttft.count, 2 * jobs.size());
  EXPECT_GT(st.inter_token.count, 0u);
  if (expect_preemption) {
    EXPECT_GT(st.preemptions, 0u);
  }
  EXPECT_GT(st.tokens_generated, 2 * 60u);  // not all stopped at once (the sum of max_tokens is 109)
  EXPECT_EQ(st.running_requests, 0);
  EXPECT_LE(st.pool_bytes_used, st.pool_budget_bytes);
}

// Decode rows and prefill chunks of 8 requests share steps of 16 tokens.
TEST(SchedulerTest, SameTokensAsGeneratingAloneWhateverTheBatch) {
  SchedulerOptions so;
  so.max_step_tokens = 16;
  so.max_running = 8;
  ExpectSameAsAlone("codec=f16,page=16", so, 8, false);
}

TEST(SchedulerTest, SameTokensWithInt8AndLargeSteps) {
  SchedulerOptions so;
  so.max_step_tokens = 512;
  ExpectSameAsAlone("codec=int8,page=16", so, 8, false);
}

// A pool for about 1.5 requests forces preemption (recompute): the tokens
// do not change and the oldest request always progresses.
TEST(SchedulerTest, PreemptionKeepsTokensAndEveryoneFinishes) {
  SchedulerOptions so;
  so.max_step_tokens = 32;
  so.max_running = 8;
  ExpectSameAsAlone("codec=f16,page=16,budget=40000", so, 1, true);
}

TEST(SchedulerTest, SamplesAreForksWithTheirOwnSeeds) {
  auto engine = MakeEngine("codec=f16,page=16");
  auto alone_engine = MakeEngine("codec=f16,page=16", 256, 1);
  auto sched = Scheduler::Create(*engine, {});
  ASSERT_TRUE(sched.ok());
  Collector c;
  GenerationRequest r;
  r.prompt = Tokens(37, 11);
  r.max_tokens = 9;
  r.n = 3;
  r.sampling = Sampling(40);
  ASSERT_TRUE((*sched)->Submit(r, c.Callback(0)).ok());
  const Outcome o = c.Wait(0);
  ASSERT_EQ(o.finish.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(o.finish.at(i).tokens, Alone(*alone_engine, r.prompt, 9, 40 + i)) << "sample " << i;
  }
  EXPECT_NE(o.finish.at(0).tokens, o.finish.at(1).tokens);
  EXPECT_EQ(o.timing.generated_tokens, static_cast<int>(o.finish.at(0).tokens.size() + o.finish.at(1).tokens.size() +
                                                        o.finish.at(2).tokens.size()));
  ExpectInvariants(**sched);
}

TEST(SchedulerTest, CancelFreesTheSequenceAtOnce) {
  auto engine = MakeEngine("codec=f16,page=16");
  SchedulerOptions so;
  so.prefix_cache = false;  // so that nothing stays in the pool
  auto sched = Scheduler::Create(*engine, so);
  ASSERT_TRUE(sched.ok());
  std::mutex mu;
  std::condition_variable cv;
  int tokens = 0;
  bool done = false;
  FinishReason reason = FinishReason::kLength;
  GenerationRequest r;
  r.prompt = Tokens(50, 12);
  r.max_tokens = 200;
  r.stop_at_eog = false;
  Scheduler* s = sched->get();
  RequestId id = 0;
  auto cb = [&](const RequestEvent& e) {
    std::lock_guard<std::mutex> lock(mu);
    if (e.kind == RequestEvent::Kind::kToken && ++tokens == 3) s->Cancel(e.request);  // from the callback
    if (e.kind == RequestEvent::Kind::kFinish) {
      reason = e.reason;
      done = e.done;
      cv.notify_all();
    }
  };
  auto submitted = s->Submit(r, cb);
  ASSERT_TRUE(submitted.ok());
  id = *submitted;
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
  }
  EXPECT_EQ(reason, FinishReason::kCancelled);
  EXPECT_LT(tokens, 10);
  EXPECT_FALSE(s->Cancel(id));  // already over
  ExpectInvariants(*s);  // a task runs after the stats of the step before it are published
  const SchedulerStats st = s->Stats();
  EXPECT_EQ(st.requests_cancelled, 1u);
  EXPECT_EQ(st.pool_bytes_used, 0u);
}

TEST(SchedulerTest, SessionContinuesExactly) {
  auto engine = MakeEngine("codec=f16,page=16");
  auto alone_engine = MakeEngine("codec=f16,page=16", 256, 1);
  auto sched = Scheduler::Create(*engine, {});
  ASSERT_TRUE(sched.ok());
  Collector c;
  GenerationRequest a = FixedLengthRequest(Tokens(21, 13), 6, 3);
  a.save_session = "chat";
  a.tenant_salt = 9;
  ASSERT_TRUE((*sched)->Submit(a, c.Callback(0)).ok());
  const Outcome oa = c.Wait(0);
  Scheduler* s = sched->get();
  EXPECT_TRUE(s->RunBetweenSteps([s](Engine&) {
                 return s->SessionNames(9) == std::vector<std::string>{"chat"} ? Status::Ok() : Internal("no session");
               }).ok());
  GenerationRequest b = FixedLengthRequest(Tokens(5, 14), 7, 4);
  b.resume_session = "chat";
  b.tenant_salt = 9;
  ASSERT_TRUE((*sched)->Submit(b, c.Callback(1)).ok());
  const Outcome ob = c.Wait(1);
  ASSERT_TRUE(ob.finish.at(0).status.ok()) << ob.finish.at(0).status.ToString();
  const auto history = Concat(Concat(a.prompt, oa.finish.at(0).tokens), b.prompt);
  EXPECT_EQ(ob.finish.at(0).tokens, Alone(*alone_engine, history, 7, 4));
  EXPECT_EQ(ob.timing.cached_tokens, 21 + 6 - 1);  // all but the pending last token
  // Another tenant cannot resume it: for it the session does not exist (the
  // same refusal as an unknown name), refused by Submit, naming the session.
  b.tenant_salt = 10;
  RequestPart part = RequestPart::kNone;
  EXPECT_EQ((*sched)->Submit(b, c.Callback(2), &part).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(part, RequestPart::kSession);
  b.tenant_salt = 9;
  b.resume_session = "nope";
  part = RequestPart::kNone;
  EXPECT_EQ((*sched)->Submit(b, c.Callback(3), &part).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(part, RequestPart::kSession);
  // The session API, on the scheduler thread.
  EXPECT_TRUE(s->RunBetweenSteps([s](Engine& e) -> Status {
                 KVX_ASSIGN_OR_RETURN(kv::SeqId seq, s->SessionSequence(9, "chat"));
                 KVX_ASSIGN_OR_RETURN(auto pending, s->SessionPendingTokens(9, "chat"));
                 if (pending.size() != 1) return Internal("expected one pending token");
                 if (e.kv_manager().length(seq) != 21 + 6 - 1) return Internal("session length");
                 return s->DropSession(9, "chat");
               }).ok());
  EXPECT_TRUE(s->RunBetweenSteps([s](Engine&) {
                 return s->SessionNames(9).empty() ? Status::Ok() : Internal("session not dropped");
               }).ok());
  ExpectInvariants(*s);
}

// continue_session: resumes the session when it exists (a BOS the prompt
// starts with dropped when asked), starts it otherwise; with an empty
// prompt a missing one is NotFound at Submit.
TEST(SchedulerTest, ContinueSessionResumesOrStarts) {
  auto engine = MakeEngine("codec=f16,page=16");
  auto sched = Scheduler::Create(*engine, {});
  ASSERT_TRUE(sched.ok());
  Scheduler* s = sched->get();
  Collector c;
  GenerationRequest a = FixedLengthRequest(Tokens(21, 13), 6, 3);
  a.continue_session = "chat";  // does not exist yet: started
  ASSERT_TRUE(s->Submit(a, c.Callback(0)).ok());
  const Outcome oa = c.Wait(0);
  EXPECT_EQ(oa.timing.prompt_tokens, 21);
  const int32_t bos = engine->model().tokenizer().bos();
  ASSERT_GE(bos, 0);
  GenerationRequest b = FixedLengthRequest(Concat({bos}, Tokens(5, 14)), 4, 4);
  b.continue_session = "chat";  // exists: resumed, the BOS dropped
  b.drop_bos_when_resuming = true;
  ASSERT_TRUE(s->Submit(b, c.Callback(1)).ok());
  const Outcome ob = c.Wait(1);
  ASSERT_TRUE(ob.finish.at(0).status.ok()) << ob.finish.at(0).status.ToString();
  EXPECT_EQ(ob.timing.prompt_tokens, 21 + 6 + 5);
  EXPECT_EQ(ob.timing.cached_tokens, 21 + 6 - 1);
  GenerationRequest empty = FixedLengthRequest({}, 4, 5);
  empty.continue_session = "chat";  // exists: continues from its pending token
  ASSERT_TRUE(s->Submit(empty, c.Callback(2)).ok());
  EXPECT_TRUE(c.Wait(2).finish.at(0).status.ok());
  empty.continue_session = "missing";
  RequestPart part = RequestPart::kNone;
  EXPECT_EQ(s->Submit(empty, c.Callback(3), &part).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(part, RequestPart::kSession);
  ExpectInvariants(*s);
}

// Sessions belong to their tenant: the same name in two tenants is two
// sessions, a tenant sees, resumes and drops only its own (another's is
// NotFound, as a missing one), and the quota is per tenant: one tenant
// saving more than max_sessions drops its own least recently used, never
// another tenant's.
TEST(SchedulerTest, SessionsBelongToTheirTenant) {
  SchedulerOptions quota;
  quota.max_sessions = 3;  // per tenant
  auto engine = MakeEngine("codec=f16,page=16");
  auto sched = Scheduler::Create(*engine, quota);
  ASSERT_TRUE(sched.ok());
  Scheduler* s = sched->get();
  Collector c;
  int key = 0;
  auto save = [&](uint64_t tenant, const std::string& name) {
    GenerationRequest r = FixedLengthRequest(Tokens(5, key + 1), 2, 1);
    r.tenant_salt = tenant;
    r.save_session = name;
    ASSERT_TRUE(s->Submit(r, c.Callback(key)).ok());
    ASSERT_TRUE(c.Wait(key++).finish.at(0).status.ok());
  };
  auto names = [&](uint64_t tenant) {
    std::vector<std::string> out;
    EXPECT_TRUE(s->RunBetweenSteps([&](Engine&) {
                   out = s->SessionNames(tenant);
                   return Status::Ok();
                 }).ok());
    return out;
  };
  save(1, "a");
  save(2, "a");
  save(2, "b");
  EXPECT_EQ(names(1), std::vector<std::string>{"a"});
  EXPECT_EQ(names(2), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(names(3).empty());
  // Tenant 3 can neither resume, read nor drop tenant 2's "b".
  GenerationRequest r = FixedLengthRequest(Tokens(3, 50), 2, 1);
  r.tenant_salt = 3;
  r.resume_session = "b";
  RequestPart part = RequestPart::kNone;
  const Status foreign = s->Submit(r, c.Callback(100), &part).status();
  EXPECT_EQ(foreign.code(), StatusCode::kNotFound);
  r.resume_session = "missing";
  EXPECT_EQ(s->Submit(r, c.Callback(101)).status().message(),
            Status(NotFound("no session named 'missing'")).message());
  EXPECT_EQ(foreign.message(), "no session named 'b'");
  EXPECT_TRUE(s->RunBetweenSteps([&](Engine&) -> Status {
                 if (s->SessionSequence(3, "b").ok() || s->SessionPendingTokens(3, "b").ok()) {
                   return Internal("tenant 3 reads tenant 2's session");
                 }
                 return s->DropSession(3, "b").code() == StatusCode::kNotFound ? Status::Ok()
                                                                              : Internal("tenant 3 dropped it");
               }).ok());
  EXPECT_EQ(names(2), (std::vector<std::string>{"a", "b"}));
  // Tenant 1 saves 6 more: it keeps its 3 newest, tenant 2 keeps both.
  for (int i = 0; i < 6; ++i) save(1, "x" + std::to_string(i));
  EXPECT_EQ(names(1), (std::vector<std::string>{"x3", "x4", "x5"}));
  EXPECT_EQ(names(2), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(s->Stats().sessions, 5);
  ExpectInvariants(*s);
}

// Admission order: priority first, then arrival; with one sequence at a
// time the order requests end in is the order they were admitted in.
TEST(SchedulerTest, AdmitsByPriorityThenArrival) {
  auto engine = MakeEngine("codec=f16,page=16");
  SchedulerOptions so;
  so.max_running = 1;
  auto sched = Scheduler::Create(*engine, so);
  ASSERT_TRUE(sched.ok());
  std::mutex mu;
  std::condition_variable cv;
  bool started = false;
  std::vector<int> ended;
  auto submit = [&](int key, int priority, int max_tokens) {
    GenerationRequest r;
    r.prompt = Tokens(10, key);
    r.max_tokens = max_tokens;
    r.stop_at_eog = false;
    r.priority = priority;
    ASSERT_TRUE((*sched)
                    ->Submit(r,
                             [&, key](const RequestEvent& e) {
                               std::lock_guard<std::mutex> lock(mu);
                               started = true;
                               cv.notify_all();
                               if (e.done) ended.push_back(key);
                             })
                    .ok());
  };
  submit(0, 0, 120);  // runs while the others queue
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return started; });
  }
  submit(1, 0, 2);
  submit(2, 0, 2);
  submit(3, 5, 2);
  submit(4, 1, 2);
  (*sched)->Shutdown(ShutdownMode::kDrain);
  EXPECT_EQ(ended, (std::vector<int>{0, 3, 4, 1, 2}));
}

// The step counters say what the steps held: a 10-token prompt in steps of
// 4 tokens is 3 prefill steps (the last one gives the first token), then
// one decode-only step per further token.
TEST(SchedulerTest, StepCountersSayWhatStepsHeld) {
  auto engine = MakeEngine("codec=f16,page=16");
  SchedulerOptions so;
  so.max_step_tokens = 4;
  so.max_running = 4;
  auto sched = Scheduler::Create(*engine, so);
  ASSERT_TRUE(sched.ok());
  Collector c;
  ASSERT_TRUE((*sched)->Submit(FixedLengthRequest(Tokens(10, 3), 4, 5), c.Callback(0)).ok());
  EXPECT_EQ(c.Wait(0).timing.generated_tokens, 4);
  ExpectInvariants(**sched);  // the snapshot now covers the request
  const SchedulerStats st = (*sched)->Stats();
  EXPECT_EQ(st.steps, 6u);
  EXPECT_EQ(st.prompt_tokens_computed, 10u);
  EXPECT_EQ(st.decode_rows, 3u);
  EXPECT_EQ(st.decode_only_steps, 3u);
  EXPECT_GT(st.decode_only_seconds, 0);
  EXPECT_LE(st.decode_only_seconds, st.busy_seconds);
  EXPECT_GT(st.sample_seconds, 0);
  EXPECT_LE(st.sample_seconds, st.host_seconds);
}

TEST(SchedulerTest, RejectsBadRequests) {
  auto engine = MakeEngine("codec=f16,page=16");
  auto sched = Scheduler::Create(*engine, {});
  ASSERT_TRUE(sched.ok());
  auto cb = [](const RequestEvent&) {};
  // Each rejection is InvalidArgument and names the part at fault.
  auto rejected = [&](const GenerationRequest& r) {
    RequestPart part = RequestPart::kNone;
    const Status st = (*sched)->Submit(r, cb, &part).status();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    return part;
  };
  GenerationRequest r;
  EXPECT_EQ(rejected(r), RequestPart::kPrompt);  // empty prompt
  r.prompt = {1, 2, 100000};
  EXPECT_EQ(rejected(r), RequestPart::kPrompt);
  r.prompt = {1, 2};
  r.max_tokens = 0;
  EXPECT_EQ(rejected(r), RequestPart::kMaxTokens);
  r.max_tokens = 4;
  r.n = 0;
  EXPECT_EQ(rejected(r), RequestPart::kSamples);
  r.n = 1;
  r.sampling.top_k = -1;
  EXPECT_EQ(rejected(r), RequestPart::kSampling);
  r.sampling = {};
  r.prompt = Tokens(300, 1);  // longer than the context
  EXPECT_EQ(rejected(r), RequestPart::kContext);
  r.prompt = Tokens(256, 1);  // fills the context: no room for the answer
  EXPECT_EQ(rejected(r), RequestPart::kContext);
  r.prompt = Tokens(255, 1);
  EXPECT_TRUE((*sched)->Submit(r, cb).ok());
  SchedulerOptions bad;
  bad.max_running = 0;
  EXPECT_FALSE(Scheduler::Create(*engine, bad).ok());
}

// A prompt whose KV is more than the whole pool could never be admitted:
// Submit refuses it at once with the numbers (it used to wait for its turn
// in the queue, then fail).
TEST(SchedulerTest, RefusesWhatThePoolCanNeverHold) {
  auto engine = MakeEngine("codec=f16,page=16,budget=16K");  // 64 tokens of the tiny model's KV
  auto sched = Scheduler::Create(*engine, {});
  ASSERT_TRUE(sched.ok());
  auto cb = [](const RequestEvent&) {};
  GenerationRequest r;
  r.prompt = Tokens(100, 1);
  RequestPart part = RequestPart::kNone;
  const Status st = (*sched)->Submit(r, cb, &part).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(part, RequestPart::kKvBudget);
  EXPECT_NE(st.message().find("budget 16384 bytes"), std::string::npos) << st.message();
  r.prompt = Tokens(20, 1);
  EXPECT_TRUE((*sched)->Submit(r, cb).ok());
}

// Several threads submit, poll stats and cancel while the loop runs; then a
// draining shutdown finishes what is left.
TEST(SchedulerTest, ConcurrentClientsAndShutdown) {
  auto engine = MakeEngine("codec=f16,page=16", 256, 4);
  SchedulerOptions so;
  so.max_step_tokens = 24;
  so.max_running = 6;
  auto sched = Scheduler::Create(*engine, so);
  ASSERT_TRUE(sched.ok());
  Scheduler* s = sched->get();
  std::atomic<int> finished{0}, cancelled{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 4; ++t) {
    clients.emplace_back([&, t] {
      for (int i = 0; i < 5; ++i) {
        GenerationRequest r;
        r.prompt = Concat(Tokens(20, 0), Tokens(5 + i * 3, t * 10 + i));
        r.max_tokens = 6 + i;
        r.sampling = Sampling(static_cast<uint64_t>(t * 100 + i));
        auto id = s->Submit(r, [&](const RequestEvent& e) {
          if (e.done) {
            ++finished;
            cancelled += e.reason == FinishReason::kCancelled;
          }
        });
        ASSERT_TRUE(id.ok());
        if (i == 2) s->Cancel(*id);
        (void)s->Stats();
      }
    });
  }
  for (auto& c : clients) c.join();
  ExpectInvariants(*s);
  s->Shutdown(ShutdownMode::kDrain);
  EXPECT_EQ(finished.load(), 20);
  EXPECT_GE(cancelled.load(), 0);
  const SchedulerStats st = s->Stats();
  EXPECT_EQ(st.requests_finished, 20u);
  EXPECT_EQ(st.queued, 0);
  GenerationRequest late;
  late.prompt = {1};
  EXPECT_FALSE(s->Submit(late, [](const RequestEvent&) {}).ok());
  EXPECT_FALSE(s->RunBetweenSteps([](Engine&) { return Status::Ok(); }).ok());
}

TEST(SchedulerTest, CancelShutdownEndsEverything) {
  auto engine = MakeEngine("codec=f16,page=16");
  auto sched = Scheduler::Create(*engine, {});
  ASSERT_TRUE(sched.ok());
  std::atomic<int> cancelled{0};
  for (int i = 0; i < 4; ++i) {
    GenerationRequest r;
    r.prompt = Tokens(30, i);
    r.max_tokens = 200;
    r.stop_at_eog = false;
    ASSERT_TRUE((*sched)->Submit(r, [&](const RequestEvent& e) {
                          if (e.done && e.reason == FinishReason::kCancelled) ++cancelled;
                        }).ok());
  }
  (*sched)->Shutdown(ShutdownMode::kCancel);
  EXPECT_EQ((*sched)->Stats().requests_finished, 4u);
  EXPECT_GE(cancelled.load(), 1);
}

}  // namespace
}  // namespace kvx::engine
