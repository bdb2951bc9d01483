#include "kv/radix_cache.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace kvx::kv {
namespace {

constexpr KVLayout kShape{2, 2, 16, 16};  // page_tokens comes from the spec
constexpr int T = 16;

std::unique_ptr<KVManager> MakeManager(const std::string& spec, int n_ctx = 256, int n_seqs = 4) {
  auto r = ResolveKVSpec(spec, kShape, n_ctx, n_seqs);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  auto m = KVManager::Create(std::move(r).value(), KVManagerOptions{});
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return std::move(m).value();
}

// Appends `tokens` to `seq` in one step with K/V derived from (token,
// position), the way a forward pass would (same prefix -> same entries).
Status Feed(KVManager& m, SeqId seq, const std::vector<int32_t>& tokens) {
  std::vector<int32_t> pos;
  for (size_t i = 0; i < tokens.size(); ++i) pos.push_back(m.length(seq) + static_cast<int32_t>(i));
  const StepRequest req{seq, tokens, pos};
  KVX_RETURN_IF_ERROR(m.BeginStep(std::span<const StepRequest>(&req, 1)));
  const KVLayout& L = m.spec().layout;
  for (int l = 0; l < L.n_layers; ++l) {
    std::vector<float> k(tokens.size() * L.n_kv_heads * L.head_dim), v(k.size());
    for (size_t i = 0; i < k.size(); ++i) {
      const size_t t = i / (L.n_kv_heads * L.head_dim);
      k[i] = 0.01f * static_cast<float>((tokens[t] * 7 + pos[t] + static_cast<int>(i % 13) + l) % 97);
      v[i] = -k[i];
    }
    Status s = m.kv(seq).Append(l, static_cast<int>(tokens.size()), pos.data(), k.data(), v.data());
    if (!s.ok()) return Internal("reserved append failed: " + s.message());
  }
  return m.CommitStep();
}

std::vector<int32_t> Tokens(int n, int seed) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((i * 31 + seed * 1009 + 3) % 500);
  return t;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

#define EXPECT_OK_INVARIANTS(m, c)                                                \
  do {                                                                            \
    EXPECT_TRUE((m).CheckInvariants().ok()) << (m).CheckInvariants().ToString();  \
    EXPECT_TRUE((c).CheckInvariants().ok()) << (c).CheckInvariants().ToString();  \
  } while (0)

SeqId NewSeq(KVManager& m, const std::vector<int32_t>& tokens, uint64_t salt = 0) {
  const SeqId s = m.AddSequence(salt);
  EXPECT_TRUE(Feed(m, s, tokens).ok());
  return s;
}

TEST(RadixCacheTest, SharedPrefixHitsAndSharesPages) {
  for (const std::string spec : {"codec=f16,page=16", "codec=kivi2,page=16,residual=16", "codec=int8,page=16"}) {
    SCOPED_TRACE(spec);
    auto m = MakeManager(spec);
    RadixCache cache(m.get());
    const auto system = Tokens(2 * T + 5, 1);  // 2 full blocks shared
    const auto a = Concat(system, Tokens(T + 3, 2));
    const SeqId sa = NewSeq(*m, a);
    EXPECT_EQ(cache.Insert(sa), static_cast<int>(a.size()) / T);  // 3 full blocks of 56 tokens
    EXPECT_OK_INVARIANTS(*m, cache);
    EXPECT_EQ(m->num_sequences(), 1);  // the holder (the truncated sequence)

    const auto b = Concat(system, Tokens(40, 3));
    auto match = cache.Lookup(0, b, static_cast<int>(b.size()) - 1);
    EXPECT_EQ(match.blocks, 2);
    EXPECT_EQ(match.tokens, 2 * T);
    // The limit applies: a request must compute at least its last token.
    EXPECT_EQ(cache.Lookup(0, system, 2 * T - 1).blocks, 1);
    const uint64_t before = m->BytesInUse();
    auto sb = cache.ForkMatch(match);
    ASSERT_TRUE(sb.ok()) << sb.status().ToString();
    EXPECT_EQ(m->BytesInUse(), before);  // shared, not copied
    EXPECT_EQ(m->tokens(*sb), std::vector<int32_t>(b.begin(), b.begin() + 2 * T));
    EXPECT_TRUE(m->pool().IsShared(m->kv(*sb).table(1, 1).pages()[0]));
    EXPECT_EQ(cache.lock_count(match.deepest), 1);
    EXPECT_OK_INVARIANTS(*m, cache);
    // The forked sequence continues and is inserted: only its new blocks are new.
    ASSERT_TRUE(Feed(*m, *sb, std::vector<int32_t>(b.begin() + 2 * T, b.end())).ok());
    cache.Unlock(match.deepest);
    EXPECT_EQ(cache.Insert(*sb), static_cast<int>(b.size()) / T - 2);
    EXPECT_EQ(cache.num_blocks(), 3 + static_cast<int>(b.size()) / T - 2);
    EXPECT_OK_INVARIANTS(*m, cache);
    // A sequence already fully cached adds nothing and is released.
    const SeqId sc = NewSeq(*m, a);
    EXPECT_EQ(cache.Insert(sc), 0);
    EXPECT_FALSE(m->HasSequence(sc));
    EXPECT_OK_INVARIANTS(*m, cache);
  }
}

// In-flight sharing: a sequence still prefilling puts its committed blocks
// into the cache (InsertPrefix) and keeps them locked; another sequence
// starts from them while the first one keeps growing; the first one's end
// (Insert) then adds only its later blocks.
TEST(RadixCacheTest, RunningSequenceSharesItsCommittedBlocks) {
  for (const std::string spec : {"codec=f16,page=16", "codec=kivi2,page=16,residual=16"}) {
    SCOPED_TRACE(spec);
    auto m = MakeManager(spec);
    RadixCache cache(m.get());
    const auto prompt = Tokens(5 * T + 7, 12);
    const SeqId leader = NewSeq(*m, std::vector<int32_t>(prompt.begin(), prompt.begin() + 2 * T + 3));
    const uint64_t before = m->BytesInUse();
    RadixCache::NodeId locked = cache.InsertPrefix(leader, 2);
    ASSERT_NE(locked, RadixCache::kNoNode);
    cache.Lock(locked);
    EXPECT_EQ(m->BytesInUse(), before);  // the holder shares the leader's pages
    EXPECT_TRUE(m->HasSequence(leader));
    EXPECT_EQ(cache.num_blocks(), 2);
    EXPECT_OK_INVARIANTS(*m, cache);
    // Locked while the leader runs: eviction leaves them.
    cache.Clear();
    EXPECT_EQ(cache.num_blocks(), 2);
    // A follower starts from them.
    auto match = cache.Lookup(0, prompt, static_cast<int>(prompt.size()) - 1);
    ASSERT_EQ(match.blocks, 2);
    auto follower = cache.ForkMatch(match);
    ASSERT_TRUE(follower.ok()) << follower.status().ToString();
    // The leader goes on; its next blocks are shared too (the lock moves down).
    ASSERT_TRUE(Feed(*m, leader, std::vector<int32_t>(prompt.begin() + 2 * T + 3, prompt.begin() + 4 * T + 1)).ok());
    const RadixCache::NodeId deeper = cache.InsertPrefix(leader, m->length(leader) / T);
    ASSERT_NE(deeper, RadixCache::kNoNode);
    cache.Lock(deeper);
    cache.Unlock(locked);
    EXPECT_EQ(cache.num_blocks(), 4);
    EXPECT_EQ(cache.num_holders(), 2);
    EXPECT_EQ(cache.InsertPrefix(leader, 4), deeper);  // nothing new: the same path
    EXPECT_OK_INVARIANTS(*m, cache);
    // The follower goes on from its fork; both end: only new blocks are added.
    ASSERT_TRUE(Feed(*m, *follower, std::vector<int32_t>(prompt.begin() + 2 * T, prompt.end())).ok());
    EXPECT_EQ(m->tokens(*follower), prompt);
    cache.Unlock(match.deepest);
    EXPECT_EQ(cache.Insert(*follower), 1);  // block 4
    cache.Unlock(deeper);
    EXPECT_EQ(cache.Insert(leader), 0);
    EXPECT_EQ(cache.num_blocks(), 5);
    EXPECT_OK_INVARIANTS(*m, cache);
    // A sequence a policy removed entries from shares nothing.
    const SeqId removed = NewSeq(*m, Tokens(2 * T, 13));
    m->MarkEntriesRemoved(removed);
    EXPECT_EQ(cache.InsertPrefix(removed, 2), RadixCache::kNoNode);
    m->ReleaseSequence(removed);
    cache.Clear();
    EXPECT_EQ(m->num_sequences(), 0);
    EXPECT_EQ(m->BytesInUse(), 0u);
    EXPECT_OK_INVARIANTS(*m, cache);
  }
}

TEST(RadixCacheTest, TenantsNeverShare) {
  auto m = MakeManager("codec=f16,page=16");
  RadixCache cache(m.get());
  const auto p = Tokens(3 * T, 4);
  cache.Insert(NewSeq(*m, p, /*salt=*/111));
  EXPECT_EQ(cache.Lookup(111, p, 3 * T).blocks, 3);
  EXPECT_EQ(cache.Lookup(222, p, 3 * T).blocks, 0);
  EXPECT_EQ(cache.Lookup(0, p, 3 * T).blocks, 0);
  // The other tenant's copy is a separate entry.
  EXPECT_EQ(cache.Insert(NewSeq(*m, p, 222)), 3);
  EXPECT_EQ(cache.num_blocks(), 6);
  EXPECT_OK_INVARIANTS(*m, cache);
}

TEST(RadixCacheTest, EvictsLeastRecentlyUsedLeavesSuffixFirst) {
  auto m = MakeManager("codec=f16,page=16");
  RadixCache cache(m.get());
  const auto sys = Tokens(2 * T, 5);
  const auto a = Concat(sys, Tokens(2 * T, 6)), b = Concat(sys, Tokens(2 * T, 7));
  cache.Insert(NewSeq(*m, a));
  cache.Insert(NewSeq(*m, b));
  EXPECT_EQ(cache.num_blocks(), 6);
  EXPECT_EQ(cache.num_holders(), 2);
  cache.Lookup(0, a, 4 * T);  // a is now the most recent
  // b's suffix goes first, one block at a time, then a's suffix, then the shared prefix.
  ASSERT_TRUE(cache.EvictOne());
  EXPECT_EQ(cache.Lookup(0, b, 4 * T).blocks, 3);
  EXPECT_OK_INVARIANTS(*m, cache);
  cache.Lookup(0, a, 4 * T);
  ASSERT_TRUE(cache.EvictOne());
  EXPECT_EQ(cache.Lookup(0, b, 4 * T).blocks, 2);  // b's holder is gone
  EXPECT_EQ(cache.num_holders(), 1);
  EXPECT_EQ(cache.Lookup(0, a, 4 * T).blocks, 4);
  std::vector<int> left;
  while (cache.EvictOne()) {
    left.push_back(cache.Lookup(0, a, 4 * T).blocks);
    EXPECT_OK_INVARIANTS(*m, cache);
  }
  EXPECT_EQ(left, (std::vector<int>{3, 2, 1, 0}));  // never a prefix before its suffix
  EXPECT_EQ(m->num_sequences(), 0);
  EXPECT_EQ(m->BytesInUse(), 0u);
}

TEST(RadixCacheTest, LockedPathsAreNotEvicted) {
  auto m = MakeManager("codec=f16,page=16");
  RadixCache cache(m.get());
  const auto p = Tokens(4 * T, 8);
  cache.Insert(NewSeq(*m, p));
  auto match = cache.Lookup(0, p, 2 * T + 3);
  ASSERT_EQ(match.blocks, 2);
  auto seq = cache.ForkMatch(match);
  ASSERT_TRUE(seq.ok());
  cache.Clear();  // evicts the unlocked suffix only
  EXPECT_EQ(cache.num_blocks(), 2);
  EXPECT_EQ(cache.Lookup(0, p, 4 * T).blocks, 2);
  EXPECT_OK_INVARIANTS(*m, cache);
  cache.Unlock(match.deepest);
  m->ReleaseSequence(*seq);
  cache.Clear();
  EXPECT_EQ(cache.num_blocks(), 0);
  EXPECT_EQ(m->BytesInUse(), 0u);
  EXPECT_OK_INVARIANTS(*m, cache);
}

// A pool full of cached pages makes room for new work by eviction.
TEST(RadixCacheTest, EvictionUnderPressureFreesThePool) {
  auto m = MakeManager("codec=f16,page=16", /*n_ctx=*/128, /*n_seqs=*/2);  // room for 256 tokens
  RadixCache cache(m.get());
  for (int i = 0; i < 3; ++i) cache.Insert(NewSeq(*m, Tokens(4 * T, 20 + i)));  // 192 tokens cached
  EXPECT_EQ(cache.num_blocks(), 12);
  const uint64_t evictable = cache.EvictableBytes();
  EXPECT_EQ(evictable, m->BytesInUse());
  const SeqId s = m->AddSequence();
  EXPECT_EQ(Feed(*m, s, Tokens(6 * T, 30)).code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(m->CheckInvariants().ok());
  const uint64_t need = BytesForContext(m->spec().layout, m->spec().spec.codec, 6 * T);
  const uint64_t budget = m->pool().budget_bytes();
  const uint64_t freed = cache.Evict(need - (budget - m->BytesInUse()));
  EXPECT_GT(freed, 0u);
  EXPECT_EQ(cache.EvictableBytes(), evictable - freed);
  EXPECT_TRUE(Feed(*m, s, Tokens(6 * T, 30)).ok());
  EXPECT_OK_INVARIANTS(*m, cache);
  EXPECT_LT(cache.num_blocks(), 12);
}

TEST(RadixCacheTest, SequencesWithRemovedEntriesAreNotInserted) {
  auto m = MakeManager("codec=f16,page=16");
  RadixCache cache(m.get());
  const SeqId s = NewSeq(*m, Tokens(3 * T, 9));
  m->MarkEntriesRemoved(s);
  EXPECT_EQ(cache.Insert(s), 0);
  EXPECT_FALSE(m->HasSequence(s));
  EXPECT_EQ(cache.num_blocks(), 0);
}

// Random lookups, forks, steps, inserts, evictions and unlocks over a few
// shared prefixes and two tenants: both invariant checks after each.
TEST(RadixCacheTest, RandomOperationsKeepInvariants) {
  for (const std::string spec : {"codec=f16,page=16", "codec=kivi4,page=16,residual=16"}) {
    SCOPED_TRACE(spec);
    auto m = MakeManager(spec, /*n_ctx=*/160, /*n_seqs=*/4);
    RadixCache cache(m.get());
    std::mt19937 rng(7);
    struct Live {
      SeqId seq;
      RadixCache::NodeId locked;
      std::vector<int32_t> want;  // its full token list
    };
    std::vector<Live> live;
    int hits = 0, published = 0;
    for (int op = 0; op < 600; ++op) {
      const int kind = static_cast<int>(rng() % 8);
      if (kind <= 2 && live.size() < 4) {  // a new request: prefix choice x suffix
        const uint64_t salt = rng() % 2;
        const auto want = Concat(Tokens(16 * (1 + static_cast<int>(rng() % 3)), static_cast<int>(rng() % 2)),
                                 Tokens(1 + static_cast<int>(rng() % 40), 100 + static_cast<int>(rng() % 1000)));
        auto match = cache.Lookup(salt, want, static_cast<int>(want.size()) - 1);
        SeqId seq;
        RadixCache::NodeId locked = RadixCache::kNoNode;
        if (match.blocks > 0) {
          auto f = cache.ForkMatch(match);
          if (!f.ok()) continue;
          seq = *f;
          locked = match.deepest;
          ++hits;
          EXPECT_EQ(m->tokens(seq), std::vector<int32_t>(want.begin(), want.begin() + match.tokens));
        } else {
          seq = m->AddSequence(salt);
        }
        live.push_back({seq, locked, want});
      } else if (kind >= 5 && !live.empty()) {  // a step of one sequence
        Live& l = live[rng() % live.size()];
        const int have = m->length(l.seq);
        if (have < static_cast<int>(l.want.size())) {
          const int n = std::min<int>(static_cast<int>(l.want.size()) - have, 1 + static_cast<int>(rng() % 20));
          Status s = Feed(*m, l.seq, std::vector<int32_t>(l.want.begin() + have, l.want.begin() + have + n));
          if (s.code() == StatusCode::kResourceExhausted) cache.Evict(1 << 16);
          if (s.ok() && rng() % 2 == 0) {  // shares its committed blocks while it runs
            const RadixCache::NodeId deepest = cache.InsertPrefix(l.seq, m->length(l.seq) / T);
            if (deepest != RadixCache::kNoNode && deepest != l.locked) {
              cache.Lock(deepest);
              if (l.locked != RadixCache::kNoNode) cache.Unlock(l.locked);
              l.locked = deepest;
              ++published;
            }
          }
        }
      } else if (kind == 3 && !live.empty()) {  // a sequence ends: into the cache
        const size_t i = rng() % live.size();
        if (live[i].locked != RadixCache::kNoNode) cache.Unlock(live[i].locked);
        cache.Insert(live[i].seq);
        live.erase(live.begin() + static_cast<long>(i));
      } else if (kind == 4) {
        cache.Evict(static_cast<uint64_t>(rng() % 10000));  // ~0-2 blocks
      }
      ASSERT_TRUE(m->CheckInvariants().ok()) << "op " << op << ": " << m->CheckInvariants().ToString();
      ASSERT_TRUE(cache.CheckInvariants().ok()) << "op " << op << ": " << cache.CheckInvariants().ToString();
    }
    EXPECT_GT(hits, 10);
    EXPECT_GT(published, 10);
    for (Live& l : live) {
      if (l.locked != RadixCache::kNoNode) cache.Unlock(l.locked);
      m->ReleaseSequence(l.seq);
    }
    cache.Clear();
    EXPECT_EQ(m->num_sequences(), 0);
    EXPECT_EQ(m->BytesInUse(), 0u);
    EXPECT_OK_INVARIANTS(*m, cache);
  }
}

}  // namespace
}  // namespace kvx::kv
