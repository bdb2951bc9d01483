// Compressed caches that can be reused (engine/compressed_cache.h, the
// scheduler's part in scheduler_compressed.cc): N questions against one
// context compress it once, a hit holds the bytes a fresh compression
// writes, another moment or tenant never hits, and continuous policies get
// prefix hits. Threads of its own: labelled `threads` (TSan stage).
#include "engine/compressed_cache.h"

#include <gtest/gtest.h>

#include "engine/scheduler.h"
#include "engine/scheduler_test_util.h"

namespace kvx::engine {
namespace {

using namespace scheduler_test;  // NOLINT: the shared test helpers

const char kSnapKV[] = "codec=f16,page=16;policy=snapkv,ratio=0.5,window=8,sinks=2";
constexpr int kContext = 120;

std::vector<int32_t> Context() { return Tokens(kContext, 31); }
std::vector<int32_t> Question(int i) { return Tokens(10, 40 + i); }

// The question `i` against the shared context, compressed after the context.
GenerationRequest Ask(int i, int max_tokens = 8) {
  GenerationRequest r = FixedLengthRequest(Concat(Context(), Question(i)), max_tokens, 70 + static_cast<uint64_t>(i));
  r.compress_at = kContext;
  return r;
}

// What Generate gives alone for Ask(i): prefill the context, compress, then
// the question.
std::vector<int32_t> AskAlone(Engine& e, int i) {
  auto s = e.NewSession();
  EXPECT_TRUE(s.ok());
  const GenerationRequest r = Ask(i);
  GenerateOptions go;
  go.n_predict = r.max_tokens;
  go.sampler = r.sampling;
  go.compress_at = kContext;
  std::vector<int32_t> out;
  GenerateStats st;
  EXPECT_TRUE(Generate(s->get(), r.prompt, go, nullptr, &out, &st).ok());
  return out;
}

// The first question alone (it compresses the context), then the others
// together; every request's tokens.
std::vector<std::vector<int32_t>> AskFour(Scheduler& s) {
  Collector c;
  EXPECT_TRUE(s.Submit(Ask(0), c.Callback(0)).ok());
  std::vector<std::vector<int32_t>> out = {c.Wait(0).finish.at(0).tokens};
  EXPECT_TRUE(s.RunBetweenSteps([&](Engine&) -> Status {
                 for (int i = 1; i < 4; ++i) KVX_RETURN_IF_ERROR(s.Submit(Ask(i), c.Callback(i)).status());
                 return Status::Ok();
               }).ok());
  for (int i = 1; i < 4; ++i) out.push_back(c.Wait(i).finish.at(0).tokens);
  return out;
}

TEST(CompressedCacheTest, FourQuestionsOnOneContextCompressOnce) {
  auto engine = MakeEngine(kSnapKV);
  auto alone = MakeEngine(kSnapKV, 256, 1);
  ASSERT_TRUE(engine && alone);
  auto sched = Scheduler::Create(*engine, {});
  ASSERT_TRUE(sched.ok());
  const std::vector<std::vector<int32_t>> got = AskFour(**sched);
  const SchedulerStats st = (*sched)->Stats();
  EXPECT_EQ(st.compressions, 1u);
  EXPECT_EQ(st.compressed_hits, 3u);
  EXPECT_EQ(st.compressed_hit_tokens, 3u * kContext);
  // The context once, then each question's 10 tokens.
  EXPECT_EQ(st.prompt_tokens_computed, static_cast<uint64_t>(kContext + 4 * 10));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got[i], AskAlone(*alone, i)) << "question " << i;
  ExpectInvariants(**sched);

  // Without the prefix cache: four compressions, the same tokens.
  auto plain_engine = MakeEngine(kSnapKV);
  SchedulerOptions off;
  off.prefix_cache = false;
  auto plain = Scheduler::Create(*plain_engine, off);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(AskFour(**plain), got);
  EXPECT_EQ((*plain)->Stats().compressions, 4u);
  EXPECT_EQ((*plain)->Stats().prompt_tokens_computed, static_cast<uint64_t>(4 * (kContext + 10)));
}

// The sequence of a request that hit, kept as a session, holds the bytes a
// fresh compression (prefix cache off) writes: the same pages, tokens and
// positions, so the same logits.
TEST(CompressedCacheTest, AHitHoldsTheBytesOfAFreshCompression) {
  auto exported = [](bool prefix_cache) {
    auto engine = MakeEngine(kSnapKV);
    SchedulerOptions so;
    so.prefix_cache = prefix_cache;
    auto sched = Scheduler::Create(*engine, so);
    EXPECT_TRUE(sched.ok());
    Collector c;
    EXPECT_TRUE((*sched)->Submit(Ask(0), c.Callback(0)).ok());
    c.Wait(0);
    GenerationRequest r = Ask(1);
    r.save_session = "kept";
    EXPECT_TRUE((*sched)->Submit(r, c.Callback(1)).ok());
    c.Wait(1);
    const SchedulerStats st = (*sched)->Stats();
    EXPECT_EQ(st.compressed_hits, prefix_cache ? 1u : 0u);
    std::vector<std::vector<uint8_t>> pages;
    std::vector<int32_t> tokens, positions;
    EXPECT_TRUE((*sched)
                    ->RunBetweenSteps([&](Engine& e) -> Status {
                      KVX_ASSIGN_OR_RETURN(kv::SeqId seq, (*sched)->SessionSequence(0, "kept"));
                      KVX_ASSIGN_OR_RETURN(auto image, e.kv_manager().ExportSequence(seq));
                      tokens = image.tokens;
                      positions = image.positions;
                      for (const auto& t : image.tables) {
                        for (const auto& p : t.pages) pages.emplace_back(p.begin(), p.end());
                      }
                      return Status::Ok();
                    })
                    .ok());
    return std::make_tuple(pages, tokens, positions);
  };
  const auto hit = exported(true), fresh = exported(false);
  EXPECT_FALSE(std::get<0>(hit).empty());
  EXPECT_EQ(std::get<1>(hit), std::get<1>(fresh));
  EXPECT_EQ(std::get<2>(hit), std::get<2>(fresh));
  EXPECT_TRUE(std::get<0>(hit) == std::get<0>(fresh)) << "the pages differ";
}

// An entry is keyed by its compression moment and tenant: another moment,
// the whole prompt uncompressed, or another tenant compute their own.
TEST(CompressedCacheTest, AnotherMomentOrTenantNeverHits) {
  auto engine = MakeEngine(kSnapKV);
  auto sched = Scheduler::Create(*engine, {});
  ASSERT_TRUE(sched.ok());
  Scheduler& s = **sched;
  Collector c;
  ASSERT_TRUE(s.Submit(Ask(0), c.Callback(0)).ok());
  c.Wait(0);
  GenerationRequest earlier = Ask(1);
  earlier.compress_at = kContext - 16;
  GenerationRequest whole = Ask(2);
  whole.compress_at = 0;  // after the whole prompt (question included)
  GenerationRequest uncompressed = Ask(3);
  uncompressed.compress = false;
  GenerationRequest tenant = Ask(1);
  tenant.tenant_salt = 7;
  int key = 1;
  for (const GenerationRequest& r : {earlier, whole, uncompressed, tenant}) {
    ASSERT_TRUE(s.Submit(r, c.Callback(key)).ok());
    ASSERT_TRUE(c.Wait(key).finish.at(0).status.ok());
    ++key;
  }
  const SchedulerStats st = s.Stats();
  EXPECT_EQ(st.compressed_hits, 0u);
  EXPECT_EQ(st.compressions, 4u);  // all but the uncompressed one
  // The same question at the same moment still hits.
  ASSERT_TRUE(s.Submit(Ask(1), c.Callback(9)).ok());
  c.Wait(9);
  EXPECT_EQ(s.Stats().compressed_hits, 1u);
  ExpectInvariants(s);
}

// A continuous policy (H2O evicts at every step) keeps its prefix cache:
// a request whose prompt extends a finished sequence continues from it.
TEST(CompressedCacheTest, ContinuousPoliciesGetPrefixHits) {
  auto engine = MakeEngine("codec=f16,page=16;policy=h2o,budget=64,sinks=2");
  ASSERT_TRUE(engine);
  auto sched = Scheduler::Create(*engine, {});
  ASSERT_TRUE(sched.ok());
  Scheduler& s = **sched;
  Collector c;
  GenerationRequest context = FixedLengthRequest(Context(), 1, 1);
  ASSERT_TRUE(s.Submit(context, c.Callback(0)).ok());
  ASSERT_TRUE(c.Wait(0).finish.at(0).status.ok());
  for (int i = 1; i <= 2; ++i) {
    ASSERT_TRUE(s.Submit(FixedLengthRequest(Concat(Context(), Question(i)), 6, 5), c.Callback(i)).ok());
    ASSERT_TRUE(c.Wait(i).finish.at(0).status.ok());
  }
  const SchedulerStats st = s.Stats();
  EXPECT_EQ(st.compressed_hits, 2u);
  EXPECT_EQ(st.compressed_hit_tokens, 2u * kContext);
  EXPECT_EQ(st.prompt_tokens_computed, static_cast<uint64_t>(kContext + 2 * 10));
  EXPECT_EQ(st.compressions, 0u);
  ExpectInvariants(s);
}

}  // namespace
}  // namespace kvx::engine
