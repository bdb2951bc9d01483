// SequenceKV with quantized codecs: staging and sealing of pages, residual
// windows and sink pages, exact byte accounting over pool size classes,
// all-or-nothing appends under budget pressure, forks with copy-on-write.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "kv/codec/codecs.h"
#include "kv/kv_test_util.h"
#include "kv/sequence_kv.h"
#include "util/fp16.h"

namespace kvx::kv {
namespace {

using testing::Codec;
using testing::PageOf;
using testing::PoolFor;

struct Tokens {
  std::vector<int32_t> pos;
  std::vector<float> k, v;
};

// n tokens [n][heads][dim], small values (exact in f16) that encode
// (token, head, channel) so staging pages read back exactly.
Tokens MakeTokens(int first, int n, int heads, int dim) {
  Tokens t;
  for (int i = 0; i < n; ++i) {
    t.pos.push_back(first + i);
    for (int h = 0; h < heads; ++h) {
      for (int c = 0; c < dim; ++c) {
        t.k.push_back(static_cast<float>(((first + i) * 7 + h * 3 + c) % 64) / 8.0f - 4.0f);
        t.v.push_back(static_cast<float>(((first + i) * 5 + h + c * 3) % 64) / 8.0f - 4.0f);
      }
    }
  }
  return t;
}

// Page formats and bytes match LayerCodec::IsFullPage / BytesForContext.
void CheckLayout(const SequenceKV& kv, const BlockPool& pool) {
  const KVLayout& L = kv.layout();
  for (int l = 0; l < L.n_layers; ++l) {
    const LayerCodec& lc = kv.layer_codec(l);
    for (int h = 0; h < L.n_kv_heads; ++h) {
      const PageTable& t = kv.table(l, h);
      for (int p = 0; p < t.num_pages(); ++p) {
        ASSERT_EQ(t.is_full(p), lc.IsFullPage(p, t.length())) << "layer " << l << " page " << p << " of " << t.length();
        ASSERT_EQ(pool.PageBytesOf(t.pages()[p]), AlignUp(lc.PageBytes(t.is_full(p)), kPageAlign));
      }
    }
  }
}

class SealingTest : public ::testing::TestWithParam<const char*> {};

TEST_P(SealingTest, FormatsBytesAndReadBack) {
  const char* spec = GetParam();
  const CodecConfig cc = Codec(spec);
  const KVLayout layout{2, 2, 16, PageOf(spec)};
  const int n_ctx = 150;
  auto pool = PoolFor(layout, cc, n_ctx);
  ASSERT_NE(pool, nullptr);
  SequenceKV kv(pool.get(), layout, cc);
  std::mt19937 rng(4);
  int len = 0;
  while (len < n_ctx) {
    const int n = std::min(n_ctx - len, static_cast<int>(rng() % 23));
    Tokens t = MakeTokens(len, n, 2, 16);
    for (int l = 0; l < 2; ++l) ASSERT_TRUE(kv.Append(l, n, t.pos.data(), t.k.data(), t.v.data()).ok()) << len;
    len += n;
    CheckLayout(kv, *pool);
    // Appends sized by BudgetForContext never run out, and the pool holds
    // exactly the bytes BytesForContext predicts.
    EXPECT_EQ(pool->bytes_in_use(), BytesForContext(layout, cc, len));
    EXPECT_EQ(kv.BytesInUse(), pool->bytes_in_use());
    EXPECT_INVARIANTS(*pool);
  }
  // Entries in f16 pages (sinks, residual window) read back exactly; sealed
  // entries within the codec's error.
  const Tokens all = MakeTokens(0, n_ctx, 2, 16);
  const LayerCodec& lc = kv.layer_codec(1);
  std::vector<float> k(16), v(16);
  double max_err = 0;
  for (int h = 0; h < 2; ++h) {
    for (int i = 0; i < n_ctx; ++i) {
      int32_t pos = -1;
      kv.ReadEntry(1, h, i, k.data(), v.data(), &pos);
      ASSERT_EQ(pos, i);
      const bool full = kv.table(1, h).is_full(i / layout.page_tokens);
      for (int c = 0; c < 16; ++c) {
        const size_t at = (static_cast<size_t>(i) * 2 + h) * 16 + c;
        if (full && cc.rotation == Rotation::kNone) {
          ASSERT_EQ(k[c], all.k[at]) << i;
          ASSERT_EQ(v[c], all.v[at]) << i;
        }
        max_err = std::max({max_err, std::fabs(k[c] - static_cast<double>(all.k[at])),
                            std::fabs(v[c] - static_cast<double>(all.v[at]))});
      }
    }
  }
  // Values span [-4, 4): a group's step is at most 8 / (2^b - 1); the
  // rotation can widen a row's range (its error spreads over the channels).
  const double rot = cc.rotation != Rotation::kNone ? 2.0 : 1.0;
  const double bound =
      IsQuantized(lc.id) ? rot * 8.0 / ((1 << std::min(lc.params.k_bits, lc.params.v_bits)) - 1) : 1e-2;
  EXPECT_LE(max_err, bound) << spec;
  if (lc.sealed) {  // the residual window and the sinks really are f16
    const PageTable& t = kv.table(1, 0);
    EXPECT_TRUE(t.is_full(t.num_pages() - 1));
    if (lc.sink_pages > 0) {
      EXPECT_TRUE(t.is_full(0));
    }
    EXPECT_FALSE(t.is_full(lc.sink_pages));
  }
  kv.Clear();
  EXPECT_EQ(pool->bytes_in_use(), 0u);
  EXPECT_INVARIANTS(*pool);
}

// Appends that write the kv heads on a thread pool leave the same pages
// (ids, formats, bytes) as appends on the caller: growing, sealing,
// copy-on-write after a fork, and the replaced pages freed.
TEST_P(SealingTest, ThreadedAppendWritesTheSameBytes) {
  const char* spec = GetParam();
  const CodecConfig cc = Codec(spec);
  const KVLayout layout{1, 3, 16, PageOf(spec)};
  const int n_ctx = 120;
  auto pool_a = PoolFor(layout, cc, 2 * n_ctx), pool_b = PoolFor(layout, cc, 2 * n_ctx);
  ASSERT_NE(pool_a, nullptr);
  ASSERT_NE(pool_b, nullptr);
  SequenceKV a(pool_a.get(), layout, cc), b(pool_b.get(), layout, cc);
  std::unique_ptr<SequenceKV> fork_a, fork_b;
  ThreadPool threads(2);
  std::mt19937 rng(9);
  auto same = [&](const SequenceKV& x, const BlockPool& px, const SequenceKV& y, const BlockPool& py) {
    for (int h = 0; h < 3; ++h) {
      const PageTable &tx = x.table(0, h), &ty = y.table(0, h);
      ASSERT_EQ(tx.length(), ty.length());
      ASSERT_EQ(tx.pages(), ty.pages()) << h;
      for (int p = 0; p < tx.num_pages(); ++p) {
        ASSERT_EQ(tx.is_full(p), ty.is_full(p));
        const size_t bytes = px.PageBytesOf(tx.pages()[p]);
        ASSERT_EQ(0, std::memcmp(px.PageData(tx.pages()[p]), py.PageData(ty.pages()[p]), bytes)) << h << " " << p;
      }
    }
    ASSERT_EQ(px.bytes_in_use(), py.bytes_in_use());
  };
  int len = 0;
  while (len < n_ctx) {
    const int n = std::min(n_ctx - len, 1 + static_cast<int>(rng() % 40));
    const Tokens t = MakeTokens(len, n, 3, 16);
    ASSERT_TRUE(a.Append(0, n, t.pos.data(), t.k.data(), t.v.data(), &threads).ok());
    ASSERT_TRUE(b.Append(0, n, t.pos.data(), t.k.data(), t.v.data()).ok());
    len += n;
    same(a, *pool_a, b, *pool_b);
    if (fork_a == nullptr && len > n_ctx / 2) {  // later appends copy the shared last pages
      fork_a = a.Fork();
      fork_b = b.Fork();
    }
  }
  EXPECT_INVARIANTS(*pool_a);
  EXPECT_INVARIANTS(*pool_b);
}

// A batched append (every sequence's rows, the (sequence, head) writes in one
// parallel loop) stores what one Append per sequence does: the same page
// formats and sizes, the same entries read back, for sequences of different
// lengths, some with no rows, growing, sealing, copy-on-write after a fork.
// (Page ids differ, and so do the unused bytes of recycled pages: one append
// per sequence frees a sealed sequence's staging pages before the next plans.)
TEST_P(SealingTest, BatchedAppendWritesWhatOneAppendPerSequenceDoes) {
  const char* spec = GetParam();
  const CodecConfig cc = Codec(spec);
  const KVLayout layout{1, 3, 16, PageOf(spec)};
  constexpr int kSeqs = 4;
  const int n_ctx = 90;
  auto pool_a = PoolFor(layout, cc, 2 * kSeqs * n_ctx), pool_b = PoolFor(layout, cc, 2 * kSeqs * n_ctx);
  ASSERT_NE(pool_a, nullptr);
  ASSERT_NE(pool_b, nullptr);
  std::vector<std::unique_ptr<SequenceKV>> a, b;
  for (int q = 0; q < kSeqs; ++q) {
    a.push_back(std::make_unique<SequenceKV>(pool_a.get(), layout, cc));
    b.push_back(std::make_unique<SequenceKV>(pool_b.get(), layout, cc));
  }
  ThreadPool threads(2);
  std::mt19937 rng(11);
  std::vector<int> len(kSeqs, 0);
  std::vector<float> ka(16), va(16), kb(16), vb(16);
  int32_t pos_a = 0, pos_b = 0;
  for (int round = 0; round < 24; ++round) {
    std::vector<Tokens> rows(kSeqs);
    std::vector<SequenceKV::AppendRows> batch;
    for (int q = 0; q < kSeqs; ++q) {
      const int n = std::min(n_ctx - len[q], static_cast<int>(rng() % 9));  // 0..8 rows (decode, short chunks)
      rows[q] = MakeTokens(len[q], n, 3, 16);
      batch.push_back({a[q].get(), n, rows[q].pos.data(), rows[q].k.data(), rows[q].v.data()});
      ASSERT_TRUE(b[q]->Append(0, n, rows[q].pos.data(), rows[q].k.data(), rows[q].v.data()).ok());
      len[q] += n;
    }
    ASSERT_TRUE(SequenceKV::AppendBatch(0, batch, &threads).ok());
    for (int q = 0; q < kSeqs; ++q) {
      for (int h = 0; h < 3; ++h) {
        const PageTable &ta = a[q]->table(0, h), &tb = b[q]->table(0, h);
        ASSERT_EQ(ta.length(), len[q]);
        ASSERT_EQ(ta.length(), tb.length());
        ASSERT_EQ(ta.num_pages(), tb.num_pages());
        for (int p = 0; p < ta.num_pages(); ++p) {
          ASSERT_EQ(ta.is_full(p), tb.is_full(p));
          ASSERT_EQ(pool_a->PageBytesOf(ta.pages()[p]), pool_b->PageBytesOf(tb.pages()[p]));
        }
        for (int e = 0; e < ta.length(); ++e) {
          a[q]->ReadEntry(0, h, e, ka.data(), va.data(), &pos_a);
          b[q]->ReadEntry(0, h, e, kb.data(), vb.data(), &pos_b);
          ASSERT_EQ(pos_a, pos_b);
          ASSERT_EQ(ka, kb) << "round " << round << " seq " << q << " head " << h << " entry " << e;
          ASSERT_EQ(va, vb) << "round " << round << " seq " << q << " head " << h << " entry " << e;
        }
      }
    }
    ASSERT_EQ(pool_a->bytes_in_use(), pool_b->bytes_in_use());
    if (round == 10) {  // sequence 3 continues a fork of sequence 0: later appends copy the shared last pages
      a[3] = a[0]->Fork();
      b[3] = b[0]->Fork();
      len[3] = len[0];
    }
  }
  EXPECT_INVARIANTS(*pool_a);
  EXPECT_INVARIANTS(*pool_b);
}

TEST(BatchedAppendTest, ABadItemWritesNoItem) {
  const KVLayout layout{1, 2, 16, 16};
  const CodecConfig cc = Codec("codec=f16");
  auto pool = PoolFor(layout, cc, 64);
  ASSERT_NE(pool, nullptr);
  SequenceKV x(pool.get(), layout, cc), y(pool.get(), layout, cc);
  Tokens good = MakeTokens(0, 3, 2, 16), bad = MakeTokens(0, 2, 2, 16);
  bad.pos[1] = kDeadPosition;
  const SequenceKV::AppendRows batch[] = {{&x, 3, good.pos.data(), good.k.data(), good.v.data()},
                                          {&y, 2, bad.pos.data(), bad.k.data(), bad.v.data()}};
  ThreadPool threads(2);
  const Status s = SequenceKV::AppendBatch(0, batch, &threads);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("marks dead slots"), std::string::npos) << s.message();
  EXPECT_EQ(x.Length(0, 0), 0);
  EXPECT_EQ(y.Length(0, 1), 0);
  x.CancelReservation();
  EXPECT_EQ(pool->pages_in_use(), 0);
  EXPECT_INVARIANTS(*pool);
}

INSTANTIATE_TEST_SUITE_P(Specs, SealingTest,
                         ::testing::Values("codec=f16", "codec=int4", "codec=int8,sinks=5", "codec=int4,residual=9",
                                           "codec=kivi2,page=8", "codec=kivi4,page=4,residual=13,sinks=6",
                                           "codec=int2,outliers=0.03", "codec=kivi2,page=16,bits.1=k16v16",
                                           "codec=int4,page=4,residual=4,rotate=hadamard"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& ch : s) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return s;
                         });

TEST(SealingTest2, PageSizesAndSizeClasses) {
  const KVLayout layout{3, 2, 64, 32};
  const CodecConfig cc = Codec("codec=kivi2,page=32,group=64,bits.1=k4v4,bits.2=k16v16");
  const std::vector<LayerCodec> layers = ResolveLayers(layout, cc);
  EXPECT_EQ(layers[0].id, CodecId::kKivi2);
  EXPECT_EQ(layers[1].params.k_bits, 4);
  EXPECT_EQ(layers[2].id, CodecId::kF16);  // k16v16: full precision, never sealed
  EXPECT_FALSE(layers[2].sealed);
  EXPECT_TRUE(layers[0].sealed);
  EXPECT_LT(layers[0].packed_page_bytes, layers[1].packed_page_bytes);
  EXPECT_LT(layers[1].packed_page_bytes, layers[0].full_page_bytes);
  EXPECT_EQ(PageBytes(layout, cc), layers[0].full_page_bytes);
  // Asymptotic bytes per token: packed pages of every layer.
  EXPECT_EQ(BytesPerToken(layout, cc),
            (2 * (layers[0].packed_page_bytes + layers[1].packed_page_bytes + layers[2].packed_page_bytes) + 31) / 32);
  auto pool = PoolFor(layout, cc, 100);
  SequenceKV kv(pool.get(), layout, cc);
  Tokens t = MakeTokens(0, 100, 2, 64);
  for (int l = 0; l < 3; ++l) ASSERT_TRUE(kv.Append(l, 100, t.pos.data(), t.k.data(), t.v.data()).ok());
  EXPECT_EQ(pool->num_size_classes(), 3);  // f16 (staging + layer 2), kivi2, kivi k4v4
  EXPECT_EQ(pool->bytes_in_use(), BytesForContext(layout, cc, 100));
  EXPECT_INVARIANTS(*pool);
}

TEST(SealingTest2, ExhaustionWhileSealingLeavesStateUnchanged) {
  const KVLayout layout{1, 2, 16, 8};
  const CodecConfig cc = Codec("codec=kivi2,page=8,residual=8");
  // Room for 24 tokens exactly (no transient margin): sealing must allocate
  // its packed page before the staging page is freed, so the 25th..40th fail.
  auto r = BlockPool::Create({.budget_bytes = BytesForContext(layout, cc, 24), .page_bytes = PageBytes(layout, cc)});
  ASSERT_TRUE(r.ok());
  BlockPool& pool = **r;
  SequenceKV kv(&pool, layout, cc);
  Tokens a = MakeTokens(0, 24, 2, 16);
  ASSERT_TRUE(kv.Append(0, 24, a.pos.data(), a.k.data(), a.v.data()).ok());
  const uint64_t bytes = pool.bytes_in_use();
  std::vector<PageId> pages = kv.table(0, 1).pages();
  Tokens b = MakeTokens(24, 16, 2, 16);
  Status s = kv.Append(0, 16, b.pos.data(), b.k.data(), b.v.data());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(kv.Length(0, 0), 24);
  EXPECT_EQ(kv.Length(0, 1), 24);
  EXPECT_EQ(kv.table(0, 1).pages(), pages);
  EXPECT_EQ(pool.bytes_in_use(), bytes);
  EXPECT_INVARIANTS(pool);
  CheckLayout(kv, pool);
  std::vector<float> k(16), v(16);
  int32_t pos;
  kv.ReadEntry(0, 1, 23, k.data(), v.data(), &pos);
  EXPECT_EQ(pos, 23);
  EXPECT_EQ(k[5], a.k[(23 * 2 + 1) * 16 + 5]);  // still in the f16 residual window
}

TEST(SealingTest2, ForkSharesSealedPagesAndCopiesStagingOnWrite) {
  const KVLayout layout{1, 1, 16, 4};
  const CodecConfig cc = Codec("codec=kivi4,page=4,residual=4");
  auto pool = PoolFor(layout, cc, 64, 16);
  SequenceKV a(pool.get(), layout, cc);
  Tokens t = MakeTokens(0, 14, 1, 16);
  ASSERT_TRUE(a.Append(0, 14, t.pos.data(), t.k.data(), t.v.data()).ok());
  auto b = a.Fork();
  const int64_t shared_pages = pool->pages_in_use();
  // b fills its partially filled staging page: a copy; later pages seal.
  Tokens tb = MakeTokens(1000, 9, 1, 16);
  ASSERT_TRUE(b->Append(0, 9, tb.pos.data(), tb.k.data(), tb.v.data()).ok());
  EXPECT_EQ(a.table(0, 0).pages()[0], b->table(0, 0).pages()[0]);  // sealed page still shared
  EXPECT_NE(a.table(0, 0).pages()[3], b->table(0, 0).pages()[3]);
  EXPECT_GT(pool->pages_in_use(), shared_pages);
  CheckLayout(a, *pool);
  CheckLayout(*b, *pool);
  std::vector<float> k(16), v(16);
  int32_t pos;
  a.ReadEntry(0, 0, 13, k.data(), v.data(), &pos);
  EXPECT_EQ(pos, 13);
  EXPECT_EQ(k[2], t.k[13 * 16 + 2]);
  b->ReadEntry(0, 0, 14, k.data(), v.data(), &pos);
  EXPECT_EQ(pos, 1000);
  b->ReadEntry(0, 0, 13, k.data(), v.data(), &pos);  // sealed now in b, f16 in a
  EXPECT_EQ(pos, 13);
  EXPECT_NEAR(k[2], t.k[13 * 16 + 2], 0.6);
  b.reset();
  a.Clear();
  EXPECT_EQ(pool->pages_in_use(), 0);
  EXPECT_INVARIANTS(*pool);
}

TEST(SealingTest2, RowWiseCodecWritesPackedPagesDirectly) {
  const KVLayout layout{1, 1, 16, 8};
  const CodecConfig cc = Codec("codec=int8");
  auto pool = PoolFor(layout, cc, 40, 8);
  SequenceKV kv(pool.get(), layout, cc);
  EXPECT_FALSE(kv.layer_codec(0).sealed);
  Tokens t = MakeTokens(0, 13, 1, 16);
  ASSERT_TRUE(kv.Append(0, 13, t.pos.data(), t.k.data(), t.v.data()).ok());
  EXPECT_EQ(pool->num_size_classes(), 1);  // never staged
  EXPECT_FALSE(kv.table(0, 0).is_full(1));
  auto fork = kv.Fork();
  Tokens u = MakeTokens(13, 2, 1, 16);
  ASSERT_TRUE(fork->Append(0, 2, u.pos.data(), u.k.data(), u.v.data()).ok());  // copy-on-write of a packed page
  EXPECT_NE(kv.table(0, 0).pages()[1], fork->table(0, 0).pages()[1]);
  std::vector<float> k(16), v(16);
  int32_t pos;
  fork->ReadEntry(0, 0, 12, k.data(), v.data(), &pos);
  EXPECT_NEAR(k[4], t.k[12 * 16 + 4], 8.0 / 255);
  EXPECT_INVARIANTS(*pool);
}

TEST(SealingTest2, PreRopePositionsAreChecked) {
  const KVLayout layout{1, 1, 16, 8};
  const CodecConfig cc = Codec("codec=f16,prerope=1");
  auto pool = PoolFor(layout, cc, 16);
  SequenceKV kv(pool.get(), layout, cc);
  EXPECT_TRUE(kv.keys_pre_rope());
  Tokens t = MakeTokens(0, 1, 1, 16);
  t.pos[0] = -3;
  Status s = kv.Append(0, 1, t.pos.data(), t.k.data(), t.v.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(kv.Length(0, 0), 0);
}

}  // namespace
}  // namespace kvx::kv
