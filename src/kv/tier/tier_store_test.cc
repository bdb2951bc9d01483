// LoadImage (kv/tier/tier_store.h): the image of a lookup's blocks from
// block k, imported over a sequence holding blocks 0..k-1 (what the pool
// already has), is the original sequence page for page; a load that is not
// consecutive blocks from first_block, or prompt tokens that end before its
// blocks, is InvalidArgument.
#include "kv/tier/tier_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kv/tier/disk_tier.h"
#include "kv/tier/tier_test_util.h"

namespace kvx::kv::tier {
namespace {

using testing::FillSequence;
using testing::MakeManager;
using testing::Tokens;

constexpr char kSpec[] = "codec=f16,page=16";
constexpr int kBlock = 32;

std::span<const uint8_t> Bytes(const std::string& s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }

struct Source {
  std::unique_ptr<KVManager> m;
  SeqId seq = -1;
  BlockSpace space;
  std::vector<int32_t> tokens = Tokens(3 * kBlock + 5);
  std::vector<std::string> encoded;  // blocks 0..2
};

Source MakeSource() {
  Source s;
  s.m = MakeManager(kSpec, {3, 2, 64, 16}, 512);
  s.seq = FillSequence(*s.m, 7, s.tokens, 3).value();
  s.space = MakeBlockSpace(s.m->spec(), 0xabc, kBlock).value();
  const KVManager::SequenceImage image = s.m->ExportSequence(s.seq).value();
  for (int b = 0; b < 3; ++b) s.encoded.push_back(EncodeBlock(s.space, 7, image, b).value().bytes);
  return s;
}

// Blocks first..first+n-1 of the source, decoded as a lookup would return them.
TierLoad Load(const Source& s, int first, int n) {
  TierLoad load;
  load.first_block = first;
  const std::vector<BlockKey> keys = BlockKeys(s.space, 7, s.tokens);
  for (int b = first; b < first + n; ++b) {
    load.blocks.push_back(DecodeBlock(Bytes(s.encoded[b]), {&s.space, 7, s.tokens, b, keys[b]}).value());
  }
  return load;
}

TEST(LoadImageTest, OverThePoolsPrefixItIsTheSequence) {
  const Source s = MakeSource();
  auto pool = MakeManager(kSpec, {3, 2, 64, 16}, 512);
  // The pool holds block 0 (loaded earlier); the load brings blocks 1 and 2.
  const SeqId head = pool->ImportSequence(LoadImage(Load(s, 0, 1), s.tokens, s.space, 7).value()).value();
  const TierLoad load = Load(s, 1, 2);  // the image's pages point into its blocks
  const KVManager::SequenceImage image = LoadImage(load, s.tokens, s.space, 7).value();
  EXPECT_TRUE(image.tables[0].pages[0].empty());  // the pool's pages: not in the image
  const SeqId seq = pool->ImportSequence(image, {head, kBlock}).value();
  const KVManager::SequenceImage got = pool->ExportSequence(seq).value();
  const KVManager::SequenceImage want = s.m->ExportSequence(s.seq).value();
  ASSERT_EQ(got.tokens, std::vector<int32_t>(s.tokens.begin(), s.tokens.begin() + 3 * kBlock));
  EXPECT_EQ(got.positions, std::vector<int32_t>(want.positions.begin(), want.positions.begin() + 3 * kBlock));
  for (size_t t = 0; t < got.tables.size(); ++t) {
    ASSERT_EQ(got.tables[t].pages.size(), 6u);
    for (size_t p = 0; p < 6; ++p) {
      EXPECT_TRUE(std::equal(got.tables[t].pages[p].begin(), got.tables[t].pages[p].end(),
                             want.tables[t].pages[p].begin(), want.tables[t].pages[p].end()))
          << "table " << t << " page " << p;
    }
  }
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

// The one block-level import (block_format.h's PrefixImage was folded into
// it) keeps that function's checks: consecutive blocks of one prompt, the
// tenant, the block space.
TEST(LoadImageTest, ABadLoadIsInvalidArgument) {
  const Source s = MakeSource();
  TierLoad gap = Load(s, 2, 1);
  gap.first_block = 1;  // block 2 where block 1 belongs
  EXPECT_EQ(LoadImage(gap, s.tokens, s.space, 7).status().code(), StatusCode::kInvalidArgument);
  TierLoad swapped = Load(s, 0, 2);
  std::swap(swapped.blocks[0], swapped.blocks[1]);
  EXPECT_EQ(LoadImage(swapped, s.tokens, s.space, 7).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadImage(Load(s, 1, 1), s.tokens, s.space, 7).status().code(), StatusCode::kOk);  // from block 1: fine
  EXPECT_EQ(LoadImage(Load(s, 0, 2), s.tokens, s.space, 8).status().code(), StatusCode::kInvalidArgument);  // tenant
  BlockSpace other = s.space;
  other.model_fingerprint ^= 1;
  EXPECT_EQ(LoadImage(Load(s, 0, 2), s.tokens, other, 7).status().code(), StatusCode::kInvalidArgument);
  other = s.space;
  other.spec_fingerprint ^= 1;
  EXPECT_EQ(LoadImage(Load(s, 0, 2), s.tokens, other, 7).status().code(), StatusCode::kInvalidArgument);
  std::vector<int32_t> other_tokens = s.tokens;
  other_tokens[kBlock + 3] += 1;  // block 1's tokens differ from the prompt's
  EXPECT_EQ(LoadImage(Load(s, 0, 2), other_tokens, s.space, 7).status().code(), StatusCode::kInvalidArgument);
  const std::vector<int32_t> short_prompt(s.tokens.begin(), s.tokens.begin() + 2 * kBlock);
  Result<KVManager::SequenceImage> r = LoadImage(Load(s, 1, 2), short_prompt, s.space, 7);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("needs the 96 tokens"), std::string::npos) << r.status().ToString();
}

// Chunks in the tiers (chunk reuse): a chunk's image, its last page
// partial, written by one store to a disk tier and looked up by a new store
// on the same directory (a restart) comes back page for page; another
// tenant's lookup misses; a flipped bit in its file is a miss, dropped and
// counted, never served.
TEST(TierStoreChunkTest, AChunkSurvivesARestartAndADamagedOneIsAMiss) {
  testing::TempDir dir;
  auto m = MakeManager(kSpec, {3, 2, 64, 16}, 512);
  const std::vector<int32_t> chunk = Tokens(37);  // pages of 16: two full, one partial
  const KVManager::SequenceImage want = m->ExportSequence(FillSequence(*m, 7, chunk, 3).value()).value();
  const BlockSpace space = MakeBlockSpace(m->spec(), 0xabc, kBlock).value();
  auto open = [&] {
    std::vector<std::unique_ptr<Tier>> tiers;
    tiers.push_back(DiskTier::Open({.dir = dir.path(), .log = [](const std::string&) {}}).value());
    return TierStore::Create(space, std::move(tiers)).value();
  };
  {
    auto writer = open();
    writer->WriteChunk(7, want);
    writer->Flush();
    EXPECT_EQ(writer->counters().blocks_written, 1u);
  }
  auto store = open();
  auto lookup = [&](uint64_t salt) {
    LookupRequest q;
    q.salt = salt;
    q.chunks = {chunk};
    auto load = store->Lookup(std::move(q));
    store->Flush();
    EXPECT_TRUE(load->done());
    return std::move(load->result().chunks.at(0));
  };
  std::optional<ParsedBlock> found = lookup(7);
  ASSERT_TRUE(found.has_value());
  TierLoad one;
  one.blocks.push_back(std::move(*found));
  const KVManager::SequenceImage image = LoadImage(one, chunk, ChunkSpace(space, 37).value(), 7).value();
  auto pool = MakeManager(kSpec, {3, 2, 64, 16}, 512);
  const KVManager::SequenceImage got = pool->ExportSequence(pool->ImportSequence(image).value()).value();
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.positions, want.positions);
  EXPECT_EQ(got.block_hashes, want.block_hashes);
  for (size_t t = 0; t < want.tables.size(); ++t) {
    ASSERT_EQ(got.tables[t].pages.size(), 3u);
    for (size_t p = 0; p < 3; ++p) {
      EXPECT_TRUE(std::ranges::equal(got.tables[t].pages[p], want.tables[t].pages[p])) << "table " << t << " page " << p;
    }
  }
  EXPECT_FALSE(lookup(8).has_value());  // another tenant
  const std::string path = dir.path() + "/" + ChunkKey(space, 7, chunk).Hex() + ".kvxb";
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(2000);
    const char c = static_cast<char>(f.get());
    f.seekp(2000);
    f.put(static_cast<char>(c ^ 0x08));
  }
  EXPECT_FALSE(lookup(7).has_value());
  EXPECT_EQ(store->counters().corrupt_blocks, 1u);
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace kvx::kv::tier
