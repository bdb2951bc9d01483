#include "kv/policy/streaming_llm.h"

#include <gtest/gtest.h>

#include <random>

#include "kv/attention.h"
#include "ops/nn.h"

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
    auto m = std::move(KVManager::Create(std::move(*r))).value();
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

// Random K/V per token (un-roped: the cache is pre-RoPE).
void RandomStep(KVManager& m, SeqId seq, int n, std::mt19937& rng) {
  std::vector<int32_t> toks(n, 1), pos(n);
  for (int i = 0; i < n; ++i) pos[i] = m.length(seq) + i;
  const StepRequest req{seq, toks, pos};
  ASSERT_TRUE(m.BeginStep({&req, 1}).ok());
  const KVLayout& L = m.spec().layout;
  std::normal_distribution<float> nd;
  std::vector<float> k(static_cast<size_t>(n) * L.n_kv_heads * L.head_dim), v(k.size());
  for (float& x : k) x = nd(rng);
  for (float& x : v) x = nd(rng);
  for (int l = 0; l < L.n_layers; ++l) ASSERT_TRUE(m.kv(seq).Append(l, n, pos.data(), k.data(), v.data()).ok());
  ASSERT_TRUE(m.CommitStep().ok());
}

TEST(StreamingLLMTest, RepackedPositionsAreTheInCacheDistances) {
  const KVLayout layout{1, 1, 16, 8};
  auto r = ResolveKVSpec("codec=f16,page=8,prerope=1;policy=streamingllm,sinks=2,window=10,positions=repack", layout,
                         4096, 1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto m = std::move(KVManager::Create(std::move(*r))).value();
  ops::RopeParams rope{};
  rope.n_dims = 16;
  const SeqId a = m->AddSequence();
  m->kv(a).set_rope(rope);
  std::mt19937 rng(7);
  RandomStep(*m, a, 30, rng);
  for (int i = 0; i < 25; ++i) RandomStep(*m, a, 1, rng);
  ASSERT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants().ToString();
  // The 12 live entries sit at positions 43..54, just below the next query (55).
  std::vector<float> k(16), v(16), ks, vs;
  std::vector<int32_t> kept;
  for (int s = 0; s < m->kv(a).Length(0, 0); ++s) {
    int32_t p;
    m->kv(a).ReadEntry(0, 0, s, k.data(), v.data(), &p);
    if (p == kDeadPosition) continue;
    kept.push_back(p);
    ks.insert(ks.end(), k.begin(), k.end());
    vs.insert(vs.end(), v.begin(), v.end());
  }
  std::vector<int32_t> want(12);
  for (int i = 0; i < 12; ++i) want[i] = 43 + i;
  EXPECT_EQ(kept, want);
  // Attention of a query at 55 equals the paper's: the same keys at in-cache
  // positions 0..11 and the query at 12.
  SequenceKV fresh(&m->pool(), m->spec().layout, m->spec().spec.codec);
  fresh.set_rope(rope);
  std::vector<int32_t> idx(12);
  for (int i = 0; i < 12; ++i) idx[i] = i;
  ASSERT_TRUE(fresh.Append(0, 12, idx.data(), ks.data(), vs.data()).ok());
  std::normal_distribution<float> nd;
  std::vector<float> q(16), q1(16), q2(16), out1(16), out2(16);
  for (float& x : q) x = nd(rng);
  q1 = q;
  q2 = q;
  ops::Rope(q1.data(), 1, 16, 55, rope);
  ops::Rope(q2.data(), 1, 16, 12, rope);
  const int32_t p1 = 55, p2 = 12;
  Attention(m->kv(a), 0, q1.data(), &p1, 1, 1, 0.25f, out1.data(), nullptr);
  Attention(fresh, 0, q2.data(), &p2, 1, 1, 0.25f, out2.data(), nullptr);
  for (int c = 0; c < 16; ++c) EXPECT_NEAR(out1[c], out2[c], 2e-3) << c;
}

TEST(StreamingLLMTest, RepackNeedsPreRopeKeys) {
  auto bad = ResolveKVSpec("codec=f16;policy=streamingllm,positions=repack", KVLayout{2, 2, 16, 8}, 64, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("prerope=1"), std::string::npos);
  EXPECT_FALSE(PolicyRegistry::Global().Create("streamingllm", {{"positions", "shuffled"}}).ok());
}

TEST(StreamingLLMTest, ParametersAreChecked) {
  EXPECT_TRUE(PolicyRegistry::Global().Create("streamingllm", {{"sinks", "0"}, {"window", "1"}}).ok());
  EXPECT_FALSE(PolicyRegistry::Global().Create("streamingllm", {{"window", "0"}}).ok());
  EXPECT_FALSE(PolicyRegistry::Global().Create("streamingllm", {{"window", "-3"}}).ok());
  EXPECT_FALSE(PolicyRegistry::Global().Create("streamingllm", {{"window", "12x"}}).ok());
  EXPECT_FALSE(PolicyRegistry::Global().Create("streamingllm", {{"ratio", "0.5"}}).ok());
  auto bad = ResolveKVSpec("codec=f16;policy=nope", KVLayout{2, 2, 16, 8}, 64, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("streamingllm"), std::string::npos);
}

}  // namespace
}  // namespace kvx::kv
