#include "kv/sequence_kv.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kv/codec/codecs.h"

namespace kvx::kv {
namespace {

#define EXPECT_INVARIANTS(pool) EXPECT_TRUE((pool).CheckInvariants().ok()) << (pool).CheckInvariants().ToString()

struct Tokens {
  std::vector<int32_t> pos;
  std::vector<float> k, v;
};

// n tokens of [n][heads][dim] with values that encode (token, head, channel).
Tokens MakeTokens(int first_pos, int n, int heads, int dim) {
  Tokens t;
  for (int i = 0; i < n; ++i) {
    t.pos.push_back(first_pos + i);
    for (int h = 0; h < heads; ++h) {
      for (int c = 0; c < dim; ++c) {
        t.k.push_back(static_cast<float>((first_pos + i) * 100 + h * 10 + c));
        t.v.push_back(-static_cast<float>((first_pos + i) * 100 + h * 10 + c));
      }
    }
  }
  return t;
}

std::unique_ptr<BlockPool> MakePool(const KVLayout& layout, CodecId codec, int pages) {
  auto r = BlockPool::Create({.budget_bytes = PageBytes(layout, codec) * static_cast<uint64_t>(pages),
                              .page_bytes = PageBytes(layout, codec)});
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return std::move(r).value();
}

TEST(KVLayoutTest, Validate) {
  EXPECT_TRUE((KVLayout{2, 4, 64, 16}).Validate().ok());
  EXPECT_FALSE((KVLayout{0, 4, 64, 16}).Validate().ok());
  EXPECT_FALSE((KVLayout{2, 0, 64, 16}).Validate().ok());
  EXPECT_FALSE((KVLayout{2, 4, 0, 16}).Validate().ok());
  EXPECT_FALSE((KVLayout{2, 4, 64, 12}).Validate().ok());
  EXPECT_FALSE((KVLayout{2, 4, 64, 512}).Validate().ok());
}

TEST(SequenceKVTest, SizingHelpers) {
  const KVLayout layout{2, 4, 64, 16};
  EXPECT_EQ(PageBytes(layout, CodecId::kF16), 64u + 4096u);
  EXPECT_EQ(BytesPerToken(layout, CodecId::kF16), (64u + 4096u) * 8 / 16);
  EXPECT_EQ(BudgetForContext(layout, CodecId::kF32, 17), 2u * 8 * PageBytes(layout, CodecId::kF32));
  EXPECT_EQ(BudgetForContext(layout, CodecId::kF32, 0), 0u);
}

// Fills a 2048-token cache of `layout` layer after layer as a forward pass
// does (prefill chunks of 256, then token by token) from a pool sized for
// it with extents of `extent_bytes`; returns how often a (layer, head)
// table's next page is not the one right after its previous page.
int TableBreaks(const KVLayout& layout, size_t extent_bytes) {
  const int n_ctx = 2048;
  auto pool = std::move(BlockPool::Create({.budget_bytes = BudgetForContext(layout, CodecId::kF16, n_ctx),
                                           .page_bytes = PageBytes(layout, CodecId::kF16),
                                           .extent_bytes = extent_bytes}))
                  .value();
  SequenceKV kv(pool.get(), layout, CodecId::kF16);
  for (int start = 0; start < n_ctx;) {
    const int n = start < n_ctx / 2 ? 256 : 1;
    const Tokens t = MakeTokens(start, n, layout.n_kv_heads, layout.head_dim);
    for (int l = 0; l < layout.n_layers; ++l) EXPECT_TRUE(kv.Append(l, n, t.pos.data(), t.k.data(), t.v.data()).ok());
    start += n;
  }
  int breaks = 0;
  for (int l = 0; l < layout.n_layers; ++l) {
    for (int h = 0; h < layout.n_kv_heads; ++h) {
      const PageTable& t = kv.table(l, h);
      EXPECT_EQ(t.length(), n_ctx);
      for (int p = 1; p < t.num_pages(); ++p) breaks += t.pages()[p] != t.pages()[p - 1] + 1;
    }
  }
  EXPECT_INVARIANTS(*pool);
  return breaks;
}

// Layers appended in turn still leave each (layer, head) table in runs of
// consecutive pages (block_pool.h, "Locality"), so decode streams through
// memory: runs of half an extent or more with the default extents, and one
// run per table with extents sized by ExtentBytesFor (a table's share of
// the budget), the extents the engine's pools use.
TEST(SequenceKVTest, TablesGrowInContiguousRuns) {
  const KVLayout layout{4, 2, 64, 16};
  const int pages = 8 * 2048 / 16;
  const int per_extent = static_cast<int>(BlockPool::kExtentBytes / PageBytes(layout, CodecId::kF16));
  EXPECT_LE(TableBreaks(layout, BlockPool::kExtentBytes), 2 * pages / per_extent);
  const uint64_t budget = BudgetForContext(layout, CodecId::kF16, 2048);
  EXPECT_EQ(ExtentBytesFor(layout, budget, 1), budget / 8);
  EXPECT_EQ(TableBreaks(layout, ExtentBytesFor(layout, budget, 1)), 0);
  // Extents several times a table's share leave most tables without one.
  EXPECT_GT(TableBreaks(layout, 4 * ExtentBytesFor(layout, budget, 1)), pages / 4);
}

TEST(SequenceKVTest, ExtentBytesForSharesTheBudgetAmongTables) {
  const KVLayout layout{30, 3, 64, 16};
  EXPECT_EQ(ExtentBytesFor(layout, 90u << 20, 1), size_t{1} << 20);
  EXPECT_EQ(ExtentBytesFor(layout, 90u << 20, 4), size_t{1} << 18);  // four sequences
  EXPECT_EQ(ExtentBytesFor(layout, uint64_t{90} << 30, 1), kMaxExtentBytes);
  EXPECT_EQ(ExtentBytesFor(layout, 10, 1), 1u);
}

class SequenceKVCodecTest : public ::testing::TestWithParam<CodecId> {};

TEST_P(SequenceKVCodecTest, AppendAcrossPageBoundariesAndReadBack) {
  const KVLayout layout{2, 3, 8, 4};
  auto pool = MakePool(layout, GetParam(), 64);
  SequenceKV kv(pool.get(), layout, GetParam());
  // Appends of 3, 1, 6, 0 tokens: crosses page boundaries at 4 and 8.
  int total = 0;
  for (int n : {3, 1, 6, 0}) {
    Tokens t = MakeTokens(total, n, 3, 8);
    ASSERT_TRUE(kv.Append(0, n, t.pos.data(), t.k.data(), t.v.data()).ok());
    total += n;
    EXPECT_INVARIANTS(*pool);
  }
  for (int h = 0; h < 3; ++h) {
    EXPECT_EQ(kv.Length(0, h), 10);
    EXPECT_EQ(kv.Length(1, h), 0);
    EXPECT_EQ(kv.table(0, h).num_pages(), 3);
  }
  EXPECT_EQ(pool->pages_in_use(), 9);
  EXPECT_EQ(kv.PagesInUse(), 9);
  EXPECT_EQ(kv.BytesInUse(), 9 * pool->page_bytes());
  std::vector<float> k(8), v(8);
  for (int h = 0; h < 3; ++h) {
    for (int i = 0; i < 10; ++i) {
      int32_t pos = -1;
      kv.ReadEntry(0, h, i, k.data(), v.data(), &pos);
      EXPECT_EQ(pos, i);
      for (int c = 0; c < 8; ++c) {
        const float want = static_cast<float>(i * 100 + h * 10 + c);  // exact in f16 too (< 2048)
        EXPECT_EQ(k[c], want);
        EXPECT_EQ(v[c], -want);
      }
    }
  }
  kv.Clear();
  EXPECT_EQ(pool->pages_in_use(), 0);
  EXPECT_EQ(kv.Length(0, 0), 0);
  EXPECT_INVARIANTS(*pool);
}

INSTANTIATE_TEST_SUITE_P(Codecs, SequenceKVCodecTest, ::testing::Values(CodecId::kF32, CodecId::kF16),
                         [](const auto& info) { return std::string(CodecName(info.param)); });

TEST(SequenceKVTest, LayersHaveIndependentLengthsAndDestructorFrees) {
  const KVLayout layout{3, 2, 4, 2};
  auto pool = MakePool(layout, CodecId::kF32, 32);
  {
    SequenceKV kv(pool.get(), layout, CodecId::kF32);
    Tokens a = MakeTokens(0, 5, 2, 4);
    ASSERT_TRUE(kv.Append(0, 5, a.pos.data(), a.k.data(), a.v.data()).ok());
    ASSERT_TRUE(kv.Append(2, 1, a.pos.data(), a.k.data(), a.v.data()).ok());
    EXPECT_EQ(kv.Length(0, 1), 5);
    EXPECT_EQ(kv.Length(1, 1), 0);
    EXPECT_EQ(kv.Length(2, 0), 1);
    EXPECT_EQ(pool->pages_in_use(), 2 * 3 + 2 * 1);
    EXPECT_INVARIANTS(*pool);
  }
  EXPECT_EQ(pool->pages_in_use(), 0);
  EXPECT_INVARIANTS(*pool);
}

TEST(SequenceKVTest, ExhaustionMidAppendLeavesStateUnchanged) {
  const KVLayout layout{1, 2, 4, 4};
  auto pool = MakePool(layout, CodecId::kF16, 5);
  SequenceKV kv(pool.get(), layout, CodecId::kF16);
  Tokens a = MakeTokens(0, 6, 2, 4);  // 2 pages per head = 4 pages
  ASSERT_TRUE(kv.Append(0, 6, a.pos.data(), a.k.data(), a.v.data()).ok());
  EXPECT_EQ(pool->pages_in_use(), 4);
  // 4 more tokens need one new page per head (2) but only 1 is free.
  Tokens b = MakeTokens(6, 4, 2, 4);
  Status s = kv.Append(0, 4, b.pos.data(), b.k.data(), b.v.data());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("KV budget exhausted"), std::string::npos) << s.message();
  EXPECT_EQ(kv.Length(0, 0), 6);
  EXPECT_EQ(kv.Length(0, 1), 6);
  EXPECT_EQ(pool->pages_in_use(), 4);
  EXPECT_INVARIANTS(*pool);
  // Two tokens still fit in the partially filled pages.
  ASSERT_TRUE(kv.Append(0, 2, b.pos.data(), b.k.data(), b.v.data()).ok());
  EXPECT_EQ(kv.Length(0, 1), 8);
  std::vector<float> k(4), v(4);
  int32_t pos;
  kv.ReadEntry(0, 1, 7, k.data(), v.data(), &pos);
  EXPECT_EQ(pos, 7);
  EXPECT_EQ(k[2], 7 * 100 + 10 + 2);
  EXPECT_INVARIANTS(*pool);
}

TEST(SequenceKVTest, ForkSharesPagesAndCopiesOnWrite) {
  const KVLayout layout{1, 1, 4, 4};
  auto pool = MakePool(layout, CodecId::kF32, 16);
  SequenceKV a(pool.get(), layout, CodecId::kF32);
  Tokens t = MakeTokens(0, 6, 1, 4);
  ASSERT_TRUE(a.Append(0, 6, t.pos.data(), t.k.data(), t.v.data()).ok());
  auto b = a.Fork();
  EXPECT_EQ(pool->pages_in_use(), 2);
  EXPECT_TRUE(pool->IsShared(a.table(0, 0).pages()[0]));
  EXPECT_INVARIANTS(*pool);

  // b appends into the shared, partially filled last page: it gets a copy.
  Tokens tb = MakeTokens(1000, 1, 1, 4);
  ASSERT_TRUE(b->Append(0, 1, tb.pos.data(), tb.k.data(), tb.v.data()).ok());
  EXPECT_EQ(pool->pages_in_use(), 3);
  EXPECT_EQ(a.table(0, 0).pages()[0], b->table(0, 0).pages()[0]);  // full page still shared
  EXPECT_NE(a.table(0, 0).pages()[1], b->table(0, 0).pages()[1]);
  EXPECT_FALSE(pool->IsShared(a.table(0, 0).pages()[1]));
  EXPECT_INVARIANTS(*pool);

  // a appends its own token 6; the two sequences differ only there.
  Tokens ta = MakeTokens(6, 1, 1, 4);
  ASSERT_TRUE(a.Append(0, 1, ta.pos.data(), ta.k.data(), ta.v.data()).ok());
  std::vector<float> k(4), v(4);
  int32_t pos;
  a.ReadEntry(0, 0, 6, k.data(), v.data(), &pos);
  EXPECT_EQ(pos, 6);
  b->ReadEntry(0, 0, 6, k.data(), v.data(), &pos);
  EXPECT_EQ(pos, 1000);
  b->ReadEntry(0, 0, 5, k.data(), v.data(), &pos);
  EXPECT_EQ(pos, 5);
  EXPECT_EQ(k[3], 503.0f);
  b.reset();
  EXPECT_EQ(pool->pages_in_use(), 2);
  EXPECT_FALSE(pool->IsShared(a.table(0, 0).pages()[0]));
  EXPECT_INVARIANTS(*pool);
}

TEST(SequenceKVTest, ManySequencesRandomAppendsAndClears) {
  const KVLayout layout{2, 2, 8, 4};
  auto pool = MakePool(layout, CodecId::kF16, 40);
  std::mt19937 rng(99);
  std::vector<std::unique_ptr<SequenceKV>> seqs;
  for (int i = 0; i < 3; ++i) seqs.push_back(std::make_unique<SequenceKV>(pool.get(), layout, CodecId::kF16));
  for (int step = 0; step < 400; ++step) {
    SequenceKV& kv = *seqs[rng() % seqs.size()];
    const int op = static_cast<int>(rng() % 12);
    if (op == 0) {
      kv.Clear();
    } else if (op == 1) {
      seqs[rng() % seqs.size()] = kv.Fork();
    } else {
      const int n = static_cast<int>(rng() % 7);
      const int layer = static_cast<int>(rng() % 2);
      Tokens t = MakeTokens(kv.Length(layer, 0), n, 2, 8);
      const int before = kv.Length(layer, 0);
      Status s = kv.Append(layer, n, t.pos.data(), t.k.data(), t.v.data());
      if (!s.ok()) {
        EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
        EXPECT_EQ(kv.Length(layer, 0), before);
      } else {
        EXPECT_EQ(kv.Length(layer, 1), before + n);
      }
    }
    int64_t referenced = 0;
    for (auto& s : seqs) referenced += s->PagesInUse();
    // Contents survive forks and copy-on-write: entry i has position i.
    SequenceKV& check = *seqs[rng() % seqs.size()];
    for (int layer = 0; layer < 2; ++layer) {
      for (int h = 0; h < 2; ++h) {
        if (check.Length(layer, h) == 0) continue;
        const int i = static_cast<int>(rng() % check.Length(layer, h));
        std::vector<float> k(8), v(8);
        int32_t pos;
        check.ReadEntry(layer, h, i, k.data(), v.data(), &pos);
        ASSERT_EQ(pos, i);
        EXPECT_NEAR(k[1], i * 100 + h * 10 + 1, 4.0);
      }
    }
    EXPECT_GE(referenced, pool->pages_in_use());
    ASSERT_TRUE(pool->CheckInvariants().ok()) << pool->CheckInvariants().ToString();
  }
  seqs.clear();
  EXPECT_EQ(pool->pages_in_use(), 0);
  EXPECT_INVARIANTS(*pool);
}

}  // namespace
}  // namespace kvx::kv
