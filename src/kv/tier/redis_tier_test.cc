// The Redis tier against a real redis-server started on a free loopback port
// for each test (skipped, saying so, only when redis-server is not
// installed: scripts/install-deps.sh installs it).
#include "kv/tier/redis_tier.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "kv/tier/block_format.h"
#include "kv/tier/tier_test_util.h"

namespace kvx::kv::tier {
namespace {

using Clock = std::chrono::steady_clock;
using testing::FindRedisServer;
using testing::FreeLoopbackPort;
using testing::RedisServer;

using Logged = testing::LogLines;

class RedisTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (FindRedisServer().empty()) GTEST_SKIP() << "redis-server is not installed (scripts/install-deps.sh installs it)";
    ASSERT_TRUE(server_.Start()) << "redis-server did not start on port " << server_.port();
  }
  std::unique_ptr<RedisTier> Open(Logged* logged, int retry_seconds = 5, int command_timeout_ms = 500) {
    auto t = RedisTier::Open({.url = server_.url(), .command_timeout_ms = command_timeout_ms,
                              .retry_seconds = retry_seconds, .log = logged->log()});
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return std::move(t).value();
  }
  RedisServer server_;
};

// A real block of a small model shape, for tenant `salt`.
struct Block {
  std::unique_ptr<KVManager> m;
  BlockSpace space;
  std::vector<int32_t> tokens = testing::Tokens(64);
  EncodedBlock encoded;
  Block(uint64_t model, uint64_t salt, const std::string& spec = "codec=int8") {
    m = testing::MakeManager(spec, {4, 2, 64, 16}, 256);
    auto seq = testing::FillSequence(*m, salt, tokens, 3);
    space = *MakeBlockSpace(m->spec(), model, 32);
    encoded = *EncodeBlock(space, salt, *m->ExportSequence(*seq), 1);
  }
  Result<ParsedBlock> Decode(const std::string& bytes, uint64_t salt) const {
    const BlockRequest q{&space, salt, tokens, 1, BlockKeys(space, salt, tokens)[1]};
    return DecodeBlock({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, q);
  }
};

TEST_F(RedisTierTest, PutGetRoundTrip) {
  Logged logged;
  auto t = Open(&logged);
  EXPECT_TRUE(t->available());
  const Block b(1, 2);
  EXPECT_FALSE(t->Get(b.encoded.key).has_value());
  ASSERT_TRUE(t->Put(b.encoded.key, b.encoded.bytes).ok());
  auto got = t->Get(b.encoded.key);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, b.encoded.bytes);
  EXPECT_TRUE(b.Decode(*got, 2).ok());
  t->Erase(b.encoded.key);
  EXPECT_FALSE(t->Get(b.encoded.key).has_value());
  const TierStats s = t->stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 2u);
  EXPECT_EQ(s.puts, 1u);
  EXPECT_EQ(s.errors, 0u);
  EXPECT_TRUE(logged.lines.empty());
}

// Two tier objects (two servers) share what either stored — keyed the same
// because the key is the same in every process (block_key_test).
TEST_F(RedisTierTest, TwoTiersShareABlock) {
  Logged la, lb;
  auto a = Open(&la);
  auto b = Open(&lb);
  const Block writer(1, 2), reader(1, 2);  // built independently, as two servers would
  ASSERT_EQ(writer.encoded.key, reader.encoded.key);
  ASSERT_TRUE(a->Put(writer.encoded.key, writer.encoded.bytes).ok());
  auto got = b->Get(BlockKeys(reader.space, 2, reader.tokens)[1]);
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(reader.Decode(*got, 2).ok());
  EXPECT_EQ(b->stats().hits, 1u);
}

// Another model, spec or tenant computes other keys (a miss); even a value
// found under a forged key is refused by the block's identity.
TEST_F(RedisTierTest, AnotherModelSpecOrSaltIsNeverAHit) {
  Logged logged;
  auto t = Open(&logged);
  const Block stored(1, 2);
  ASSERT_TRUE(t->Put(stored.encoded.key, stored.encoded.bytes).ok());
  const Block other_model(9, 2), other_spec(1, 2, "codec=int4"), other_salt(1, 3);
  for (const Block* other : {&other_model, &other_spec, &other_salt}) {
    EXPECT_NE(other->encoded.key, stored.encoded.key);
    EXPECT_FALSE(t->Get(other->encoded.key).has_value());
  }
  auto forged = t->Get(stored.encoded.key);
  ASSERT_TRUE(forged.has_value());
  EXPECT_EQ(other_salt.Decode(*forged, 3).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(other_model.Decode(*forged, 2).status().code(), StatusCode::kNotFound);
}

TEST_F(RedisTierTest, ACorruptedValueIsRejectedByItsChecksum) {
  Logged logged;
  auto t = Open(&logged);
  const Block b(1, 2);
  std::string bad = b.encoded.bytes;
  bad[bad.size() - 100] ^= 0x01;
  ASSERT_TRUE(t->Put(b.encoded.key, bad).ok());
  auto got = t->Get(b.encoded.key);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(b.Decode(*got, 2).status().code(), StatusCode::kDataLoss);
  t->DropCorrupt(b.encoded.key);
  EXPECT_FALSE(t->Get(b.encoded.key).has_value());
  EXPECT_EQ(t->stats().errors, 1u);
}

// Redis killed mid-run: every call returns at once as a miss or a refused
// write (no exception, no hang, no SIGPIPE death), one line is logged; when
// Redis is back the tier reconnects after its retry interval and says so.
TEST_F(RedisTierTest, RedisKilledMidRunMissesWithoutHanging) {
  Logged logged;
  auto t = Open(&logged, /*retry_seconds=*/1);
  const Block b(1, 2);
  ASSERT_TRUE(t->Put(b.encoded.key, b.encoded.bytes).ok());
  server_.Kill();
  const auto start = Clock::now();
  // A large write first: it meets the closed socket (EPIPE; SIGPIPE without the tier's guard).
  EXPECT_FALSE(t->Put(b.encoded.key, std::string(8 << 20, 'x')).ok());
  for (int i = 0; i < 20; ++i) {
    EXPECT_FALSE(t->Get(b.encoded.key).has_value());
    EXPECT_FALSE(t->Put(b.encoded.key, b.encoded.bytes).ok());
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_LT(seconds, 1.0) << "41 calls against a dead Redis took " << seconds << " s";
  EXPECT_FALSE(t->available());
  ASSERT_EQ(logged.lines.size(), 1u);
  EXPECT_NE(logged.lines[0].find("unavailable"), std::string::npos) << logged.lines[0];
  EXPECT_GE(t->stats().errors, 21u);

  RedisServer again(server_.port());
  ASSERT_TRUE(again.Start());
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_TRUE(t->Put(b.encoded.key, b.encoded.bytes).ok());
  EXPECT_TRUE(t->Get(b.encoded.key).has_value());
  ASSERT_EQ(logged.lines.size(), 2u);
  EXPECT_NE(logged.lines[1].find("available again"), std::string::npos) << logged.lines[1];
}

// A Redis that stops answering (SIGSTOP) costs one command timeout, then the
// tier is unavailable and calls return at once.
TEST_F(RedisTierTest, AStuckRedisCostsOneTimeout) {
  Logged logged;
  auto t = Open(&logged, /*retry_seconds=*/60, /*command_timeout_ms=*/200);
  const Block b(1, 2);
  ASSERT_TRUE(t->Put(b.encoded.key, b.encoded.bytes).ok());
  server_.Pause();
  const auto start = Clock::now();
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(t->Get(b.encoded.key).has_value());
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  server_.Resume();
  EXPECT_LT(seconds, 1.0);
  EXPECT_GE(seconds, 0.15);  // the first Get waited for its timeout
  EXPECT_EQ(logged.lines.size(), 1u);
}

TEST(RedisTierOpenTest, ARedisDownAtStartIsUnavailableNotAnError) {
  Logged logged;
  auto t = RedisTier::Open({.url = "redis://127.0.0.1:" + std::to_string(FreeLoopbackPort()), .log = logged.log()});
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE((*t)->available());
  EXPECT_FALSE((*t)->Get(BlockKey{1, 2}).has_value());
  EXPECT_EQ(logged.lines.size(), 1u);
}

TEST(RedisTierOpenTest, UrlsAreParsedStrictly) {
  auto a = ParseRedisUrl("redis://127.0.0.1:6380/3");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 6380);
  EXPECT_EQ(a->db, 3);
  auto b = ParseRedisUrl("redis://cache-1.internal");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->port, 6379);
  EXPECT_EQ(b->db, 0);
  auto c = ParseRedisUrl("redis://[::1]:7000");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->host, "::1");
  for (const char* bad : {"", "127.0.0.1:6379", "http://h:1", "redis://", "redis://:6379", "redis://h:0",
                          "redis://h:65536", "redis://h:port", "redis://h:1/x", "redis://user:pw@h:1",
                          "redis://h h:1", "redis://[::1", "redis://h:1/-1"}) {
    auto r = ParseRedisUrl(bad);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("redis://HOST:PORT"), std::string::npos) << bad;
  }
  EXPECT_EQ(RedisTier::Open({.url = "redis://h:1", .command_timeout_ms = 0}).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvx::kv::tier
