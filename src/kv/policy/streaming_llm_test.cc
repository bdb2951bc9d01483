#include "kv/policy/streaming_llm.h"

#include <gtest/gtest.h>

#include <random>

#include "kv/kv_manager.h"

namespace kvx::kv {
namespace {

// Appends n tokens of constant K/V to every table of `seq` through a step.
void Step(KVManager& m, SeqId seq, int n) {
  std::vector<int32_t> toks(n, 1), pos(n);
  for (int i = 0; i < n; ++i) pos[i] = m.length(seq) + i;
  const StepRequest req{seq, toks, pos};
  ASSERT_TRUE(m.BeginStep({&req, 1}).ok());
  const KVLayout& L = m.spec().layout;
  std::vector<float> kv(static_cast<size_t>(n) * L.n_kv_heads * L.head_dim, 0.25f);
  for (int l = 0; l < L.n_layers; ++l) ASSERT_TRUE(m.kv(seq).Append(l, n, pos.data(), kv.data(), kv.data()).ok());
  ASSERT_TRUE(m.CommitStep().ok());
}

TEST(StreamingLLMTest, KeepsSinksAndWindowAndFreesThePagesBetween) {
  for (const std::string codec : {"codec=f16,page=8", "codec=kivi2,page=8,residual=8", "codec=int4,page=8,sinks=8"}) {
    SCOPED_TRACE(codec);
    auto r = ResolveKVSpec(codec + ";policy=streamingllm,sinks=4,window=20", KVLayout{2, 2, 16, 8}, 4096, 1);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    auto m = std::move(KVManager::Create(*r)).value();
    ASSERT_EQ(m->policies().size(), 1u);
    const SeqId a = m->AddSequence();
    Step(*m, a, 50);  // a prompt
    uint64_t most = 0;
    for (int i = 0; i < 300; ++i) {
      Step(*m, a, 1);
      most = std::max(most, m->BytesInUse());
    }
    ASSERT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants().ToString();
    EXPECT_EQ(m->length(a), 350);
    for (int l = 0; l < 2; ++l) {
      for (int h = 0; h < 2; ++h) {
        EXPECT_EQ(m->kv(a).LiveEntries(l, h), 24);
        // The survivors: positions 0..3 and the last 20.
        std::vector<int32_t> kept;
        for (int s = 0; s < m->kv(a).Length(l, h); ++s) {
          float k[16], v[16];
          int32_t p;
          m->kv(a).ReadEntry(l, h, s, k, v, &p);
          if (p != kDeadPosition) kept.push_back(p);
        }
        std::vector<int32_t> want = {0, 1, 2, 3};
        for (int p = 330; p < 350; ++p) want.push_back(p);
        EXPECT_EQ(kept, want);
        // Pages: the sink page, the window's (3 of 8 slots, + the page it starts in), no more.
        EXPECT_LE(m->kv(a).table(l, h).num_pages(), 1 + 20 / 8 + 2);
      }
    }
    // Memory stays bounded: at most the sink page + window pages + a
    // staging page or two per table, never the 350 tokens' pages.
    EXPECT_LT(most, 350u / 8 * 4 * m->pool().page_bytes() / 2);
  }
}

TEST(StreamingLLMTest, ParametersAreChecked) {
  EXPECT_TRUE(StreamingLLMPolicy::Create({{"sinks", "0"}, {"window", "1"}}).ok());
  EXPECT_FALSE(StreamingLLMPolicy::Create({{"window", "0"}}).ok());
  EXPECT_FALSE(StreamingLLMPolicy::Create({{"window", "-3"}}).ok());
  EXPECT_FALSE(StreamingLLMPolicy::Create({{"window", "12x"}}).ok());
  EXPECT_FALSE(StreamingLLMPolicy::Create({{"ratio", "0.5"}}).ok());
  auto bad = ResolveKVSpec("codec=f16;policy=nope", KVLayout{2, 2, 16, 8}, 64, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("streamingllm"), std::string::npos);
}

}  // namespace
}  // namespace kvx::kv
