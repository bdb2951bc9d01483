#include "kv/tier/disk_tier.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "kv/tier/block_format.h"
#include "kv/tier/tier_test_util.h"
#include "util/aligned_buffer.h"

namespace kvx::kv::tier {
namespace {

using testing::TempDir;

BlockKey Key(uint64_t i) { return {i * 0x9e3779b97f4a7c15ull + 1, i}; }
std::string Value(uint64_t i, size_t n = 1000) { return std::string(n, static_cast<char>('a' + i % 26)); }

using Logged = testing::LogLines;

std::unique_ptr<DiskTier> Open(const std::string& dir, uint64_t max_bytes, Logged* logged, int retry_seconds = 30) {
  auto t = DiskTier::Open({.dir = dir, .max_bytes = max_bytes, .retry_seconds = retry_seconds, .log = logged->log()});
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

TEST(DiskTierTest, PutGetEraseAndStats) {
  TempDir dir;
  Logged logged;
  auto t = Open(dir.path(), 1 << 20, &logged);
  EXPECT_FALSE(t->Get(Key(1)).has_value());
  ASSERT_TRUE(t->Put(Key(1), Value(1)).ok());
  EXPECT_EQ(t->Get(Key(1)), Value(1));
  EXPECT_TRUE(std::filesystem::exists(t->PathOf(Key(1))));
  ASSERT_TRUE(t->Put(Key(1), Value(2, 500)).ok());  // replaced
  EXPECT_EQ(t->Get(Key(1)), Value(2, 500));
  TierStats s = t->stats();
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.bytes, 500u);
  EXPECT_EQ(s.blocks, 1u);
  t->Erase(Key(1));
  EXPECT_FALSE(t->Get(Key(1)).has_value());
  EXPECT_FALSE(std::filesystem::exists(t->PathOf(Key(1))));
  EXPECT_EQ(t->stats().bytes, 0u);
  EXPECT_TRUE(logged.lines.empty());
}

// A new tier object on the same directory (a restarted server) hits what
// the old one wrote, keeps its LRU order (file times), and removes the
// temporary files a crash between write and rename left behind.
TEST(DiskTierTest, SurvivesARestart) {
  TempDir dir;
  Logged logged;
  {
    auto t = Open(dir.path(), 3000, &logged);
    for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(t->Put(Key(i), Value(i)).ok());
  }
  std::ofstream(dir.path() + "/." + Key(9).Hex() + ".kvxb.kvx-tmp.123.0") << "half a block";  // OutputFile's name
  auto t = Open(dir.path(), 3000, &logged);
  EXPECT_EQ(t->stats().blocks, 3u);
  EXPECT_EQ(t->stats().bytes, 3000u);
  for (uint64_t i = 0; i < 3; ++i) EXPECT_EQ(t->Get(Key(i)), Value(i)) << i;
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) files += e.is_regular_file();
  EXPECT_EQ(files, 3u);  // the temporary is gone
  // Recency as restored: the Gets above touched 0, 1, 2 in that order, so 0 goes first.
  ASSERT_TRUE(t->Put(Key(3), Value(3)).ok());
  EXPECT_FALSE(t->Get(Key(0)).has_value());
  EXPECT_TRUE(t->Get(Key(1)).has_value());
}

TEST(DiskTierTest, RestartRestoresLeastRecentlyUsedOrder) {
  TempDir dir;
  Logged logged;
  {
    auto t = Open(dir.path(), 3000, &logged);
    for (uint64_t i = 0; i < 3; ++i) {
      ASSERT_TRUE(t->Put(Key(i), Value(i)).ok());
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_TRUE(t->Get(Key(0)).has_value());  // order now 1 (oldest), 2, 0
  }
  auto t = Open(dir.path(), 3000, &logged);
  ASSERT_TRUE(t->Put(Key(3), Value(3)).ok());
  EXPECT_FALSE(t->Get(Key(1)).has_value());  // the least recent before the restart went first
  EXPECT_TRUE(t->Get(Key(0)).has_value());
  EXPECT_TRUE(t->Get(Key(2)).has_value());
  EXPECT_EQ(t->stats().evictions, 1u);
}

TEST(DiskTierTest, TheCapEvictsLeastRecentlyUsed) {
  TempDir dir;
  Logged logged;
  auto t = Open(dir.path(), 3000, &logged);
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(t->Put(Key(i), Value(i)).ok());
  ASSERT_TRUE(t->Get(Key(0)).has_value());
  ASSERT_TRUE(t->Put(Key(3), Value(3)).ok());  // evicts 1
  EXPECT_FALSE(t->Get(Key(1)).has_value());
  EXPECT_FALSE(std::filesystem::exists(t->PathOf(Key(1))));
  for (uint64_t i : {0, 2, 3}) EXPECT_TRUE(t->Get(Key(i)).has_value()) << i;
  EXPECT_LE(t->stats().bytes, 3000u);
  EXPECT_EQ(t->stats().evictions, 1u);
  // A block larger than the whole cap is refused, nothing evicted for it.
  EXPECT_EQ(t->Put(Key(4), Value(4, 3001)).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(t->stats().blocks, 3u);
  // A smaller cap at the next open evicts down to it.
  t.reset();
  t = Open(dir.path(), 2000, &logged);
  EXPECT_EQ(t->stats().blocks, 2u);
}

// A flipped bit in a block file is caught by the block's checksum; the
// caller drops it, so it is never read again, and it is counted.
TEST(DiskTierTest, ACorruptedBlockIsDroppedNotServed) {
  TempDir dir;
  Logged logged;
  auto m = testing::MakeManager("codec=f16", {2, 2, 32, 16}, 256);
  const std::vector<int32_t> tokens = testing::Tokens(32);
  auto seq = testing::FillSequence(*m, 0, tokens, 1);
  ASSERT_TRUE(seq.ok());
  auto space = MakeBlockSpace(m->spec(), 1, 32);
  auto block = EncodeBlock(*space, 0, *m->ExportSequence(*seq), 0);
  ASSERT_TRUE(block.ok());
  auto t = Open(dir.path(), 1 << 20, &logged);
  ASSERT_TRUE(t->Put(block->key, block->bytes).ok());
  {
    std::fstream f(t->PathOf(block->key), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(block->bytes.size() / 2));
    f.put(static_cast<char>(block->bytes[block->bytes.size() / 2] ^ 0x10));
  }
  auto got = t->Get(block->key);
  ASSERT_TRUE(got.has_value());
  const BlockRequest q{&*space, 0, tokens, 0, block->key};
  auto d = DecodeBlock({reinterpret_cast<const uint8_t*>(got->data()), got->size()}, q);
  EXPECT_EQ(d.status().code(), StatusCode::kDataLoss);
  t->DropCorrupt(block->key);
  EXPECT_FALSE(t->Get(block->key).has_value());
  EXPECT_FALSE(std::filesystem::exists(t->PathOf(block->key)));
  EXPECT_EQ(t->stats().errors, 1u);
}

// A full disk (here: a file-size limit, which refuses writes the way a full
// disk does, even for root) stops writing with one error and one log line;
// reads go on; after the retry interval the tier writes again.
TEST(DiskTierTest, AFullDiskStopsWritingWithOneError) {
  TempDir dir;
  Logged logged;
  auto t = Open(dir.path(), 1 << 20, &logged, /*retry_seconds=*/1);
  ASSERT_TRUE(t->Put(Key(0), Value(0)).ok());
  struct sigaction ignore{}, old_action{};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGXFSZ, &ignore, &old_action);
  rlimit old_limit{};
  getrlimit(RLIMIT_FSIZE, &old_limit);
  rlimit small = old_limit;
  small.rlim_cur = 4096;
  setrlimit(RLIMIT_FSIZE, &small);
  const Status first = t->Put(Key(1), Value(1, 10000));
  Status later;
  for (int i = 0; i < 5; ++i) later = t->Put(Key(2 + i), Value(2, 10000));
  setrlimit(RLIMIT_FSIZE, &old_limit);
  sigaction(SIGXFSZ, &old_action, nullptr);
  EXPECT_EQ(first.code(), StatusCode::kIoError);
  EXPECT_NE(first.message().find("too large"), std::string::npos) << first.ToString();
  EXPECT_FALSE(later.ok());
  EXPECT_TRUE(t->writes_stopped());
  EXPECT_EQ(t->stats().errors, 1u);
  ASSERT_EQ(logged.lines.size(), 1u);
  EXPECT_NE(logged.lines[0].find("stopped writing"), std::string::npos) << logged.lines[0];
  EXPECT_EQ(t->Get(Key(0)), Value(0));  // reads go on
  EXPECT_FALSE(t->Get(Key(1)).has_value());
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) files += e.is_regular_file();
  EXPECT_EQ(files, 1u);  // no temporary or partial file left
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_TRUE(t->Put(Key(1), Value(1, 10000)).ok());
  EXPECT_FALSE(t->writes_stopped());
  ASSERT_EQ(logged.lines.size(), 2u);
  EXPECT_NE(logged.lines[1].find("writing again"), std::string::npos);
}

// Bytes at an aligned address (the tier store's BlockEncoder) go out with
// O_DIRECT but for their last partial 4 KiB, which is an ordinary write; on
// a file system without O_DIRECT (tmpfs, on older kernels) all of them are.
// Either way the file holds exactly the bytes, whatever their length.
TEST(DiskTierTest, AlignedBlocksAreWrittenWholeOnAnyFileSystem) {
  for (const std::string under : {"", "/dev/shm"}) {
    if (!under.empty() && !std::filesystem::is_directory(under)) continue;
    TempDir dir(under);
    ASSERT_FALSE(dir.path().empty()) << under;
    Logged logged;
    auto t = Open(dir.path(), 1 << 22, &logged);
    AlignedBuffer bytes;
    for (const size_t n : {100, 4096, 3 * 4096, 3 * 4096 + 100}) {
      bytes.Clear();
      for (size_t i = 0; i < n; ++i) bytes.U8(static_cast<uint8_t>(i * 7 + n));
      ASSERT_TRUE(t->Put(Key(n), bytes.view()).ok()) << under << " " << n;
      EXPECT_EQ(std::filesystem::file_size(t->PathOf(Key(n))), n) << under;
      EXPECT_TRUE(t->Get(Key(n)) == std::string(bytes.view())) << under << " " << n;  // (not printed: long)
    }
    EXPECT_TRUE(logged.lines.empty());
  }
}

TEST(DiskTierTest, BadDirectoriesAreClearErrors) {
  TempDir dir;
  const std::string file = dir.path() + "/a-file";
  std::ofstream(file) << "x";
  EXPECT_EQ(DiskTier::Open({.dir = file}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DiskTier::Open({.dir = ""}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DiskTier::Open({.dir = dir.path(), .max_bytes = 0}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DiskTier::Open({.dir = file + "/sub"}).status().code(), StatusCode::kIoError);
}

}  // namespace
}  // namespace kvx::kv::tier
