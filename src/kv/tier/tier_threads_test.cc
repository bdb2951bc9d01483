// The tiers are thread-safe (tier.h): an I/O thread and the scheduler may
// call one tier at once. Several threads Put, Get and Erase on one disk tier
// and one Redis tier; every value read is whole, the disk cap holds, the
// counters add up. Labelled `threads` (CMakeLists.txt), so the TSan stage
// runs it.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "kv/tier/disk_tier.h"
#include "kv/tier/redis_tier.h"
#include "kv/tier/tier_store.h"
#include "kv/tier/tier_test_util.h"

namespace kvx::kv::tier {
namespace {

constexpr int kThreads = 4, kRounds = 60, kKeys = 12;

// Each key's value is its index repeated, so a torn or mixed read shows.
std::string ValueOf(int k) { return std::string(2000 + 100 * k, static_cast<char>('A' + k)); }

// Hammers `tier` from kThreads threads; returns the bad reads.
int Hammer(Tier& tier) {
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        const int k = (i * 7 + t * 3) % kKeys;
        const BlockKey key{static_cast<uint64_t>(k) + 1, 42};
        switch ((i + t) % 3) {
          case 0: (void)tier.Put(key, ValueOf(k)); break;
          case 1:
            if (auto v = tier.Get(key); v.has_value() && *v != ValueOf(k)) ++bad;
            break;
          default: tier.Erase(key);
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  return bad.load();
}

TEST(TierThreadsTest, DiskTierUnderConcurrentCalls) {
  testing::TempDir dir;
  auto t = DiskTier::Open({.dir = dir.path(), .max_bytes = 12000, .log = [](const std::string&) {}});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(Hammer(**t), 0);
  const TierStats s = (*t)->stats();
  EXPECT_LE(s.bytes, 12000u);
  EXPECT_EQ(s.hits + s.misses, static_cast<uint64_t>(kThreads * kRounds / 3));
  EXPECT_EQ(s.errors, 0u);
}

TEST(TierThreadsTest, RedisTierUnderConcurrentCalls) {
  if (testing::FindRedisServer().empty()) GTEST_SKIP() << "redis-server is not installed (scripts/install-deps.sh installs it)";
  testing::RedisServer server;
  ASSERT_TRUE(server.Start());
  auto t = RedisTier::Open({.url = server.url(), .log = [](const std::string&) {}});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(Hammer(**t), 0);
  const TierStats s = (*t)->stats();
  EXPECT_EQ(s.hits + s.misses, static_cast<uint64_t>(kThreads * kRounds / 3));
  EXPECT_EQ(s.errors, 0u);
}

// The store's I/O thread serves a lookup queued while it writes a long
// sequence's blocks at the next block, not after the last: the lookup is
// done while most of the 128 blocks (each a synced file) are still to be written.
TEST(TierThreadsTest, ALookupDoesNotWaitForAWholeSnapshot) {
  constexpr int kBlock = 32, kBlocks = 128;
  auto m = testing::MakeManager("codec=f16,page=16", {3, 2, 64, 16}, kBlocks * kBlock + 16);
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> tokens = testing::Tokens(kBlocks * kBlock + 1);
  const SeqId seq = testing::FillSequence(*m, 0, tokens, 1).value();
  testing::TempDir dir;
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(DiskTier::Open({.dir = dir.path(), .max_bytes = 1ull << 30, .log = [](const std::string&) {}}).value());
  auto store = TierStore::Create(MakeBlockSpace(m->spec(), 1, kBlock).value(), std::move(tiers)).value();
  std::optional<BlockSnapshot> snapshot = store->Snapshot(*m, seq);
  ASSERT_TRUE(snapshot.has_value());
  ASSERT_EQ(snapshot->blocks.size(), static_cast<size_t>(kBlocks));
  store->Write(std::move(*snapshot));
  while (store->counters().blocks_written == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  LookupRequest q;
  q.tokens = testing::Tokens(2 * kBlock + 1, 7);  // another prompt: a miss, answered at once
  q.max_blocks = 2;
  auto load = store->Lookup(q);
  while (!load->done()) std::this_thread::sleep_for(std::chrono::microseconds(200));
  EXPECT_LT(store->counters().blocks_written, static_cast<uint64_t>(kBlocks) / 2);
  store->Flush();
  EXPECT_EQ(store->counters().blocks_written, static_cast<uint64_t>(kBlocks));
}

}  // namespace
}  // namespace kvx::kv::tier
