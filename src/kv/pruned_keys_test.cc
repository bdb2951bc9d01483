#include "kv/pruned_keys.h"

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

// `n` channels of 0..d-1, ascending, spread over the head (ThinK's masks are
// scattered, not a prefix).
std::vector<int> Kept(int n, int d, std::mt19937& rng) {
  std::vector<int> all(d);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<int> kept(all.begin(), all.begin() + n);
  std::sort(kept.begin(), kept.end());
  return kept;
}

// Pruned pages laid out one after the other in a 64-byte-aligned buffer, as
// pool pages are.
struct Pages {
  std::vector<uint64_t> storage;  // 8-byte words; the pages start 64-byte aligned
  std::vector<const uint8_t*> starts;
  size_t page_bytes = 0;
  uint8_t* At(int i) { return const_cast<uint8_t*>(starts[i]); }
};

Pages MakePages(int n_pages, int T, int d, int nk) {
  Pages pages;
  pages.page_bytes = pruned::PageBytes(T, d, nk);
  pages.storage.assign((pages.page_bytes * n_pages + 64) / 8, 0);
  uint8_t* base = reinterpret_cast<uint8_t*>(pages.storage.data());
  base += (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64;
  for (int i = 0; i < n_pages; ++i) pages.starts.push_back(base + pages.page_bytes * i);
  return pages;
}

// The fused kernel over a run of pruned pages (pruned::AttendRun: scores
// against the short keys, online softmax, values) against a scalar
// reference in double over the same f16 entries, read back with
// pruned::Decode (so the pruned channels read 0) and the full queries:
// q[kept] . k[kept] = q . k when the other channels of k are 0. Kept
// channel counts off the multiples of 4, 8 and 16 (1, 5, 13, 20, 39, 63: 8,
// 8, 16, 24, 40, 64 stored rows), runs of 1 and 3 pages whose last holds 1,
// 7 or all T entries, 1-8 query rows (the kernel's groups of 4 and their
// remainders), rows that see every entry, part of them or none.
TEST(PrunedKeysTest, FusedRunMatchesScalarReference) {
  const int d = 64;
  for (int T : {16, 32}) {
    if (!pruned::HasAttendRun(T, d)) GTEST_SKIP() << "the fused f16 kernel does not run on this CPU";
    for (int nk : {1, 5, 13, 20, 39, 63}) {
      for (int n_pages : {1, 3}) {
        for (int m_last : {1, 7, T}) {
          for (int nq : {1, 3, 4, 5, 8}) {
            SCOPED_TRACE("T " + std::to_string(T) + " kept " + std::to_string(nk) + " pages " +
                         std::to_string(n_pages) + " last " + std::to_string(m_last) + " rows " + std::to_string(nq));
            std::mt19937 rng(T * 100000 + nk * 1000 + n_pages * 100 + m_last * 10 + nq);
            std::normal_distribution<float> nd;
            const std::vector<int> kept = Kept(nk, d, rng);
            Pages pages = MakePages(n_pages, T, d, nk);
            const int n = (n_pages - 1) * T + m_last;
            std::vector<float> k(static_cast<size_t>(T) * d), v(k.size());
            std::vector<float> keys(static_cast<size_t>(n) * d), values(keys.size());  // as read back
            std::vector<int32_t> pos(n);
            for (int i = 0; i < n_pages; ++i) {
              const int m = i + 1 == n_pages ? m_last : T;
              for (auto& x : k) x = nd(rng);
              for (auto& x : v) x = nd(rng);
              // Positions: increasing with gaps, so that a row can see part of a page.
              for (int j = 0; j < m; ++j) pos[i * T + j] = PagePositions(pages.At(i))[j] = 3 * (i * T + j) + 1;
              pruned::Encode(kept, T, d, pages.At(i) + PageDataOffset(T), m, k.data(), v.data());
              pruned::Decode(kept, T, d, pages.At(i) + PageDataOffset(T), m, &keys[static_cast<size_t>(i) * T * d],
                             &values[static_cast<size_t>(i) * T * d]);
            }
            std::vector<float> q(static_cast<size_t>(nq) * d);
            for (auto& x : q) x = 0.3f * nd(rng);
            std::vector<int32_t> qp(nq);
            for (int r = 0; r < nq; ++r) qp[r] = r == 0 ? pos[n - 1] : r == 1 ? -1 : pos[rng() % n];
            std::vector<float> qg;
            pruned::GatherQueries(kept, d, q.data(), nq, &qg);

            std::vector<float> mx(nq, -INFINITY), sum(nq, 0.0f), acc(static_cast<size_t>(nq) * d, 0.0f);
            pruned::AttendRun(nk, T, d, pages.starts.data(), n_pages, m_last, pages.page_bytes, qg.data(), qp.data(),
                              nq, mx.data(), sum.data(), acc.data(), nullptr, 0);

            for (int r = 0; r < nq; ++r) {
              std::vector<double> s(n, -INFINITY);
              double big = -INFINITY;
              for (int j = 0; j < n; ++j) {
                if (pos[j] > qp[r]) continue;
                double dot = 0;
                for (int c = 0; c < d; ++c) dot += static_cast<double>(q[r * d + c]) * keys[static_cast<size_t>(j) * d + c];
                big = std::max(big, s[j] = dot);
              }
              if (big == -INFINITY) {  // sees nothing: the state stays empty
                EXPECT_EQ(mx[r], -INFINITY);
                EXPECT_EQ(sum[r], 0.0f);
                for (int c = 0; c < d; ++c) ASSERT_EQ(acc[r * d + c], 0.0f);
                continue;
              }
              double total = 0;
              std::vector<double> out(d, 0.0);
              for (int j = 0; j < n; ++j) {
                if (s[j] == -INFINITY) continue;
                const double w = std::exp(s[j] - big);
                total += w;
                for (int c = 0; c < d; ++c) out[c] += w * values[static_cast<size_t>(j) * d + c];
              }
              for (int c = 0; c < d; ++c) {
                const double want = out[c] / total, got = acc[r * d + c] / sum[r];
                ASSERT_NEAR(got, want, 2e-5 * (1 + std::fabs(want))) << "row " << r << " channel " << c;
              }
            }
          }
        }
      }
    }
  }
}

class NullObserver : public AttentionObserver {
 public:
  void OnProbabilities(int, int, int, int, int, const float*, const int32_t*, int) override {}
};

// Through Attention: a cache whose aged pages are pruned (the fused kernel
// takes their runs) equals, up to rounding, the same entries in plain f16
// pages with the pruned channels zeroed, and the general page loop over the
// pruned cache (an observer sends attention there). GQA groups of 1, 3 and
// 8 rows, a decode query and a prompt's two queries (one seeing part of
// the cache), kept counts of 21 and 40 channels.
TEST(PrunedKeysTest, FusedAttentionMatchesZeroedCacheAndGeneralPath) {
  const int d = 64, T = 16, kv_heads = 2, n = 200, recent = 40;
  const KVLayout layout{1, kv_heads, d, T};
  if (!pruned::HasAttendRun(T, d)) GTEST_SKIP() << "the fused f16 kernel does not run on this CPU";
  for (int keep : {21, 40}) {
    for (int group : {1, 3, 8}) {
      SCOPED_TRACE("keep " + std::to_string(keep) + " group " + std::to_string(group));
      const int n_heads = kv_heads * group;
      std::mt19937 rng(keep * 10 + group);
      std::normal_distribution<float> nd;
      std::vector<float> k(static_cast<size_t>(n) * kv_heads * d), v(k.size());
      std::vector<float> q(static_cast<size_t>(2) * n_heads * d);
      for (auto& x : q) x = nd(rng);
      // Keys drift towards the queries: the running max rises page after page.
      for (size_t i = 0; i < k.size(); ++i) k[i] = nd(rng) + 0.01f * static_cast<float>(i / (kv_heads * d)) * q[i % (group * d)];
      for (auto& x : v) x = nd(rng);
      std::vector<int32_t> pos(n);
      std::iota(pos.begin(), pos.end(), 0);
      auto pool = std::move(BlockPool::Create({.budget_bytes = 8 << 20, .page_bytes = PageBytes(layout, CodecId::kF16)}))
                      .value();
      SequenceKV pruned_kv(pool.get(), layout, CodecId::kF16), zeroed_kv(pool.get(), layout, CodecId::kF16);
      ASSERT_TRUE(pruned_kv.Append(0, n, pos.data(), k.data(), v.data()).ok());
      std::vector<std::vector<int>> kept(kv_heads);
      for (int h = 0; h < kv_heads; ++h) {
        kept[h] = Kept(keep, d, rng);
        ASSERT_TRUE(pruned_kv.PruneKeyChannels(0, h, kept[h], recent).ok());
        // The entries of the pages that were pruned lose the other channels.
        const PageTable& t = pruned_kv.table(0, h);
        int pruned_pages = 0;
        for (int p = 0; p < t.num_pages(); ++p) {
          if (t.format(p) != kPagePruned) continue;
          ++pruned_pages;
          for (int j = p * T; j < (p + 1) * T; ++j) {
            for (int c = 0; c < d; ++c) {
              if (!std::binary_search(kept[h].begin(), kept[h].end(), c)) k[(static_cast<size_t>(j) * kv_heads + h) * d + c] = 0;
            }
          }
        }
        ASSERT_EQ(pruned_pages, (n - recent) / T);
      }
      ASSERT_TRUE(zeroed_kv.Append(0, n, pos.data(), k.data(), v.data()).ok());
      ThreadPool threads(2);
      for (const std::vector<int32_t>& qp : std::vector<std::vector<int32_t>>{{n}, {n, n / 3}}) {
        const int n_q = static_cast<int>(qp.size());
        std::vector<float> fused(static_cast<size_t>(n_q) * n_heads * d), zeroed(fused.size()), general(fused.size());
        Attention(pruned_kv, 0, q.data(), qp.data(), n_q, n_heads, 0.125f, fused.data(), &threads);
        Attention(zeroed_kv, 0, q.data(), qp.data(), n_q, n_heads, 0.125f, zeroed.data(), &threads);
        NullObserver observer;
        Attention(pruned_kv, 0, q.data(), qp.data(), n_q, n_heads, 0.125f, general.data(), &threads, &observer);
        for (size_t i = 0; i < fused.size(); ++i) {
          ASSERT_NEAR(fused[i], zeroed[i], 1e-5 * (1 + std::fabs(zeroed[i]))) << "n_q " << n_q << " " << i;
          ASSERT_NEAR(fused[i], general[i], 1e-5 * (1 + std::fabs(general[i]))) << "n_q " << n_q << " " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvx::kv
