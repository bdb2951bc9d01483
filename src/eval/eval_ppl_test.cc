// kv.live_fraction of `kvx eval` (LiveSlotFraction): live entries over the
// slots of the pages the tables list, summed over every (layer, kv head), on
// caches whose answer is known by construction.
#include "eval/eval_ppl.h"

#include <gtest/gtest.h>

#include <vector>

#include "kv/block_pool.h"
#include "kv/sequence_kv.h"

namespace kvx::eval {
namespace {

constexpr int kLayers = 2, kHeads = 2, kDim = 16, kPage = 16;

class LiveSlotFractionTest : public ::testing::Test {
 protected:
  LiveSlotFractionTest() : layout_{kLayers, kHeads, kDim, kPage} {
    pool_ = std::move(kv::BlockPool::Create({.budget_bytes = 64 * kv::PageBytes(layout_, kv::CodecId::kF16),
                                             .page_bytes = kv::PageBytes(layout_, kv::CodecId::kF16)}))
                .value();
    seq_ = std::make_unique<kv::SequenceKV>(pool_.get(), layout_, kv::CodecId::kF16);
  }
  // Appends n tokens (positions 0..n-1) to every layer.
  void Fill(int n) {
    std::vector<int32_t> pos(n);
    std::vector<float> k(static_cast<size_t>(n) * kHeads * kDim), v(k.size());
    for (int i = 0; i < n; ++i) pos[i] = i;
    for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<float>(i % 7), v[i] = -static_cast<float>(i % 5);
    for (int l = 0; l < kLayers; ++l) ASSERT_TRUE(seq_->Append(l, n, pos.data(), k.data(), v.data()).ok());
  }
  kv::KVLayout layout_;
  std::unique_ptr<kv::BlockPool> pool_;
  std::unique_ptr<kv::SequenceKV> seq_;
};

TEST_F(LiveSlotFractionTest, EmptyCacheCountsAsDense) { EXPECT_EQ(LiveSlotFraction(*seq_), 1.0); }

TEST_F(LiveSlotFractionTest, WholePagesAreDenseAndAPartialLastPageIsNot) {
  Fill(4 * kPage);
  EXPECT_EQ(LiveSlotFraction(*seq_), 1.0);
  Fill(kPage / 2);  // a fifth page per table, half written: 72 of 80 slots
  EXPECT_DOUBLE_EQ(LiveSlotFraction(*seq_), 72.0 / 80.0);
}

TEST_F(LiveSlotFractionTest, RemovalsLeaveHalfEmptyPagesUntilCompaction) {
  Fill(4 * kPage);  // 4 pages of 16 per table, 4 tables
  // Layer 0, both heads: every other slot removed, so each page keeps 8 of
  // its 16 slots. Layer 1 head 1: page 1 removed whole (it leaves the chain).
  std::vector<int> even, page1;
  for (int s = 0; s < 4 * kPage; s += 2) even.push_back(s);
  for (int s = kPage; s < 2 * kPage; ++s) page1.push_back(s);
  for (int h = 0; h < kHeads; ++h) ASSERT_TRUE(seq_->RemoveEntries(0, h, even).ok());
  ASSERT_TRUE(seq_->RemoveEntries(1, 1, page1).ok());
  // live 32 + 32 + 64 + 48 over slots 64 + 64 + 64 + 48.
  EXPECT_DOUBLE_EQ(LiveSlotFraction(*seq_), 176.0 / 240.0);

  // Compaction packs pages 0..2 of the layer-0 tables (24 live) into 2
  // (a row-wise table's last page stays: appends still write into it); the
  // dense tables stay as they are. live 176 over 48 + 48 + 64 + 48 slots:
  // the fraction of the slots summed, not the mean of the tables' fractions
  // (which would be 5/6).
  for (int l = 0; l < kLayers; ++l) {
    for (int h = 0; h < kHeads; ++h) ASSERT_TRUE(seq_->Compact(l, h).ok());
  }
  ASSERT_TRUE(seq_->CheckTables().ok());
  EXPECT_EQ(seq_->table(0, 0).num_pages(), 3);
  EXPECT_DOUBLE_EQ(LiveSlotFraction(*seq_), 176.0 / 208.0);
}

}  // namespace
}  // namespace kvx::eval
