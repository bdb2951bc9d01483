// Pre-RoPE scores (prerope_scores.h): the channel-major AVX-512 path gives
// the reference path's scores, and both give q . RoPE(pos, k) of the decoded
// keys, on odd shapes: head sizes whose Hadamard blocks are 16, 32 or 64
// channels, partial rotary dimensions in both RoPE layouts, pages of 16-128
// entries, partial f16 staging pages, scattered positions, dead entries,
// 1-8 query rows.
#include "kv/prerope_scores.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kv/kv_test_util.h"
#include "ops/nn.h"

namespace kvx::kv {
namespace {

using testing::Codec;
using testing::PageOf;
using testing::PoolFor;

struct Shape {
  std::string spec;
  int dim;
  int n_dims;  // rotary channels
  bool neox;
  bool scattered;  // positions with gaps (offsets in a page not 0, 1, 2, ...)
  int n;           // entries
};

void PrintTo(const Shape& s, std::ostream* os) {
  *os << s.spec << " d" << s.dim << " rope " << s.n_dims << (s.neox ? " neox" : "") << (s.scattered ? " scattered" : "")
      << " n" << s.n;
}

// One head's cache of s.n random entries (keys with a few large channels),
// a third of one page's entries removed.
struct Cache {
  explicit Cache(const Shape& s) : layout{1, 1, s.dim, PageOf(s.spec)}, cc(Codec(s.spec)) {
    EXPECT_TRUE(ValidateCodecConfig(layout, cc).ok()) << ValidateCodecConfig(layout, cc).ToString();
    pool = PoolFor(layout, cc, s.n);
    kv = std::make_unique<SequenceKV>(pool.get(), layout, cc);
    rope.n_dims = s.n_dims;
    rope.freq_base = 10000.0f;
    rope.neox = s.neox;
    kv->set_rope(rope);
    std::mt19937 rng(static_cast<uint32_t>(s.dim * 131 + s.n + s.spec.size()));
    std::normal_distribution<float> nd;
    std::vector<float> k(static_cast<size_t>(s.n) * s.dim), v(k.size());
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = i % s.dim % 8 == 5 ? 3.0f + 2.5f * nd(rng) : 0.5f * nd(rng);
      v[i] = nd(rng);
    }
    std::vector<int32_t> pos(s.n);
    for (int j = 0; j < s.n; ++j) pos[j] = s.scattered ? 3 * j + static_cast<int>(rng() % 3) : j;
    for (int start = 0; start < s.n;) {
      const int len = std::min(s.n - start, 1 + static_cast<int>(rng() % 50));
      const size_t off = static_cast<size_t>(start) * s.dim;
      EXPECT_TRUE(kv->Append(0, len, &pos[start], &k[off], &v[off]).ok());
      start += len;
    }
    std::vector<int> dead;
    for (int j = 1; j < std::min(s.n, layout.page_tokens); j += 3) dead.push_back(j);
    EXPECT_TRUE(kv->RemoveEntries(0, 0, dead).ok());
  }
  KVLayout layout;
  CodecConfig cc;
  ops::RopeParams rope{};
  std::unique_ptr<BlockPool> pool;
  std::unique_ptr<SequenceKV> kv;
};

// Calls fn(codec, params, page, m) for every page of the head, with the
// codec struct its format is read with.
template <typename Fn>
void ForEachPage(const SequenceKV& kv, const Fn& fn) {
  const PageTable& t = kv.table(0, 0);
  const LayerCodec& lc = kv.layer_codec(0);
  for (int p = 0; p < t.num_pages(); ++p) {
    const uint8_t* page = kv.pool().PageData(t.pages()[p]);
    const int m = t.EntriesInPage(p, kv.layout().page_tokens);
    if (t.format(p) == kPageFull) {
      fn(F16Codec{}, lc.params, page, m);
    } else {
      ASSERT_EQ(t.format(p), kPagePacked);
      DispatchCodec(lc.id, [&](auto codec) { fn(codec, lc.params, page, m); });
    }
  }
}

std::vector<float> RandomQueries(int nr, int dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> q(static_cast<size_t>(nr) * dim);
  for (float& x : q) x = 0.3f * nd(rng);
  return q;
}

class PreRopeScoresTest : public ::testing::TestWithParam<Shape> {};

// The channel-major path runs wherever it should (AVX-512, f16 and KIVI
// pages of whole 16-entry blocks) and scores as the reference path does.
TEST_P(PreRopeScoresTest, ColumnPathMatchesReferencePath) {
  const Shape s = GetParam();
  Cache c(s);
  const int T = c.layout.page_tokens;
  int column_pages = 0;
  for (int nr : {1, 3, 4, 8}) {
    const std::vector<float> q = RandomQueries(nr, s.dim, static_cast<uint32_t>(nr));
    ForEachPage(*c.kv, [&](auto codec, const CodecParams& params, const uint8_t* page, int m) {
      using C = decltype(codec);
      const int32_t* pos = PagePositions(page);
      int32_t p0 = kDeadPosition;
      for (int j = 0; j < m; ++j) p0 = std::min(p0, pos[j]);
      std::vector<float> ref(static_cast<size_t>(nr) * T, 0.0f), col(ref.size(), 0.0f);
      prerope::ReferenceScores<C>(*c.kv, params, page, m, p0, q.data(), nr, ref.data(), T);
      if (!prerope::ColumnScores<C>(*c.kv, params, page, m, p0, q.data(), nr, col.data(), T)) return;
      ++column_pages;
      for (int r = 0; r < nr; ++r) {
        for (int j = 0; j < m; ++j) {
          if (pos[j] == kDeadPosition) continue;
          const size_t i = static_cast<size_t>(r) * T + j;
          EXPECT_NEAR(col[i], ref[i], 2e-4f * (1.0f + std::fabs(ref[i]))) << "row " << r << " entry " << j << " of " << m;
        }
      }
    });
  }
  const bool packed_columns = c.cc.id == CodecId::kF16 ||
                              (IsKivi(c.cc.id) && T * DefaultBits(c.cc.id) / 8 % 16 == 0 && c.cc.outliers == 0);
  if (simd::HasAvx512() && s.dim % 16 == 0 && T % 16 == 0 && packed_columns) {
    EXPECT_GT(column_pages, 0) << "the channel-major path never ran";
  }
}

// Whatever path runs (AVX-512, AVX2, scalar), the scores are q . RoPE(pos, k)
// of the keys as the cache decodes them (ReadEntry: rotation undone, not roped).
TEST_P(PreRopeScoresTest, ScoresRopedDecodedKeys) {
  const Shape s = GetParam();
  Cache c(s);
  const int T = c.layout.page_tokens, nr = 5;
  const std::vector<float> q = RandomQueries(nr, s.dim, 7);
  std::vector<std::vector<double>> want;  // [slot][row]
  std::vector<float> k(s.dim), v(s.dim);
  const int slots = c.kv->Length(0, 0);
  for (int j = 0; j < slots; ++j) {
    int32_t p = 0;
    c.kv->ReadEntry(0, 0, j, k.data(), v.data(), &p);
    want.emplace_back(nr, 0.0);
    if (p == kDeadPosition) continue;
    ops::Rope(k.data(), 1, s.dim, p, c.rope);
    for (int r = 0; r < nr; ++r) {
      for (int ch = 0; ch < s.dim; ++ch) want[j][r] += static_cast<double>(q[static_cast<size_t>(r) * s.dim + ch]) * k[ch];
    }
  }
  for (testing::KernelPath path : testing::kAllKernelPaths) {
    SCOPED_TRACE(testing::Name(path));
    testing::ScopedKernelPath force(path);
    int slot = 0;
    ForEachPage(*c.kv, [&](auto codec, const CodecParams& params, const uint8_t* page, int m) {
      std::vector<float> got(static_cast<size_t>(nr) * T, 0.0f);
      prerope::Scores<decltype(codec)>(*c.kv, params, page, m, q.data(), nr, got.data(), T);
      const int32_t* pos = PagePositions(page);
      for (int j = 0; j < m; ++j, ++slot) {
        if (pos[j] == kDeadPosition) continue;
        for (int r = 0; r < nr; ++r) {
          const double w = want[slot][r];
          EXPECT_NEAR(got[static_cast<size_t>(r) * T + j], w, 2e-4 * (1.0 + std::fabs(w))) << "slot " << slot << " row " << r;
        }
      }
    });
    EXPECT_EQ(slot, slots);
  }
}

std::vector<Shape> Shapes() {
  const std::string kivi2 = "codec=kivi2,page=128,group=64,residual=0,rotate=hadamard,prerope=1";
  return {
      {"codec=kivi2", 64, 64, false, false, 300},           // the defaults, the recall model's shape
      {kivi2, 64, 64, false, true, 300},                    // scattered positions
      {kivi2, 64, 48, true, false, 200},                    // partial NeoX rotation
      {kivi2, 96, 80, false, false, 150},                   // three 32-channel Hadamard blocks
      {kivi2, 48, 48, true, true, 140},                     // three 16-channel blocks (column path: d % 16)
      {"codec=kivi2,page=64,group=32,rotate=hadamard,prerope=1", 32, 32, true, false, 150},  // f16 residual pages
      {"codec=kivi4,page=32,residual=0,rotate=hadamard,prerope=1", 64, 64, false, false, 100},  // 16-byte columns
      {"codec=kivi2,page=32,residual=0,rotate=hadamard,prerope=1", 64, 64, false, false, 100},  // 8-byte columns: reference
      {"codec=kivi2,page=128,group=64,residual=0,prerope=1", 64, 64, false, false, 300},         // no rotation
      {"codec=kivi2,page=128,group=64,residual=0,prerope=1,outliers=0.01", 64, 64, false, false, 200},  // reference
      {"codec=f16,page=16,rotate=hadamard,prerope=1", 64, 64, true, true, 70},
      {"codec=f16,page=16,prerope=1", 16, 16, false, false, 40},
      {"codec=int4,page=16,rotate=hadamard,prerope=1", 64, 64, false, false, 50},  // row-wise keys: reference
  };
}

std::string ShapeName(const ::testing::TestParamInfo<Shape>& info) {
  std::string name = std::to_string(info.index) + "_" + info.param.spec + "_d" + std::to_string(info.param.dim);
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(OddShapes, PreRopeScoresTest, ::testing::ValuesIn(Shapes()), ShapeName);

}  // namespace
}  // namespace kvx::kv
