#include "kv/policy/think.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>

#include "kv/attention.h"
#include "kv/codec/f16_codec.h"
#include "kv/codec/f32_codec.h"
#include "kv/kv_manager.h"
#include "kv/kv_test_util.h"
#include "kv/pruned_keys.h"

namespace kvx::kv {
namespace {

constexpr int kHeads = 4;               // query heads, 2 per kv head
const KVLayout kLayout{2, 2, 32, 8};    // layers, kv heads, head_dim, page
constexpr int kTokens = 64;             // 8 pages per table
constexpr int kKeep = 8;
constexpr int kPrunedPages = 6;         // recent=16 in the specs: pages 0..5 (48 slots) age out

// The planted channels of kv head h: where its prompt queries carry q.k.
std::vector<int> Planted(int h) {
  std::vector<int> c;
  for (int i = 0; i < kKeep; ++i) c.push_back(h == 0 ? 3 * i + 1 : 31 - 2 * i);
  std::sort(c.begin(), c.end());
  return c;
}

// Keys and values [layer][token][kv head][dim] ~ N(0, 1); prompt queries
// [window][query head][dim]: large on the group's planted channels, tiny
// elsewhere, so s_c = q^2 k^2 ranks exactly those channels first.
struct Data {
  std::vector<float> k, v, q;
  int window = 4;
  explicit Data(uint32_t seed) {
    const int D = kLayout.head_dim, H = kLayout.n_kv_heads;
    std::mt19937 rng(seed);
    std::normal_distribution<float> g(0.0f, 1.0f);
    k.resize(static_cast<size_t>(kLayout.n_layers) * kTokens * H * D);
    v.resize(k.size());
    for (size_t i = 0; i < k.size(); ++i) k[i] = g(rng), v[i] = g(rng);
    q.resize(static_cast<size_t>(window) * kHeads * D);
    for (int i = 0; i < window; ++i) {
      for (int hq = 0; hq < kHeads; ++hq) {
        const std::vector<int> planted = Planted(hq / (kHeads / H));
        for (int c = 0; c < D; ++c) {
          const bool on = std::find(planted.begin(), planted.end(), c) != planted.end();
          q[(static_cast<size_t>(i) * kHeads + hq) * D + c] = on ? 3.0f + 0.5f * g(rng) : 0.01f * g(rng);
        }
      }
    }
  }
  const float* K(int l) const { return k.data() + static_cast<size_t>(l) * kTokens * kLayout.n_kv_heads * kLayout.head_dim; }
  const float* V(int l) const { return v.data() + static_cast<size_t>(l) * kTokens * kLayout.n_kv_heads * kLayout.head_dim; }
};

// A manager holding the tokens, the prompt's last queries seen by the
// policies' observer (as the forward pass shows them) during the step.
std::unique_ptr<KVManager> Filled(const std::string& spec, const Data& x, SeqId* seq) {
  std::vector<float> out(x.q.size());
  std::vector<int32_t> q_pos(x.window);
  std::iota(q_pos.begin(), q_pos.end(), kTokens - x.window);
  return testing::FilledManager(spec, kLayout, 256, kTokens, x, seq, [&](KVManager& m, SeqId s, int l) {
    for (const auto& p : m.policies()) {
      if (p->observer() == nullptr) continue;
      Attention(m.kv(s), l, x.q.data(), q_pos.data(), x.window, kHeads, 1.0f, out.data(), nullptr, p->observer());
    }
  });
}

// Decode attention of fixed random queries (every channel) per layer.
std::vector<float> Outputs(const SequenceKV& kv, uint32_t seed) {
  return testing::DecodeOutputs(kv, kHeads, kTokens, seed);
}

// The same tokens in a plain f16 cache, with the channels not in
// keep(h) zeroed in the keys of the first `aged` tokens.
std::vector<float> ZeroedReference(const Data& x, int aged, const std::function<std::vector<int>(int)>& keep) {
  Data z = x;
  const int D = kLayout.head_dim, H = kLayout.n_kv_heads;
  for (int l = 0; l < kLayout.n_layers; ++l) {
    for (int t = 0; t < aged; ++t) {
      for (int h = 0; h < H; ++h) {
        const std::vector<int> kept = keep(h);
        float* row = z.k.data() + ((static_cast<size_t>(l) * kTokens + t) * H + h) * D;
        for (int c = 0; c < D; ++c) {
          if (std::find(kept.begin(), kept.end(), c) == kept.end()) row[c] = 0.0f;
        }
      }
    }
  }
  SeqId seq;
  auto m = Filled("codec=f16,page=8", z, &seq);
  return Outputs(m->kv(seq), 7);
}

using testing::MaxAbsDiff;

TEST(ThinKTest, KeptChannelsAreTheTopScores) {
  // s_c = mean q^2 * mean k^2: channel 5 has the largest product though
  // neither its q nor its k is the largest alone.
  const int d = 8;
  std::vector<float> q(d, 1.0f), k(d, 1.0f);
  q[0] = 4.0f;   // q^2 = 16, k^2 = 0.01 -> 0.16
  k[0] = 0.1f;
  k[1] = 3.0f;   // 9
  q[5] = 2.0f;   // 4 * 4 = 16
  k[5] = 2.0f;
  q[7] = 1.5f;   // 2.25
  EXPECT_EQ(ThinKKeptChannels(q.data(), 1, 1, k.data(), 1, d, 3), (std::vector<int>{1, 5, 7}));
}

TEST(ThinKTest, PrunesThePlantedChannelsAndFreesTheirBytes) {
  const Data x(1);
  SeqId seq;
  auto m = Filled("codec=f16,page=8;policy=think,keep=8,recent=16,window=4", x, &seq);
  ASSERT_NE(m, nullptr);
  const uint64_t before = m->pool().bytes_in_use();
  ASSERT_TRUE(m->Compress(seq).ok());
  const SequenceKV& kv = m->kv(seq);
  ASSERT_TRUE(kv.CheckTables().ok()) << kv.CheckTables().ToString();
  for (int l = 0; l < kLayout.n_layers; ++l) {
    for (int h = 0; h < kLayout.n_kv_heads; ++h) {
      EXPECT_EQ(kv.kept_channels(l, h), Planted(h)) << "layer " << l << " head " << h;
      int pruned_pages = 0;
      for (int p = 0; p < kv.table(l, h).num_pages(); ++p) pruned_pages += kv.table(l, h).format(p) == kPagePruned;
      EXPECT_EQ(pruned_pages, kPrunedPages);
      EXPECT_EQ(kv.LiveEntries(l, h), kTokens);
    }
  }
  // Each pruned page saves the bytes of the 24 dropped key channels.
  CodecParams p;
  p.page_tokens = kLayout.page_tokens;
  p.head_dim = kLayout.head_dim;
  const uint64_t saved_per_page = PageBytesFor<F16Codec>(p) - pruned::PageBytes(p.page_tokens, p.head_dim, kKeep);
  EXPECT_EQ(saved_per_page, 384u);  // 8 tokens * 24 channels * 2 bytes
  EXPECT_EQ(before - m->pool().bytes_in_use(),
            saved_per_page * kPrunedPages * kLayout.n_layers * kLayout.n_kv_heads);
  // The channel maps live beside the pool and count: a kept channel's index per table at least.
  EXPECT_GE(m->SideBytes(seq), static_cast<uint64_t>(kLayout.n_layers) * kLayout.n_kv_heads * kKeep);

  // Attention over the pruned cache is attention with the other channels of
  // the aged tokens zeroed, and not with the wrong channels kept.
  const std::vector<float> got = Outputs(kv, 7);
  const int aged = kPrunedPages * kLayout.page_tokens;
  const double right = MaxAbsDiff(got, ZeroedReference(x, aged, Planted));
  EXPECT_LT(right, 1e-5);
  const double wrong = MaxAbsDiff(got, ZeroedReference(x, aged, [](int h) { return Planted(1 - h); }));
  EXPECT_GT(wrong, 1e-2);
  const double unpruned = MaxAbsDiff(got, ZeroedReference(x, 0, Planted));
  EXPECT_GT(unpruned, 1e-2);
}

TEST(ThinKTest, F32LayersPruneIntoF16Pages) {
  const Data x(4);
  SeqId seq;
  auto m = Filled("codec=f32,page=8;policy=think,keep=8,recent=16,window=4", x, &seq);
  ASSERT_NE(m, nullptr);
  const uint64_t before = m->pool().bytes_in_use();
  ASSERT_TRUE(m->Compress(seq).ok());
  const SequenceKV& kv = m->kv(seq);
  EXPECT_TRUE(kv.CheckTables().ok()) << kv.CheckTables().ToString();
  EXPECT_EQ(kv.kept_channels(1, 0), Planted(0));
  CodecParams p;
  p.page_tokens = kLayout.page_tokens;
  p.head_dim = kLayout.head_dim;
  const uint64_t saved_per_page = PageBytesFor<F32Codec>(p) - pruned::PageBytes(p.page_tokens, p.head_dim, kKeep);
  EXPECT_EQ(before - m->pool().bytes_in_use(),
            saved_per_page * kPrunedPages * kLayout.n_layers * kLayout.n_kv_heads);
  // f16 rounding of the aged entries only: close to the f32 cache with the channels zeroed.
  EXPECT_LT(MaxAbsDiff(Outputs(kv, 7), ZeroedReference(x, kPrunedPages * kLayout.page_tokens, Planted)), 1e-2);
}

TEST(ThinKTest, ForksCompactionAndNewTokensKeepWorking) {
  const Data x(2);
  SeqId seq;
  auto m = Filled("codec=f16,page=8;policy=think,keep=8,recent=16,window=4", x, &seq);
  ASSERT_TRUE(m->Compress(seq).ok());
  SequenceKV& kv = m->kv(seq);
  const std::vector<float> want = Outputs(kv, 3);
  // A fork shares the pruned pages and reads them with the same mask.
  auto fork = kv.Fork();
  EXPECT_EQ(MaxAbsDiff(Outputs(*fork, 3), want), 0.0);
  // A prefix fork inside a pruned page re-encodes its part as a full page.
  auto prefix = kv.ForkPrefix(20);
  ASSERT_TRUE(prefix.ok());
  EXPECT_TRUE((*prefix)->CheckTables().ok()) << (*prefix)->CheckTables().ToString();
  fork.reset();
  prefix->reset();
  // Evicting from pruned pages, then compacting them among themselves.
  for (int l = 0; l < kLayout.n_layers; ++l) {
    for (int h = 0; h < kLayout.n_kv_heads; ++h) {
      std::vector<int> drop;
      for (int s = 0; s < 40; s += 2) drop.push_back(s);
      ASSERT_TRUE(kv.RemoveEntries(l, h, drop).ok());
      ASSERT_TRUE(kv.Compact(l, h).ok());
      EXPECT_EQ(kv.kept_channels(l, h), Planted(h));
    }
  }
  EXPECT_TRUE(kv.CheckTables().ok()) << kv.CheckTables().ToString();
  // New tokens go to ordinary pages; a second Compress keeps the masks.
  const int D = kLayout.head_dim, H = kLayout.n_kv_heads;
  std::vector<float> k(static_cast<size_t>(8) * H * D, 0.5f), v(k.size(), 0.25f);
  std::vector<int32_t> pos(8);
  std::iota(pos.begin(), pos.end(), kTokens);
  for (int l = 0; l < kLayout.n_layers; ++l) ASSERT_TRUE(kv.Append(l, 8, pos.data(), k.data(), v.data()).ok());
  ASSERT_TRUE(m->Compress(seq).ok());
  EXPECT_TRUE(kv.CheckTables().ok()) << kv.CheckTables().ToString();
  EXPECT_EQ(kv.kept_channels(0, 0), Planted(0));
}

TEST(ThinKTest, ComposesWithSnapKVBeforeIt) {
  const Data x(3);
  SeqId seq;
  auto m = Filled("codec=f16,page=8;policy=snapkv,ratio=0.5,window=4;policy=think,keep=8,recent=16,window=4", x,
                  &seq);
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(m->Compress(seq).ok());
  const SequenceKV& kv = m->kv(seq);
  EXPECT_TRUE(kv.CheckTables().ok()) << kv.CheckTables().ToString();
  EXPECT_LT(kv.LiveEntries(0, 0), kTokens);
  EXPECT_EQ(kv.kept_channels(0, 0), Planted(0));
  EXPECT_EQ(kv.kept_channels(1, 1), Planted(1));
  EXPECT_GT(kv.LiveEntriesIn(0, 0, kPagePruned), 0);
}

TEST(ThinKTest, RejectsWhatItCannotPrune) {
  auto err = [](const std::string& spec) {
    auto r = ResolveKVSpec(spec, kLayout, 256, 1);
    return r.ok() ? std::string("ok") : r.status().message();
  };
  // int2 keys are stored in multiples of 32 channel rows (whole 8-byte bit planes): all of head_dim 32 here.
  EXPECT_EQ(err("codec=int8;policy=think"), "ok");
  EXPECT_NE(err("codec=int2;policy=think").find("saves no bytes with int2"), std::string::npos);
  EXPECT_NE(err("codec=int2;policy=think").find("use codec=f16"), std::string::npos);
  EXPECT_NE(err("codec=kivi4;policy=think").find("int4"), std::string::npos);
  // int4's default rotation gives way to ThinK (kv_spec.h); named, it is refused with the fix.
  EXPECT_EQ(err("codec=int4;policy=think,lambda=0.5"), "ok");
  EXPECT_NE(err("codec=int4,rotate=hadamard;policy=think,lambda=0.5").find("rotate=hadamard mixes them: use "
                                                                           "rotate=none"),
            std::string::npos);
  EXPECT_NE(err("codec=kivi2;policy=think").find("no pruned page format for kivi2"), std::string::npos);
  EXPECT_NE(err("codec=int4,outliers=0.01;policy=think").find("outliers"), std::string::npos);
  EXPECT_NE(err("codec=f16,prerope=1;policy=think").find("prerope"), std::string::npos);
  EXPECT_NE(err("codec=f16;policy=think,mode=continuous").find("mode=once"), std::string::npos);
  EXPECT_NE(err("codec=f16;policy=think;policy=quest").find("quest"), std::string::npos);
  EXPECT_NE(err("codec=f16;policy=think,lambda=0.4,keep=8").find("not both"), std::string::npos);
  EXPECT_NE(err("codec=f16;policy=think,keep=32").find("1..31"), std::string::npos);
  EXPECT_NE(err("codec=f16;policy=think,keep=30").find("saves no bytes"), std::string::npos);
  EXPECT_EQ(err("codec=f16;policy=think,lambda=0.4"), "ok");
  EXPECT_EQ(err("codec=f32;policy=snapkv,ratio=0.5;policy=think"), "ok");
}

}  // namespace
}  // namespace kvx::kv
