// ThinK's pruned pages in quantized layers (kv/pruned_keys.h with the
// TokenQuantCodec block codec: int8, int4, int2).
//
// The property: pruning an aged page changes nothing but its keys' pruned
// channels (now zero) and the requantization of its kept channels in new
// groups. Values stay byte for byte. So attention over the pruned cache
// equals attention over the same cache as the codec decoded it, with the
// pruned channels of the aged keys zeroed, up to the requantization error:
//   per key element   |k' - k| <= s/2 + 2^-11 |m| (asymmetric; s, m the
//                     group's stored f16 scale and min: quant.h's bound,
//                     the second term the f16 rounding of the group's low
//                     end), s/2 (symmetric 8 bits), |s| (symmetric 4/2 bits);
//   per score         |ds_j| <= eps = scale * sum_c |q_c| bound_jc;
//   per output        scores within eps move each softmax weight by a
//                     factor in [e^-2eps, e^2eps], so sum_j |dp_j| <=
//                     e^2eps - 1 and |do_c| <= (e^2eps - 1) max_j |v_jc|,
// plus float rounding of the kernels (1e-5 here).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kv/attention.h"
#include "kv/codec/quant_codec.h"
#include "kv/kv_manager.h"
#include "kv/kv_test_util.h"
#include "kv/pruned_keys.h"

namespace kvx::kv {
namespace {

const KVLayout kLayout{2, 2, 64, 16};  // layers, kv heads, head_dim, page
constexpr int kHeads = 4;             // query heads, 2 per kv head
constexpr int kTokens = 64;           // 4 pages per table
constexpr int kRecent = 16;           // pages 0..2 age out
constexpr int kPrunedPages = 3;

// Kept channels: head 0 keeps 20 scattered channels (24 int8 rows: one
// short group; 32 int4/int2 rows with 12 zero rows), head 1 keeps 32 (one
// whole group of 32) - a different set per layer.
std::vector<int> KeptFor(int l, int h) {
  std::mt19937 rng(100 + 10 * l + h);
  std::vector<int> all(kLayout.head_dim);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(h == 0 ? 20 : 32);
  std::sort(all.begin(), all.end());
  return all;
}

struct Data {
  std::vector<float> k, v;
  explicit Data(uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> g(0.0f, 1.0f);
    k.resize(static_cast<size_t>(kLayout.n_layers) * kTokens * kLayout.n_kv_heads * kLayout.head_dim);
    v.resize(k.size());
    // Keys with a few large channels (as real keys have), values plain.
    for (size_t i = 0; i < k.size(); ++i) k[i] = g(rng) * (i % 64 == 5 || i % 64 == 40 ? 6.0f : 1.0f), v[i] = g(rng);
    // Some value rows far from zero with a small spread: quantizing their
    // decoded values again need not give the same codes (the float sums of
    // a large min and a small step round), so only a copy keeps them.
    const size_t row = static_cast<size_t>(kLayout.n_kv_heads) * kLayout.head_dim;
    for (size_t t = 3; t < v.size() / row; t += 7) {
      for (size_t i = 0; i < row; ++i) v[t * row + i] = 37.0f + 0.01f * g(rng);
    }
  }
  const float* K(int l) const { return k.data() + static_cast<size_t>(l) * kTokens * kLayout.n_kv_heads * kLayout.head_dim; }
  const float* V(int l) const { return v.data() + static_cast<size_t>(l) * kTokens * kLayout.n_kv_heads * kLayout.head_dim; }
};

struct Chain {
  std::vector<float> k, v;
  std::vector<int32_t> pos;
};
Chain Read(const SequenceKV& kv, int l, int h) {
  Chain c;
  kv.ReadChain(l, h, &c.k, &c.v, &c.pos);
  return c;
}

Status PruneAll(SequenceKV& kv) {
  for (int l = 0; l < kLayout.n_layers; ++l) {
    for (int h = 0; h < kLayout.n_kv_heads; ++h) KVX_RETURN_IF_ERROR(kv.PruneKeyChannels(l, h, KeptFor(l, h), kRecent));
  }
  return Status::Ok();
}

// The requantization bound of each stored key element of a pruned page
// (see the header), [slot][d] over the chain; 0 outside pruned pages.
std::vector<double> KeyBounds(const SequenceKV& kv, int l, int h) {
  const PageTable& t = kv.table(l, h);
  const int T = kLayout.page_tokens, D = kLayout.head_dim;
  const SequenceKV::FormatCodec fc = kv.format_codec(l, kPagePruned, h);
  const pruned::Shape shape = fc.pruned_shape();
  const std::vector<int>& kept = *fc.kept;
  const CodecParams& p = shape.keys;
  std::vector<double> bound(static_cast<size_t>(t.length()) * D, 0.0);
  for (int pg = 0; pg < t.num_pages(); ++pg) {
    if (t.format(pg) != kPagePruned) continue;
    const uint8_t* data = kv.pool().PageData(t.pages()[pg]) + PageDataOffset(T);
    for (int j = 0; j < T; ++j) {
      for (int i = 0; i < shape.kept; ++i) {
        float s, m;
        TokenTensor::GroupParams(p, p.k_bits, data, j, i / p.group, &s, &m);
        const double b = !p.sym ? 0.5 * s + std::ldexp(std::fabs(m), -11) : p.k_bits == 8 ? 0.5 * std::fabs(s) : std::fabs(s);
        bound[(static_cast<size_t>(pg) * T + j) * D + kept[i]] = b + 1e-6;
      }
    }
  }
  return bound;
}

// Decode attention (one query per head at position kTokens) over per-head
// chains [h] -> [slot][d], in double: [n_heads][d].
std::vector<double> Dense(const std::vector<Chain>& chains, const std::vector<float>& q, double scale) {
  const int D = kLayout.head_dim, H = kLayout.n_kv_heads, G = kHeads / H;
  std::vector<double> out(static_cast<size_t>(kHeads) * D, 0.0);
  for (int hq = 0; hq < kHeads; ++hq) {
    const Chain& c = chains[hq / G];
    const int n = static_cast<int>(c.pos.size());
    std::vector<double> s(n, -INFINITY);
    double mx = -INFINITY;
    for (int j = 0; j < n; ++j) {
      if (c.pos[j] > kTokens) continue;
      double dot = 0;
      for (int ch = 0; ch < D; ++ch) dot += static_cast<double>(q[static_cast<size_t>(hq) * D + ch]) * c.k[static_cast<size_t>(j) * D + ch];
      s[j] = dot * scale;
      mx = std::max(mx, s[j]);
    }
    double sum = 0;
    for (int j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - mx));
    for (int j = 0; j < n; ++j) {
      for (int ch = 0; ch < D; ++ch) out[static_cast<size_t>(hq) * D + ch] += s[j] / sum * c.v[static_cast<size_t>(j) * D + ch];
    }
  }
  return out;
}

std::vector<float> Queries(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(kHeads) * kLayout.head_dim);
  for (float& x : q) x = g(rng);
  return q;
}

std::vector<float> Attend(const SequenceKV& kv, int l, const std::vector<float>& q, float scale) {
  std::vector<float> out(q.size());
  const int32_t qp = kTokens;
  Attention(kv, l, q.data(), &qp, 1, kHeads, scale, out.data(), nullptr);
  return out;
}

class PrunedQuantTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PrunedQuantTest, AttentionEqualsTheDecodedCacheWithPrunedChannelsZeroed) {
  const int D = kLayout.head_dim, T = kLayout.page_tokens, H = kLayout.n_kv_heads, G = kHeads / H;
  const float scale = 0.125f;
  for (testing::KernelPath path : testing::kAllKernelPaths) {
    SCOPED_TRACE(testing::Name(path));
    testing::ScopedKernelPath force(path);
    const Data x(7);
    SeqId seq;
    auto m = testing::FilledManager(GetParam(), kLayout, 256, kTokens, x, &seq);
    ASSERT_NE(m, nullptr);
    SequenceKV& kv = m->kv(seq);
    std::vector<std::vector<Chain>> before(kLayout.n_layers);
    for (int l = 0; l < kLayout.n_layers; ++l) {
      for (int h = 0; h < H; ++h) before[l].push_back(Read(kv, l, h));
    }
    ASSERT_TRUE(PruneAll(kv).ok()) << PruneAll(kv).ToString();
    ASSERT_TRUE(kv.CheckTables().ok()) << kv.CheckTables().ToString();
    for (int l = 0; l < kLayout.n_layers; ++l) {
      SCOPED_TRACE("layer " + std::to_string(l));
      const std::vector<float> q = Queries(11 + l);
      std::vector<Chain> after, zeroed;
      double eps[2] = {0, 0};  // per kv head: the score bound
      for (int h = 0; h < H; ++h) {
        const PageTable& t = kv.table(l, h);
        int pruned_pages = 0;
        for (int p = 0; p < t.num_pages(); ++p) pruned_pages += t.format(p) == kPagePruned;
        ASSERT_EQ(pruned_pages, kPrunedPages);
        after.push_back(Read(kv, l, h));
        // The reference: the codec's decoded cache, aged keys' pruned channels zeroed.
        Chain z = before[l][h];
        const std::vector<int> kept = KeptFor(l, h);
        for (int j = 0; j < kPrunedPages * T; ++j) {
          for (int c = 0; c < D; ++c) {
            if (!std::binary_search(kept.begin(), kept.end(), c)) z.k[static_cast<size_t>(j) * D + c] = 0.0f;
          }
        }
        // Values byte for byte (their read-back floats are equal), keys within the bound.
        EXPECT_EQ(after[h].v, z.v) << "head " << h;
        EXPECT_EQ(after[h].pos, z.pos);
        const std::vector<double> bound = KeyBounds(kv, l, h);
        double worst = 0;  // the largest |k' - k| / bound
        for (size_t i = 0; i < z.k.size(); ++i) {
          const double err = std::fabs(static_cast<double>(after[h].k[i]) - z.k[i]);
          if (bound[i] == 0.0) {
            ASSERT_EQ(err, 0.0) << "slot " << i / D << " channel " << i % D;
          } else {
            worst = std::max(worst, err / bound[i]);
          }
        }
        EXPECT_LE(worst, 1.0) << "head " << h;
        EXPECT_GT(worst, 0.0) << "head " << h << ": nothing was requantized?";
        for (int r = 0; r < G; ++r) {
          const float* qr = &q[static_cast<size_t>(h * G + r) * D];
          for (int j = 0; j < t.length(); ++j) {
            double e = 0;
            for (int c = 0; c < D; ++c) e += std::fabs(qr[c]) * bound[static_cast<size_t>(j) * D + c];
            eps[h] = std::max(eps[h], scale * e);
          }
        }
        zeroed.push_back(std::move(z));
      }
      const std::vector<float> got = Attend(kv, l, q, scale);
      // The kernels against the entries as they read back: float rounding only.
      const std::vector<double> exact = Dense(after, q, scale);
      for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], exact[i], 1e-5) << i;
      // Against the zeroed decoded cache: within the requantization bound.
      const std::vector<double> want = Dense(zeroed, q, scale);
      for (int hq = 0; hq < kHeads; ++hq) {
        const int h = hq / G;
        double vmax = 0;
        for (float v : zeroed[h].v) vmax = std::max(vmax, static_cast<double>(std::fabs(v)));
        const double tol = std::expm1(2 * eps[h]) * vmax + 1e-5;
        double diff = 0;
        for (int c = 0; c < D; ++c) diff = std::max(diff, std::fabs(got[static_cast<size_t>(hq) * D + c] - want[static_cast<size_t>(hq) * D + c]));
        EXPECT_LE(diff, tol) << "query head " << hq;
      }
      // And not within it of the unpruned cache (the property is not vacuous).
      const std::vector<double> unpruned = Dense(before[l], q, scale);
      double moved = 0;
      for (size_t i = 0; i < got.size(); ++i) moved = std::max(moved, std::fabs(got[i] - unpruned[i]));
      EXPECT_GT(moved, 1e-2);
    }
  }
}

TEST_P(PrunedQuantTest, PoolBytesFallByThePackedMinusThePrunedPage) {
  const Data x(3);
  SeqId seq;
  auto m = testing::FilledManager(GetParam(), kLayout, 256, kTokens, x, &seq);
  ASSERT_NE(m, nullptr);
  SequenceKV& kv = m->kv(seq);
  const uint64_t before = m->pool().bytes_in_use();
  ASSERT_TRUE(PruneAll(kv).ok());
  uint64_t saved = 0;
  for (int l = 0; l < kLayout.n_layers; ++l) {
    for (int h = 0; h < kLayout.n_kv_heads; ++h) {
      const SequenceKV::FormatCodec fc = kv.format_codec(l, kPagePruned, h);
      const pruned::Shape shape = fc.pruned_shape();
      const size_t packed = kv.layer_codec(l).packed_page_bytes;
      ASSERT_LT(shape.page_bytes, packed);
      EXPECT_EQ(kv.pool().PageBytesOf(kv.table(l, h).pages()[0]), shape.page_bytes);
      saved += (packed - shape.page_bytes) * kPrunedPages;
    }
  }
  EXPECT_EQ(before - m->pool().bytes_in_use(), saved);
  if (GetParam() == "codec=int4,page=16") {
    // d 64, group 32: a packed page is 64 (positions) + 2 x (16 x 32 codes + 16 x 2 groups x 4) = 1344 bytes;
    // 32 kept rows: 64 + (16 x 16 + 16 x 1 x 4) + 640 = 1024, 320 bytes less per page.
    EXPECT_EQ(kv.layer_codec(0).packed_page_bytes, 1344u);
    EXPECT_EQ(kv.format_codec(0, kPagePruned, 1).pruned_shape().page_bytes, 1024u);
    EXPECT_EQ(saved, 320u * kPrunedPages * 4);
  }
  if (GetParam() == "codec=int8,page=16") {  // 64 + 2 x (16 x 64 + 16 x 2 x 4) -> 64 + (16 x 32 + 16 x 4) + 1152
    EXPECT_EQ(kv.layer_codec(0).packed_page_bytes, 2368u);
    EXPECT_EQ(kv.format_codec(0, kPagePruned, 1).pruned_shape().page_bytes, 1792u);
  }
}

TEST_P(PrunedQuantTest, ForksCompactionAndRewritesKeepWhatTheyDoNotTouch) {
  const int D = kLayout.head_dim, T = kLayout.page_tokens;
  const float scale = 0.125f;
  const Data x(5);
  SeqId seq;
  auto m = testing::FilledManager(GetParam(), kLayout, 512, kTokens, x, &seq);
  ASSERT_NE(m, nullptr);
  SequenceKV& kv = m->kv(seq);
  ASSERT_TRUE(PruneAll(kv).ok());
  const std::vector<float> q = Queries(3);
  const std::vector<float> want = Attend(kv, 1, q, scale);
  {  // A fork shares the pruned pages and reads them with the same masks.
    auto fork = kv.Fork();
    EXPECT_EQ(testing::MaxAbsDiff(Attend(*fork, 1, q, scale), want), 0.0);
    // A prefix fork ending inside a pruned page re-encodes its part as a
    // packed page (the pruned channels as zeros, quantized again by the
    // layer codec: int8/4/2 asymmetric groups may store 0 as a small
    // nonzero); the whole pruned pages before it are shared as they are.
    auto prefix = kv.ForkPrefix(20);
    ASSERT_TRUE(prefix.ok());
    EXPECT_TRUE((*prefix)->CheckTables().ok()) << (*prefix)->CheckTables().ToString();
    const Chain c = Read(**prefix, 1, 0), parent = Read(kv, 1, 0);
    EXPECT_EQ((*prefix)->table(1, 0).format(0), kPagePruned);
    EXPECT_NE((*prefix)->table(1, 0).format(1), kPagePruned);  // packed, or f16 staging in a sealed layer
    EXPECT_TRUE(std::equal(c.k.begin(), c.k.begin() + 16 * D, parent.k.begin()));
    EXPECT_TRUE(std::equal(c.v.begin(), c.v.begin() + 16 * D, parent.v.begin()));
  }
  // Evicting from pruned pages, then compacting them among themselves: the
  // survivors' rows are copied as stored, so attention is what it was after
  // the eviction (up to the order of the float sums over fewer pages).
  for (int h = 0; h < kLayout.n_kv_heads; ++h) {
    std::vector<int> drop;
    for (int s = 1; s < 40; s += 2) drop.push_back(s);
    ASSERT_TRUE(kv.RemoveEntries(1, h, drop).ok());
  }
  const std::vector<Chain> evicted = {Read(kv, 1, 0), Read(kv, 1, 1)};
  const std::vector<float> after_eviction = Attend(kv, 1, q, scale);
  const int pages = kv.table(1, 0).num_pages();
  for (int h = 0; h < kLayout.n_kv_heads; ++h) ASSERT_TRUE(kv.Compact(1, h).ok());
  ASSERT_TRUE(kv.CheckTables().ok()) << kv.CheckTables().ToString();
  EXPECT_LT(kv.table(1, 0).num_pages(), pages);
  EXPECT_EQ(kv.kept_channels(1, 0), KeptFor(1, 0));
  EXPECT_LT(testing::MaxAbsDiff(Attend(kv, 1, q, scale), after_eviction), 1e-5);
  for (int h = 0; h < kLayout.n_kv_heads; ++h) {  // the live rows, in order, bit for bit
    const Chain c = Read(kv, 1, h);
    std::vector<float> live_k, live_v, got_k, got_v;
    for (size_t j = 0; j < evicted[h].pos.size(); ++j) {
      if (evicted[h].pos[j] == kDeadPosition) continue;
      live_k.insert(live_k.end(), evicted[h].k.begin() + j * D, evicted[h].k.begin() + (j + 1) * D);
      live_v.insert(live_v.end(), evicted[h].v.begin() + j * D, evicted[h].v.begin() + (j + 1) * D);
    }
    for (size_t j = 0; j < c.pos.size(); ++j) {
      if (c.pos[j] == kDeadPosition) continue;
      got_k.insert(got_k.end(), c.k.begin() + j * D, c.k.begin() + (j + 1) * D);
      got_v.insert(got_v.end(), c.v.begin() + j * D, c.v.begin() + (j + 1) * D);
    }
    EXPECT_EQ(got_k, live_k) << "head " << h;
    EXPECT_EQ(got_v, live_v) << "head " << h;
  }
  // A merging fate rewrites one entry of a pruned page: the other rows stay
  // as stored, the new one reads back with its pruned channels zero.
  const Chain before_rewrite = Read(kv, 1, 0);
  ASSERT_EQ(kv.table(1, 0).format(0), kPagePruned);
  std::vector<float> nk(D, 0.75f), nv(D, -0.5f);
  ASSERT_TRUE(kv.RewriteEntries(1, 0, {3}, nk.data(), nv.data()).ok());
  const Chain rewritten = Read(kv, 1, 0);
  const std::vector<int> kept = KeptFor(1, 0);
  for (int j = 0; j < T; ++j) {
    for (int ch = 0; ch < D; ++ch) {
      const size_t at = static_cast<size_t>(j) * D + ch;
      if (j != 3) {
        EXPECT_EQ(rewritten.k[at], before_rewrite.k[at]);
        EXPECT_EQ(rewritten.v[at], before_rewrite.v[at]);
      } else if (!std::binary_search(kept.begin(), kept.end(), ch)) {
        EXPECT_EQ(rewritten.k[at], 0.0f);
      } else {
        EXPECT_NEAR(rewritten.k[at], 0.75f, 0.05f);
      }
    }
  }
  EXPECT_NEAR(rewritten.v[3 * D], -0.5f, 0.05f);
}

INSTANTIATE_TEST_SUITE_P(Codecs, PrunedQuantTest,
                         ::testing::Values("codec=int8,page=16", "codec=int4,page=16", "codec=int2,page=16",
                                           "codec=int4,page=16,sym=1", "codec=int8,page=16,group=16",
                                           "codec=int4,page=16,residual=16"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param.substr(6);
                           for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return n;
                         });

TEST(PrunedQuantTest, RefusesWhatHasNoPrunedFormat) {
  auto err = [](const std::string& spec) {
    auto r = ResolveKVSpec(spec, kLayout, 256, 1);
    return r.ok() ? std::string("ok") : r.status().message();
  };
  EXPECT_EQ(err("codec=int4;policy=think,lambda=0.5"), "ok");
  EXPECT_EQ(err("codec=int8;policy=snapkv,ratio=0.5;policy=think"), "ok");  // 39 of 64 channels: 40 int8 rows
  EXPECT_EQ(err("codec=int4;policy=think,lambda=0.4"), "ok");                 // 48 int4 rows
  EXPECT_EQ(err("codec=int2;policy=think,lambda=0.5"), "ok");                 // 32 int2 rows
  // int2 rows come in 32s (whole 8-byte bit planes): 39 channels take all 64, nothing saved; the fix is named.
  const std::string none = err("codec=int2;policy=think,lambda=0.4");
  EXPECT_NE(none.find("saves no bytes with int2"), std::string::npos) << none;
  EXPECT_NE(none.find("keep at most 32 (lambda >= 0.5"), std::string::npos) << none;
  const std::string kivi = err("codec=kivi4;policy=think,lambda=0.5");
  EXPECT_NE(kivi.find("no pruned page format for kivi4"), std::string::npos) << kivi;
  EXPECT_NE(kivi.find("int4"), std::string::npos) << kivi;
  EXPECT_NE(err("codec=int4,outliers=0.01;policy=think,lambda=0.5").find("drop outliers="), std::string::npos);
  EXPECT_NE(err("codec=int4,prerope=1;policy=think,lambda=0.5").find("drop prerope=1"), std::string::npos);
  EXPECT_NE(err("codec=int4,rotate=hadamard;policy=think,lambda=0.5").find("rotate=hadamard"), std::string::npos);
  EXPECT_NE(err("codec=int4;policy=think,lambda=0.5;policy=quest").find("quest"), std::string::npos);
  EXPECT_NE(err("codec=int4;policy=minicache;policy=think,lambda=0.5").find("minicache"), std::string::npos);

  // SequenceKV itself refuses a KIVI layer and a mask that saves nothing.
  const Data x(1);
  SeqId seq;
  auto m = testing::FilledManager("codec=kivi4,page=16,residual=0", kLayout, 256, kTokens, x, &seq);
  ASSERT_NE(m, nullptr);
  const Status kivi_s = m->kv(seq).PruneKeyChannels(0, 0, KeptFor(0, 1), kRecent);
  EXPECT_NE(kivi_s.message().find("no pruned page format"), std::string::npos) << kivi_s.ToString();
  auto m4 = testing::FilledManager("codec=int2,page=16", kLayout, 256, kTokens, x, &seq);
  ASSERT_NE(m4, nullptr);
  std::vector<int> most(40);
  std::iota(most.begin(), most.end(), 0);
  const Status none_s = m4->kv(seq).PruneKeyChannels(0, 0, most, kRecent);
  EXPECT_NE(none_s.message().find("saves nothing"), std::string::npos) << none_s.ToString();
  EXPECT_TRUE(m4->kv(seq).kept_channels(0, 0).empty());
}

}  // namespace
}  // namespace kvx::kv
