#include "kv/policy/head_typing.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "kv/kv_manager.h"

namespace kvx::kv {
namespace {

std::string TempFile(const std::string& name) {
  return std::string(::testing::TempDir()) + "/" + name;
}

// 2 layers x 2 kv heads; (layer 1, head 0) scores highest, then (0, 1).
std::string WriteTable(const std::string& name) {
  HeadTable t;
  t.method = "duo";
  t.n_layers = 2;
  t.n_kv_heads = 2;
  t.scores = {0.1, 0.7, 0.9, 0.05};
  const std::string path = TempFile(name);
  EXPECT_TRUE(t.Save(path).ok());
  return path;
}

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

std::vector<int32_t> LivePositions(const SequenceKV& kv, int l, int h) {
  std::vector<int32_t> out;
  float k[16], v[16];
  for (int s = 0; s < kv.Length(l, h); ++s) {
    int32_t p;
    kv.ReadEntry(l, h, s, k, v, &p);
    if (p != kDeadPosition) out.push_back(p);
  }
  return out;
}

TEST(HeadTableTest, SavesLoadsAndRanks) {
  const std::string path = WriteTable("rank.json");
  auto t = HeadTable::Load(path);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->scores, (std::vector<double>{0.1, 0.7, 0.9, 0.05}));
  EXPECT_EQ(t->RetrievalMask(0.25), (std::vector<uint8_t>{0, 0, 1, 0}));
  EXPECT_EQ(t->RetrievalMask(0.5), (std::vector<uint8_t>{0, 1, 1, 0}));
  EXPECT_EQ(t->RetrievalMask(0.0), (std::vector<uint8_t>{0, 0, 0, 0}));
  EXPECT_EQ(t->RetrievalMask(1.0), (std::vector<uint8_t>{1, 1, 1, 1}));
  // Ties: the lower index first.
  t->scores = {1, 1, 1, 1};
  EXPECT_EQ(t->RetrievalMask(0.5), (std::vector<uint8_t>{1, 1, 0, 0}));
  EXPECT_FALSE(HeadTable::Load(TempFile("missing.json")).ok());
  std::ofstream(TempFile("bad.json")) << "{\"n_layers\": 2, \"n_kv_heads\": 2, \"scores\": [[1, 2]]}";
  EXPECT_FALSE(HeadTable::Load(TempFile("bad.json")).ok());
}

TEST(HeadTypingTest, RetrievalHeadsKeepEverythingStreamingHeadsKeepSinksAndWindow) {
  const std::string path = WriteTable("duo.json");
  for (const std::string codec : {"codec=f16,page=8", "codec=kivi2,page=8,residual=8"}) {
    SCOPED_TRACE(codec);
    auto r = ResolveKVSpec(codec + ";policy=duo,heads=" + path + ",retrieval=0.5,sinks=4,window=20",
                           KVLayout{2, 2, 16, 8}, 4096, 1);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    auto m = std::move(KVManager::Create(std::move(*r))).value();
    const SeqId a = m->AddSequence();
    Step(*m, a, 60);
    for (int i = 0; i < 100; ++i) Step(*m, a, 1);
    ASSERT_TRUE(m->CheckInvariants().ok()) << m->CheckInvariants().ToString();
    std::vector<int32_t> all(160), streaming = {0, 1, 2, 3};
    for (int p = 0; p < 160; ++p) all[p] = p;
    for (int p = 140; p < 160; ++p) streaming.push_back(p);
    // Retrieval: (0, 1) and (1, 0), the top half by score.
    EXPECT_EQ(LivePositions(m->kv(a), 0, 1), all);
    EXPECT_EQ(LivePositions(m->kv(a), 1, 0), all);
    EXPECT_EQ(LivePositions(m->kv(a), 0, 0), streaming);
    EXPECT_EQ(LivePositions(m->kv(a), 1, 1), streaming);
    // The streaming heads' pages returned to the pool.
    EXPECT_LE(m->kv(a).table(0, 0).num_pages(), 1 + 20 / 8 + 2);
    EXPECT_EQ(m->kv(a).table(0, 1).num_pages(), 20);
  }
}

TEST(HeadTypingTest, RazorWindowGrowsWithTheSequenceAndOnceWaitsForCompress) {
  const std::string path = WriteTable("razor.json");
  auto r = ResolveKVSpec("codec=f16,page=8;policy=razor,heads=" + path +
                             ",retrieval=0.25,sinks=4,window=8,window_fraction=0.2,mode=once",
                         KVLayout{2, 2, 16, 8}, 4096, 1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto m = std::move(KVManager::Create(std::move(*r))).value();
  const SeqId a = m->AddSequence();
  Step(*m, a, 200);
  EXPECT_EQ(m->kv(a).LiveEntries(0, 0), 200);  // once: nothing before Compress
  ASSERT_TRUE(m->Compress(a).ok());
  EXPECT_EQ(m->kv(a).LiveEntries(0, 0), 4 + 40);  // window max(8, 0.2 * 200)
  EXPECT_EQ(m->kv(a).LiveEntries(1, 0), 200);     // the one retrieval head
  EXPECT_TRUE(m->CheckInvariants().ok());
}

TEST(HeadTypingTest, BadInputIsRejected) {
  const std::string path = WriteTable("bad_input.json");
  const KVLayout layout{2, 2, 16, 8};
  auto no_file = ResolveKVSpec("codec=f16;policy=duo", layout, 64, 1);
  ASSERT_FALSE(no_file.ok());
  EXPECT_NE(no_file.status().message().find("calibrate-heads"), std::string::npos);
  EXPECT_FALSE(ResolveKVSpec("codec=f16;policy=duo,heads=/nonexistent.json", layout, 64, 1).ok());
  EXPECT_FALSE(ResolveKVSpec("codec=f16;policy=duo,heads=" + path + ",retrieval=2", layout, 64, 1).ok());
  EXPECT_FALSE(ResolveKVSpec("codec=f16;policy=razor,heads=" + path + ",ratio=0.5", layout, 64, 1).ok());
  auto shape = ResolveKVSpec("codec=f16;policy=duo,heads=" + path, KVLayout{3, 2, 16, 8}, 64, 1);
  ASSERT_FALSE(shape.ok());
  EXPECT_NE(shape.status().message().find("3 x 2"), std::string::npos) << shape.status().ToString();
}

}  // namespace
}  // namespace kvx::kv
