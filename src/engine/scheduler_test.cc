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
#include <map>
#include <mutex>
#include <thread>

#include "engine/generate.h"
#include "engine/session.h"
#include "model/synthetic_model.h"

namespace kvx::engine {
namespace {

const std::string& ModelPath() {
  static const std::string path = [] {
    model::SyntheticModelOptions o;
    o.shape = "tiny";
    o.init_std = 0.1f;
    const std::string p = ::testing::TempDir() + "/scheduler_tiny.gguf";
    EXPECT_TRUE(model::WriteSyntheticModel(o, p).ok());
    return p;
  }();
  return path;
}

std::unique_ptr<Engine> MakeEngine(const std::string& kv, int n_ctx = 256, int n_seqs = 8) {
  EngineOptions eo;
  eo.model_path = ModelPath();
  eo.kv_spec = kv;
  eo.n_ctx = n_ctx;
  eo.n_seqs = n_seqs;
  eo.n_threads = 2;
  auto e = Engine::Load(eo);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

std::vector<int32_t> Tokens(int n, int seed) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((i * 37 + seed * 101 + 5) % 500);
  return t;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// What one request produced, filled by its callback.
struct Outcome {
  std::map<int, std::vector<int32_t>> streamed;  // per sample, from token events
  std::map<int, RequestEvent> finish;            // per sample
  RequestTiming timing;
  bool done = false;
};

class Collector {
 public:
  EventCallback Callback(int key) {
    return [this, key](const RequestEvent& e) {
      std::lock_guard<std::mutex> lock(mu_);
      Outcome& o = out_[key];
      EXPECT_FALSE(o.done) << "event after done";
      if (e.kind == RequestEvent::Kind::kToken) {
        EXPECT_EQ(e.index, static_cast<int>(o.streamed[e.sample].size()));
        o.streamed[e.sample].push_back(e.token);
      } else {
        o.finish[e.sample] = e;
        if (e.done) {
          o.done = true;
          o.timing = e.timing;
          cv_.notify_all();
        }
      }
    };
  }
  Outcome Wait(int key) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return out_[key].done; });
    return out_[key];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, Outcome> out_;
};

model::SamplerOptions Sampling(uint64_t seed) {
  model::SamplerOptions o;
  o.temperature = 0.9f;
  o.top_k = 0;
  o.top_p = 1.0f;
  o.min_p = 0.0f;
  o.seed = seed;
  return o;
}

// The tokens `prompt` gives alone, through engine::Generate on its own engine
// (`compress`: the KV policies compress once the prompt is in, as `kvx run`).
std::vector<int32_t> Alone(Engine& e, const std::vector<int32_t>& prompt, int max_tokens, uint64_t seed,
                           bool compress = false) {
  auto s = e.NewSession();
  EXPECT_TRUE(s.ok());
  GenerateOptions go;
  go.n_predict = max_tokens;
  go.sampler = Sampling(seed);
  if (compress) go.compress_at = static_cast<int>(prompt.size());
  std::vector<int32_t> out;
  GenerateStats st;
  EXPECT_TRUE(Generate(s->get(), prompt, go, nullptr, &out, &st).ok());
  return out;
}

void ExpectInvariants(Scheduler& s) {
  const Status st = s.RunBetweenSteps([&s](Engine&) { return s.CheckInvariants(); });
  EXPECT_TRUE(st.ok()) << st.ToString();
}

struct Job {
  std::vector<int32_t> prompt;
  int max_tokens;
  uint64_t seed;
};

std::vector<Job> MixedJobs() {
  const auto system = Tokens(40, 1);  // shared by several
  return {{Concat(system, Tokens(9, 2)), 12, 1},  {Tokens(3, 3), 20, 2},
          {Concat(system, Tokens(30, 4)), 8, 3},  {Tokens(70, 5), 15, 4},
          {Concat(system, Tokens(1, 6)), 10, 5},  {Tokens(1, 7), 25, 6},
          {Concat(system, Tokens(17, 8)), 14, 7}, {Tokens(33, 9), 5, 8}};
}

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
      GenerationRequest r;
      r.prompt = jobs[i].prompt;
      r.max_tokens = jobs[i].max_tokens;
      r.sampling = Sampling(jobs[i].seed);
      r.stop_at_eog = true;
      ASSERT_TRUE((*sched)->Submit(r, c.Callback(static_cast<int>(i))).ok());
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
  GenerationRequest a;
  a.prompt = Tokens(21, 13);
  a.max_tokens = 6;
  a.stop_at_eog = false;
  a.sampling = Sampling(3);
  a.save_session = "chat";
  a.tenant_salt = 9;
  ASSERT_TRUE((*sched)->Submit(a, c.Callback(0)).ok());
  const Outcome oa = c.Wait(0);
  Scheduler* s = sched->get();
  EXPECT_TRUE(s->RunBetweenSteps([s](Engine&) {
                 return s->SessionNames() == std::vector<std::string>{"chat"} ? Status::Ok() : Internal("no session");
               }).ok());
  GenerationRequest b;
  b.prompt = Tokens(5, 14);
  b.max_tokens = 7;
  b.stop_at_eog = false;
  b.sampling = Sampling(4);
  b.resume_session = "chat";
  b.tenant_salt = 9;
  ASSERT_TRUE((*sched)->Submit(b, c.Callback(1)).ok());
  const Outcome ob = c.Wait(1);
  ASSERT_TRUE(ob.finish.at(0).status.ok()) << ob.finish.at(0).status.ToString();
  const auto history = Concat(Concat(a.prompt, oa.finish.at(0).tokens), b.prompt);
  EXPECT_EQ(ob.finish.at(0).tokens, Alone(*alone_engine, history, 7, 4));
  EXPECT_EQ(ob.timing.cached_tokens, 21 + 6 - 1);  // all but the pending last token
  // Another tenant cannot resume it; an unknown session is an error.
  b.tenant_salt = 10;
  ASSERT_TRUE((*sched)->Submit(b, c.Callback(2)).ok());
  EXPECT_EQ(c.Wait(2).finish.at(0).reason, FinishReason::kError);
  b.resume_session = "nope";
  ASSERT_TRUE((*sched)->Submit(b, c.Callback(3)).ok());
  EXPECT_EQ(c.Wait(3).finish.at(0).status.code(), StatusCode::kNotFound);
  // The session API, on the scheduler thread.
  EXPECT_TRUE(s->RunBetweenSteps([s](Engine& e) -> Status {
                 KVX_ASSIGN_OR_RETURN(kv::SeqId seq, s->SessionSequence("chat"));
                 KVX_ASSIGN_OR_RETURN(auto pending, s->SessionPendingTokens("chat"));
                 if (pending.size() != 1) return Internal("expected one pending token");
                 if (e.kv_manager().length(seq) != 21 + 6 - 1) return Internal("session length");
                 return s->DropSession("chat");
               }).ok());
  EXPECT_TRUE(s->RunBetweenSteps([s](Engine&) {
                 return s->SessionNames().empty() ? Status::Ok() : Internal("session not dropped");
               }).ok());
  ExpectInvariants(*s);
}

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
  GenerationRequest a;
  a.prompt = Tokens(90, 21);
  a.max_tokens = 10;
  a.n = 2;
  a.stop_at_eog = false;
  a.sampling = Sampling(50);
  a.save_session = "chat";
  ASSERT_TRUE(s->Submit(a, c.Callback(0)).ok());
  const Outcome oa = c.Wait(0);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(oa.finish.at(i).status.ok()) << oa.finish.at(i).status.ToString();
    EXPECT_EQ(oa.finish.at(i).tokens, Alone(*alone_engine, a.prompt, 10, 50 + i, true)) << "sample " << i;
  }
  // The kept session: 99 tokens, about half of them in the KV.
  EXPECT_TRUE(s->RunBetweenSteps([s](Engine& e) -> Status {
                 KVX_ASSIGN_OR_RETURN(kv::SeqId seq, s->SessionSequence("chat"));
                 const kv::KVManager& m = e.kv_manager();
                 if (!m.entries_removed(seq)) return Internal("the session was not compressed");
                 const int live = m.kv(seq).LiveEntries(0, 0);
                 if (live >= 70) return Internal("the session keeps " + std::to_string(live) + " of 99 entries");
                 return Status::Ok();
               }).ok());
  // The next turn: pending token + prompt, compressed again after it.
  GenerationRequest b;
  b.prompt = Tokens(40, 22);
  b.max_tokens = 6;
  b.stop_at_eog = false;
  b.sampling = Sampling(60);
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
  ASSERT_TRUE((*sched)->RunBetweenSteps([&](Engine&) -> Status {
                for (size_t i = 0; i < jobs.size(); ++i) {
                  GenerationRequest r;
                  r.prompt = jobs[i].prompt;
                  r.max_tokens = jobs[i].max_tokens;
                  r.sampling = Sampling(jobs[i].seed);
                  KVX_RETURN_IF_ERROR((*sched)->Submit(r, c.Callback(static_cast<int>(i))).status());
                }
                return Status::Ok();
              }).ok());
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
                   GenerationRequest r;
                   r.prompt = prompt;
                   r.max_tokens = i == 0 ? leader_tokens : follower_tokens;
                   r.stop_at_eog = false;
                   r.sampling = Sampling(70 + i);
                   KVX_RETURN_IF_ERROR(s->Submit(r, logged(i)).status());
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
                   GenerationRequest r;
                   r.prompt = prompt;
                   r.max_tokens = 6;
                   r.stop_at_eog = false;
                   r.sampling = Sampling(90 + i);
                   KVX_ASSIGN_OR_RETURN(RequestId id, s->Submit(r, c.Callback(i)));
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
  GenerationRequest r;
  r.prompt = Tokens(10, 3);
  r.max_tokens = 4;
  r.stop_at_eog = false;
  r.sampling = Sampling(5);
  ASSERT_TRUE((*sched)->Submit(r, c.Callback(0)).ok());
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
  GenerationRequest r;
  EXPECT_EQ((*sched)->Submit(r, cb).status().code(), StatusCode::kInvalidArgument);  // empty prompt
  r.prompt = {1, 2, 100000};
  EXPECT_EQ((*sched)->Submit(r, cb).status().code(), StatusCode::kInvalidArgument);
  r.prompt = {1, 2};
  r.max_tokens = 0;
  EXPECT_EQ((*sched)->Submit(r, cb).status().code(), StatusCode::kInvalidArgument);
  r.max_tokens = 4;
  r.n = 0;
  EXPECT_EQ((*sched)->Submit(r, cb).status().code(), StatusCode::kInvalidArgument);
  r.n = 1;
  r.prompt = Tokens(300, 1);  // longer than the context
  EXPECT_EQ((*sched)->Submit(r, cb).status().code(), StatusCode::kInvalidArgument);
  SchedulerOptions bad;
  bad.max_running = 0;
  EXPECT_FALSE(Scheduler::Create(*engine, bad).ok());
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
