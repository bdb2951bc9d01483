// Quest page selection: the bounds bound every live key under appends,
// seals, removals, compaction and forks for every codec; a needle page is
// selected; attention over the selected pages is exactly attention over a
// cache holding only them; with every page selected it is exactly full
// attention.
#include "kv/page_selection.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kv/attention.h"
#include "kv/kv_test_util.h"

namespace kvx::kv {
namespace {

using testing::Codec;
using testing::PageOf;

constexpr int kDim = 32;

// Every live entry's key (as stored: ReadEntry, which undoes a rotation, is
// not used for rotated codecs) lies inside its page's bounds, and a page
// without dead slots has exactly its keys' min and max.
void ExpectBoundsHold(const SequenceKV& kv) {
  const KVLayout& L = kv.layout();
  const int T = L.page_tokens, D = L.head_dim;
  std::vector<float> k(D), v(D);
  for (int l = 0; l < L.n_layers; ++l) {
    for (int h = 0; h < L.n_kv_heads; ++h) {
      const PageTable& t = kv.table(l, h);
      ASSERT_EQ(t.bounds_dim(), D);
      for (int p = 0; p < t.num_pages(); ++p) {
        const float* b = t.bounds(p);
        std::vector<float> lo(D, INFINITY), hi(D, -INFINITY);
        bool all_live = true;
        for (int s = p * T; s < p * T + t.EntriesInPage(p, T); ++s) {
          int32_t pos;
          kv.ReadEntry(l, h, s, k.data(), v.data(), &pos);
          if (pos == kDeadPosition) {
            all_live = false;
            continue;
          }
          for (int c = 0; c < D; ++c) {
            ASSERT_LE(b[c], k[c]) << "layer " << l << " head " << h << " page " << p << " slot " << s;
            ASSERT_GE(b[D + c], k[c]) << "layer " << l << " head " << h << " page " << p << " slot " << s;
            lo[c] = std::min(lo[c], k[c]);
            hi[c] = std::max(hi[c], k[c]);
          }
        }
        if (all_live) {
          for (int c = 0; c < D; ++c) {
            ASSERT_EQ(b[c], lo[c]) << "page " << p << " channel " << c;
            ASSERT_EQ(b[D + c], hi[c]) << "page " << p << " channel " << c;
          }
        }
      }
    }
  }
}

void AppendRandom(SequenceKV& kv, int n, int first_pos, std::mt19937& rng) {
  const KVLayout& L = kv.layout();
  std::normal_distribution<float> nd;
  std::vector<float> k(static_cast<size_t>(n) * L.n_kv_heads * L.head_dim), v(k.size());
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  std::vector<int32_t> pos(n);
  std::iota(pos.begin(), pos.end(), first_pos);
  for (int l = 0; l < L.n_layers; ++l) ASSERT_TRUE(kv.Append(l, n, pos.data(), k.data(), v.data()).ok());
}

class PageBoundsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PageBoundsTest, BoundEveryLiveKeyThroughAppendsRemovalsCompactionAndForks) {
  const std::string spec = GetParam();
  const KVLayout layout{2, 2, kDim, PageOf(spec)};
  const CodecConfig codec = Codec(spec);
  auto pool = testing::PoolFor(layout, codec, 2048, 64);
  ASSERT_NE(pool, nullptr);
  SequenceKV kv(pool.get(), layout, codec);
  std::mt19937 rng(7);
  AppendRandom(kv, 100, 0, rng);  // before selection: bounds computed from the pages when it is turned on
  PageSelection sel;
  sel.enabled = true;
  ASSERT_TRUE(kv.SetPageSelection(sel).ok());
  {
    SCOPED_TRACE("turned on");
    ExpectBoundsHold(kv);
  }
  int next = 100;
  for (int i = 0; i < 37; ++i) AppendRandom(kv, 1, next++, rng);  // decode steps: seals, new pages
  AppendRandom(kv, 90, next, rng);                               // a chunk
  next += 90;
  {
    SCOPED_TRACE("appended");
    ExpectBoundsHold(kv);
  }
  // Remove entries from the middle (some whole pages), then compact.
  for (int h = 0; h < 2; ++h) {
    std::vector<int> drop;
    for (int s = 0; s < kv.Length(1, h) - 40; ++s) {
      if (rng() % 3 != 0) drop.push_back(s);
    }
    ASSERT_TRUE(kv.RemoveEntries(1, h, drop).ok());
  }
  {
    SCOPED_TRACE("removed");
    ExpectBoundsHold(kv);
  }
  for (int h = 0; h < 2; ++h) ASSERT_TRUE(kv.Compact(1, h).ok());
  {
    SCOPED_TRACE("compacted");
    ExpectBoundsHold(kv);
  }
  // Forks (copy-on-write of the shared last page) and prefix forks.
  std::unique_ptr<SequenceKV> fork = kv.Fork();
  EXPECT_EQ(fork->page_selection(), sel);
  AppendRandom(*fork, 5, next, rng);
  {
    SCOPED_TRACE("fork");
    ExpectBoundsHold(*fork);
    ExpectBoundsHold(kv);
  }
  auto prefix = kv.ForkPrefix(std::min(kv.Length(0, 0), 77));
  ASSERT_TRUE(prefix.ok());
  {
    SCOPED_TRACE("prefix fork");
    ExpectBoundsHold(**prefix);
    AppendRandom(**prefix, 20, next, rng);
    ExpectBoundsHold(**prefix);
  }
  EXPECT_TRUE(kv.CheckTables().ok());
  EXPECT_INVARIANTS(*pool);
  EXPECT_GT(kv.PageBoundsBytes(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Codecs, PageBoundsTest,
                         ::testing::Values("codec=f32,page=16", "codec=f16,page=16", "codec=int8,page=16",
                                           "codec=int4,page=16,sinks=16", "codec=int2,page=8",
                                           "codec=kivi4,page=32,residual=32", "codec=kivi2,page=16,residual=16"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return n;
                         });

TEST(PageSelectionTest, PreRopeIsRejected) {
  const KVLayout layout{1, 1, kDim, 16};
  const CodecConfig codec = Codec("codec=f16,prerope=1");
  auto pool = testing::PoolFor(layout, codec, 64);
  SequenceKV kv(pool.get(), layout, codec);
  PageSelection sel;
  sel.enabled = true;
  const Status s = kv.SetPageSelection(sel);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("prerope"), std::string::npos);
}

// A cache of n_pages full pages of small random keys in one layer, one kv
// head and a group of G query heads, with a "needle" page whose one key
// points along the query: the needle page must be among the top pages.
struct NeedleCase {
  std::unique_ptr<BlockPool> pool;
  std::unique_ptr<SequenceKV> kv;
  std::vector<float> k, v, q;
  int needle_page;
};

NeedleCase MakeNeedle(const std::string& spec, int n_pages, int needle_page, int G, uint32_t seed) {
  NeedleCase c;
  const KVLayout layout{1, 1, kDim, PageOf(spec)};
  const int T = layout.page_tokens, n = n_pages * T;
  const CodecConfig codec = Codec(spec);
  c.pool = testing::PoolFor(layout, codec, n + T);
  c.kv = std::make_unique<SequenceKV>(c.pool.get(), layout, codec);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.3f);
  c.q.resize(static_cast<size_t>(G) * kDim);
  for (auto& x : c.q) x = nd(rng) * 3;
  c.k.resize(static_cast<size_t>(n) * kDim);
  c.v.resize(c.k.size());
  for (auto& x : c.k) x = nd(rng);
  for (auto& x : c.v) x = nd(rng);
  // The needle: one key = 4 * (query head 1's direction).
  float norm = 0;
  for (int ch = 0; ch < kDim; ++ch) norm += c.q[kDim + ch] * c.q[kDim + ch];
  const int at = needle_page * T + T / 2;
  for (int ch = 0; ch < kDim; ++ch) c.k[static_cast<size_t>(at) * kDim + ch] = 4 * c.q[kDim + ch] / std::sqrt(norm);
  std::vector<int32_t> pos(n);
  std::iota(pos.begin(), pos.end(), 0);
  EXPECT_TRUE(c.kv->Append(0, n, pos.data(), c.k.data(), c.v.data()).ok());
  c.needle_page = needle_page;
  return c;
}

TEST(PageSelectionTest, NeedlePageIsInTheTopK) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    const int n_pages = 40, G = 4, needle = 3 + static_cast<int>(seed * 7 % 30);
    NeedleCase c = MakeNeedle("codec=f16,page=16", n_pages, needle, G, seed);
    PageSelection sel;
    sel.enabled = true;
    sel.pages = 4;
    sel.dense_layers = 0;
    ASSERT_TRUE(c.kv->SetPageSelection(sel).ok());
    std::vector<int> chosen;
    SelectPages(c.kv->table(0, 0), sel, 16, c.q.data(), G, kDim, &chosen);
    ASSERT_EQ(chosen.size(), 4u);
    EXPECT_EQ(chosen.front(), 0) << "the sink page is always read";
    EXPECT_EQ(chosen.back(), n_pages - 1) << "the newest page is always read";
    EXPECT_NE(std::find(chosen.begin(), chosen.end(), needle), chosen.end()) << "seed " << seed << " needle " << needle;
  }
}

// Attention with selection equals attention over a cache that holds only
// the selected pages' entries (the same pages, bit for bit).
TEST(PageSelectionTest, AttentionReadsExactlyTheSelectedPages) {
  for (const std::string spec : {"codec=f16,page=16", "codec=int8,page=16", "codec=kivi4,page=16,residual=0"}) {
    SCOPED_TRACE(spec);
    const int n_pages = 40, G = 4, T = 16;
    NeedleCase c = MakeNeedle(spec, n_pages, 17, G, 3);
    PageSelection sel;
    sel.enabled = true;
    sel.pages = 6;
    sel.dense_layers = 0;
    ASSERT_TRUE(c.kv->SetPageSelection(sel).ok());
    std::vector<int> chosen;
    SelectPages(c.kv->table(0, 0), sel, T, c.q.data(), G, kDim, &chosen);
    ASSERT_EQ(chosen.size(), 6u);
    // The same entries in a fresh cache, page by page.
    const KVLayout layout{1, 1, kDim, T};
    const CodecConfig codec = Codec(spec);
    auto pool2 = testing::PoolFor(layout, codec, n_pages * T);
    SequenceKV only(pool2.get(), layout, codec);
    for (int p : chosen) {
      std::vector<int32_t> pos(T);
      std::iota(pos.begin(), pos.end(), p * T);
      const size_t off = static_cast<size_t>(p) * T * kDim;
      ASSERT_TRUE(only.Append(0, T, pos.data(), &c.k[off], &c.v[off]).ok());
    }
    const int32_t q_pos = n_pages * T;
    const float scale = 1.0f / std::sqrt(static_cast<float>(kDim));
    std::vector<float> out_sel(c.q.size()), out_only(c.q.size()), out_full(c.q.size());
    Attention(*c.kv, 0, c.q.data(), &q_pos, 1, G, scale, out_sel.data(), nullptr);
    Attention(only, 0, c.q.data(), &q_pos, 1, G, scale, out_only.data(), nullptr);
    EXPECT_EQ(out_sel, out_only);
    // And it is not full attention (which reads the other 34 pages too).
    PageSelection off;
    ASSERT_TRUE(c.kv->SetPageSelection(off).ok());
    Attention(*c.kv, 0, c.q.data(), &q_pos, 1, G, scale, out_full.data(), nullptr);
    EXPECT_NE(out_sel, out_full);
  }
}

// With a budget covering every page, the selection path gives exactly the
// full attention, for every codec, over several context chunks, on 1 and 2
// threads; prompts (several queries) attend densely whatever the budget.
TEST(PageSelectionTest, AllPagesSelectedEqualsFullAttentionExactly) {
  ThreadPool threads(2);
  for (const std::string spec : {"codec=f32,page=16", "codec=f16,page=16", "codec=int8,page=16", "codec=int4,page=32",
                                 "codec=kivi2,page=32,residual=32", "codec=f16,page=16,rotate=hadamard"}) {
    SCOPED_TRACE(spec);
    const KVLayout layout{3, 2, kDim, PageOf(spec)};
    const CodecConfig codec = Codec(spec);
    auto pool = testing::PoolFor(layout, codec, 3000);
    SequenceKV kv(pool.get(), layout, codec);
    std::mt19937 rng(11);
    AppendRandom(kv, 2900, 0, rng);
    const int G = 3, n_heads = 2 * G;
    std::normal_distribution<float> nd;
    std::vector<float> q(static_cast<size_t>(4) * n_heads * kDim);
    for (auto& x : q) x = nd(rng);
    const std::vector<int32_t> q_pos = {3000, 3001, 3002, 3003};
    for (int n_q : {1, 4}) {
      for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &threads}) {
        std::vector<float> full(static_cast<size_t>(n_q) * n_heads * kDim), quest(full.size()), few(full.size());
        ASSERT_TRUE(kv.SetPageSelection(PageSelection{}).ok());
        Attention(kv, 2, q.data(), q_pos.data(), n_q, n_heads, 0.2f, full.data(), tp);
        PageSelection sel;
        sel.enabled = true;
        sel.pages = 1000;
        sel.dense_layers = 0;
        ASSERT_TRUE(kv.SetPageSelection(sel).ok());
        Attention(kv, 2, q.data(), q_pos.data(), n_q, n_heads, 0.2f, quest.data(), tp);
        EXPECT_EQ(quest, full) << "n_q " << n_q;
        sel.pages = 8;
        ASSERT_TRUE(kv.SetPageSelection(sel).ok());
        Attention(kv, 2, q.data(), q_pos.data(), n_q, n_heads, 0.2f, few.data(), tp);
        if (n_q > 1) {
          EXPECT_EQ(few, full) << "a prompt attends densely";
        } else {
          EXPECT_NE(few, full) << "8 pages of " << kv.table(2, 0).num_pages() << " differ from all";
        }
        // Layers before dense_layers attend densely.
        sel.dense_layers = 3;
        ASSERT_TRUE(kv.SetPageSelection(sel).ok());
        Attention(kv, 2, q.data(), q_pos.data(), n_q, n_heads, 0.2f, few.data(), tp);
        EXPECT_EQ(few, full);
      }
    }
  }
}

// The vectorized scorer equals the scalar PageUpperBound bit for bit when
// every product and partial sum is exact (small multiples of 1/8: any
// summation order gives the same float), close otherwise; for 1..9 query
// rows (groups of 4 and their remainders), page runs with empty pages.
TEST(PageSelectionTest, VectorizedBoundsEqualTheScalarOnes) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> small(-16, 16);
  std::normal_distribution<float> nd;
  for (int D : {8, 32, 64, 128}) {
    for (int rows = 1; rows <= 9; ++rows) {
      const int n_pages = 37;
      std::vector<float> bounds(static_cast<size_t>(n_pages) * 2 * D), q(static_cast<size_t>(rows) * D);
      for (int exact = 1; exact >= 0; --exact) {
        auto value = [&] { return exact ? small(rng) / 8.0f : nd(rng); };
        for (int p = 0; p < n_pages; ++p) {
          float* b = &bounds[static_cast<size_t>(p) * 2 * D];
          for (int c = 0; c < D; ++c) {
            const float x = value(), y = value();
            b[c] = std::min(x, y);
            b[D + c] = std::max(x, y);
          }
          if (p % 11 == 5) {  // empty bounds
            std::fill(b, b + D, INFINITY);
            std::fill(b + D, b + 2 * D, -INFINITY);
          }
        }
        for (auto& x : q) x = value();
        std::vector<float> fast(n_pages);
        PageUpperBounds(bounds.data(), n_pages, D, q.data(), rows, fast.data());
        for (int p = 0; p < n_pages; ++p) {
          const float ref = PageUpperBound(&bounds[static_cast<size_t>(p) * 2 * D], D, q.data(), rows);
          if (exact || std::isinf(ref)) {
            ASSERT_EQ(fast[p], ref) << "D " << D << " rows " << rows << " page " << p;
          } else {
            ASSERT_NEAR(fast[p], ref, 1e-4f * (1.0f + std::abs(ref))) << "D " << D << " rows " << rows << " page " << p;
          }
        }
      }
    }
  }
}

// One (layer, kv head) of 16-token pages under `spec`, room for `tokens`,
// with `sel` turned on.
struct OneTable {
  OneTable(const std::string& spec, int tokens, const PageSelection& sel)
      : codec(Codec(spec)), pool(testing::PoolFor(layout, codec, tokens)), kv(pool.get(), layout, codec) {
    EXPECT_TRUE(kv.SetPageSelection(sel).ok());
  }
  const KVLayout layout{1, 1, kDim, 16};
  const CodecConfig codec;
  std::unique_ptr<BlockPool> pool;
  SequenceKV kv;
};

PageSelection Selection(int pages, int sink_pages, int recent_pages) {
  return {.enabled = true, .pages = pages, .sink_pages = sink_pages, .recent_pages = recent_pages};
}

// SelectedPageCount, which lays out the attention items before any page is
// picked, is the number of pages SelectPages picks.
TEST(PageSelectionTest, SelectedPageCountIsWhatSelectPagesPicks) {
  const PageSelection on = Selection(1, 0, 1);
  OneTable one("codec=f16,page=16", 50 * 16, on);
  SequenceKV& kv = one.kv;
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  std::vector<float> q(2 * kDim);
  for (auto& x : q) x = nd(rng);
  std::vector<int> chosen;
  for (int n = 1; n <= 50; n += 7) {
    AppendRandom(kv, n * 16 - kv.table(0, 0).length(), kv.table(0, 0).length(), rng);
    for (int pages : {1, 2, 3, 5, 8, 49, 60}) {
      for (int sinks : {0, 1, 4}) {
        for (int recent : {1, 2, 6}) {
          PageSelection sel = on;
          sel.pages = pages;
          sel.sink_pages = sinks;
          sel.recent_pages = recent;
          SelectPages(kv.table(0, 0), sel, 16, q.data(), 2, kDim, &chosen);
          ASSERT_EQ(SelectedPageCount(kv.table(0, 0), sel, 16), static_cast<int>(chosen.size()))
              << "pages " << n << " budget " << pages << " sinks " << sinks << " recent " << recent;
        }
      }
    }
  }
}

// A sealed codec keeps its newest `residual` tokens exact (f16 pages): the
// selection reads that whole tail besides its budget, never ranks it away.
TEST(PageSelectionTest, TheUncompressedTailIsAlwaysReadAndNotCountedAgainstTheBudget) {
  const PageSelection sel = Selection(3, 1, 1);
  OneTable one("codec=kivi4,page=16,residual=64", 40 * 16, sel);
  SequenceKV& kv = one.kv;
  std::mt19937 rng(3);
  AppendRandom(kv, 30 * 16, 0, rng);
  const PageTable& t = kv.table(0, 0);
  int tail = 0;
  while (tail < t.num_pages() - 1 && t.format(t.num_pages() - 1 - tail) == kPageFull) ++tail;
  ASSERT_GE(tail, 3) << "the residual should span several pages";
  std::normal_distribution<float> nd;
  std::vector<float> q(kDim);
  for (auto& x : q) x = nd(rng);
  std::vector<int> chosen;
  SelectPages(t, sel, 16, q.data(), 1, kDim, &chosen);
  for (int p = t.num_pages() - tail; p < t.num_pages(); ++p) {
    EXPECT_NE(std::find(chosen.begin(), chosen.end(), p), chosen.end()) << "tail page " << p << " was not read";
  }
  // The sink, one ranked page (3 - sink - recent), and the tail.
  EXPECT_EQ(static_cast<int>(chosen.size()), 1 + 1 + tail);
  EXPECT_EQ(SelectedPageCount(t, sel, 16), static_cast<int>(chosen.size()));
}

// Each kv head picks its own pages inside the attention items (in
// parallel): with three heads, each with its needle page elsewhere, and
// enough pages for several chunks per head, a head's outputs equal, bit
// for bit, attention over a one-head cache holding only the pages
// SelectPages picks for that head, on 1 and 2 threads (and repeated calls
// on 2 threads, where the heads' first items race to pick).
TEST(PageSelectionTest, EachHeadReadsItsOwnSelectedPagesOnAnyThreads) {
  ThreadPool threads(2);
  for (const std::string spec : {"codec=f16,page=16", "codec=int8,page=16", "codec=f16,page=16,rotate=hadamard"}) {
    SCOPED_TRACE(spec);
    const int H = 3, G = 3, T = 16, n_pages = 130, n = n_pages * T, n_heads = H * G;
    const KVLayout layout{1, H, kDim, T};
    const CodecConfig codec = Codec(spec);
    auto pool = testing::PoolFor(layout, codec, n + T);
    SequenceKV kv(pool.get(), layout, codec);
    std::mt19937 rng(9);
    std::normal_distribution<float> nd(0.0f, 0.3f);
    std::vector<float> q(static_cast<size_t>(n_heads) * kDim), k(static_cast<size_t>(n) * H * kDim), v(k.size());
    for (auto& x : q) x = nd(rng) * 3;
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    for (int h = 0; h < H; ++h) {  // head h's needle in page 20 + 40 h, along its first query head
      const size_t at = (static_cast<size_t>((20 + 40 * h) * T + 3) * H + h) * kDim;
      for (int c = 0; c < kDim; ++c) k[at + c] = 2 * q[static_cast<size_t>(h) * G * kDim + c];
    }
    std::vector<int32_t> pos(n);
    std::iota(pos.begin(), pos.end(), 0);
    ASSERT_TRUE(kv.Append(0, n, pos.data(), k.data(), v.data()).ok());
    PageSelection sel;
    sel.enabled = true;
    sel.pages = 70;  // more than two 32-page chunks per head: partials and a merge
    sel.dense_layers = 0;
    ASSERT_TRUE(kv.SetPageSelection(sel).ok());
    const int32_t q_pos = n;
    const float scale = 1.0f / std::sqrt(static_cast<float>(kDim));
    std::vector<float> out1(q.size()), out2(q.size());
    Attention(kv, 0, q.data(), &q_pos, 1, n_heads, scale, out1.data(), nullptr);
    for (int rep = 0; rep < 20; ++rep) {
      Attention(kv, 0, q.data(), &q_pos, 1, n_heads, scale, out2.data(), &threads);
      ASSERT_EQ(out1, out2) << "rep " << rep;
    }
    std::vector<std::vector<int>> chosen(H);
    for (int h = 0; h < H; ++h) {
      std::vector<float> qg(q.begin() + static_cast<ptrdiff_t>(h) * G * kDim,
                            q.begin() + static_cast<ptrdiff_t>(h + 1) * G * kDim);
      if (kv.keys_rotated()) {
        for (int g = 0; g < G; ++g) kv.rotation()->Forward(&qg[static_cast<size_t>(g) * kDim]);
      }
      SelectPages(kv.table(0, h), sel, T, qg.data(), G, kDim, &chosen[h]);
      ASSERT_EQ(chosen[h].size(), 70u);
      EXPECT_NE(std::find(chosen[h].begin(), chosen[h].end(), 20 + 40 * h), chosen[h].end()) << "head " << h;
      // Head h's entries of its chosen pages, in a one-head cache.
      const KVLayout one_layout{1, 1, kDim, T};
      auto pool1 = testing::PoolFor(one_layout, codec, n);
      SequenceKV only(pool1.get(), one_layout, codec);
      std::vector<float> kh(static_cast<size_t>(T) * kDim), vh(kh.size());
      for (int p : chosen[h]) {
        for (int s = 0; s < T; ++s) {
          const size_t from = (static_cast<size_t>(p * T + s) * H + h) * kDim;
          std::copy(&k[from], &k[from] + kDim, &kh[static_cast<size_t>(s) * kDim]);
          std::copy(&v[from], &v[from] + kDim, &vh[static_cast<size_t>(s) * kDim]);
        }
        ASSERT_TRUE(only.Append(0, T, &pos[static_cast<size_t>(p) * T], kh.data(), vh.data()).ok());
      }
      std::vector<float> out_only(static_cast<size_t>(G) * kDim);
      Attention(only, 0, &q[static_cast<size_t>(h) * G * kDim], &q_pos, 1, G, scale, out_only.data(), nullptr);
      EXPECT_TRUE(std::equal(out_only.begin(), out_only.end(), out1.begin() + static_cast<ptrdiff_t>(h) * G * kDim))
          << "head " << h;
    }
    EXPECT_NE(chosen[0], chosen[1]);
  }
}

}  // namespace
}  // namespace kvx::kv
