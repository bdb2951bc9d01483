#include "kv/tier/block_key.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <set>
#include <string>
#include <vector>

#include "kv/tier/tier_test_util.h"

namespace kvx::kv::tier {
namespace {

using testing::Tokens;

const KVLayout kLayout{4, 2, 64, 16};

BlockSpace Space(const std::string& spec, uint64_t model = 0x1234, int block_tokens = 32) {
  auto r = ResolveKVSpec(spec, kLayout, 1024, 1);
  EXPECT_TRUE(r.ok()) << spec << ": " << r.status().ToString();
  auto s = MakeBlockSpace(*r, model, block_tokens);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return *s;
}

std::string KeysHex(const BlockSpace& space, uint64_t salt, const std::vector<int32_t>& tokens) {
  std::string out;
  for (const BlockKey& k : BlockKeys(space, salt, tokens)) out += k.Hex() + " ";
  return out;
}

TEST(BlockKeyTest, SameKeysFromIndependentlyBuiltSpaces) {
  const std::vector<int32_t> t = Tokens(100);
  EXPECT_EQ(KeysHex(Space("codec=int4"), 7, t), KeysHex(Space("codec=int4"), 7, t));
  EXPECT_EQ(BlockKeys(Space("codec=f16"), 7, t).size(), 3u);  // full blocks only
}

// The keys a fixed prompt gets are pinned: they must be the same in every
// process and on every machine, so a change of the derivation (which would
// strand every stored block) must be deliberate — bump kvx-tier-key-v1 and
// the Redis prefix then, and update this value.
TEST(BlockKeyTest, KeysArePinnedAcrossBuildsAndProcesses) {
  const BlockSpace space = Space("codec=f16");
  const std::vector<int32_t> t = Tokens(64);
  const std::string here = KeysHex(space, 42, t);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // another process: its own address space from here on
    close(fds[0]);
    const std::string there = KeysHex(Space("codec=f16"), 42, Tokens(64));
    const ssize_t n = write(fds[1], there.data(), there.size());
    _exit(n == static_cast<ssize_t>(there.size()) ? 0 : 1);
  }
  close(fds[1]);
  std::string there;
  char buf[256];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) there.append(buf, n);
  close(fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(here, there);
  EXPECT_EQ(here, "9df1ce0860c7d54125ba9de86ea6178f 3446b3785f46e6434223723dd1ed0c6f ") << "spec fingerprint " << std::hex << space.spec_fingerprint;
}

TEST(BlockKeyTest, EveryIngredientChangesTheKey) {
  const std::vector<int32_t> t = Tokens(64);
  const BlockSpace base = Space("codec=f16");
  const std::vector<BlockKey> k = BlockKeys(base, 7, t);
  ASSERT_EQ(k.size(), 2u);
  std::set<std::string> seen = {k[1].Hex()};
  auto distinct = [&](const BlockKey& key, const char* what) {
    EXPECT_TRUE(seen.insert(key.Hex()).second) << what << " did not change the key";
  };
  distinct(BlockKeys(Space("codec=f16", 0x1235), 7, t)[1], "the model fingerprint");
  distinct(BlockKeys(base, 8, t)[1], "the tenant salt");
  distinct(BlockKeys(Space("codec=f16", 0x1234, 16), 7, t)[3], "the block size");
  for (const char* spec : {"codec=f32", "codec=int8", "codec=int4,rotate=none", "codec=int4,bits=k4v2", "codec=int4,group=16",
                           "codec=int4,sym=1", "codec=int4,clip=1", "codec=kivi4,page=16", "codec=kivi4,residual=64",
                           "codec=kivi4,prerope=1", "codec=f16,prerope=1", "codec=int4,rotate=hadamard",
                           "codec=int4,rotate=values", "codec=int4,sinks=16", "codec=int4,outliers=0.01",
                           "codec=int4,bits.1=k8v8", "codec=f16,page=32"}) {
    distinct(BlockKeys(Space(spec), 7, t)[1], spec);
  }
  // Block 1's key names tokens 0..63: a change in block 0 changes it; a
  // change in block 1 leaves block 0's key alone.
  std::vector<int32_t> u = t;
  u[0] += 1;
  distinct(BlockKeys(base, 7, u)[1], "a token of the block before");
  EXPECT_NE(BlockKeys(base, 7, u)[0], k[0]);
  u = t;
  u[63] += 1;
  distinct(BlockKeys(base, 7, u)[1], "a token of the block");
  EXPECT_EQ(BlockKeys(base, 7, u)[0], k[0]);
}

TEST(BlockKeyTest, TwoSpellingsOfOneSpecGiveOneFingerprint) {
  const uint64_t int4 = Space("codec=int4").spec_fingerprint;
  EXPECT_EQ(Space("codec=int4,bits=k4v4,group=32,rotate=hadamard").spec_fingerprint, int4);
  EXPECT_EQ(Space("codec=int4,bits=4;budget=64M").spec_fingerprint, int4);          // the budget stores nothing
  EXPECT_EQ(Space("codec=int4;policy=h2o,budget=256").spec_fingerprint, int4);      // policies choose, not encode
  EXPECT_EQ(Space("codec=kivi4,page=16,residual=32").spec_fingerprint, Space("codec=kivi4,page=16").spec_fingerprint);
  EXPECT_EQ(Space(" codec = f16 , page = 16 ").spec_fingerprint, Space("").spec_fingerprint);
}

TEST(BlockKeyTest, BlockSizeMustBeWholePages) {
  auto spec = ResolveKVSpec("codec=f16,page=32", kLayout, 1024, 1);
  ASSERT_TRUE(spec.ok());
  for (int bad : {0, -32, 16, 48, 2 * kMaxBlockTokens}) {
    auto s = MakeBlockSpace(*spec, 1, bad);
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.status().message().find("whole number of pages"), std::string::npos);
  }
  EXPECT_TRUE(MakeBlockSpace(*spec, 1, 64).ok());
}

TEST(BlockKeyTest, HexRoundTrips) {
  const BlockKey k{0x0123456789abcdefull, 0xfedcba9876543210ull};
  EXPECT_EQ(k.Hex(), "fedcba98765432100123456789abcdef");
  EXPECT_EQ(BlockKey::FromHex(k.Hex()), k);
  for (const char* bad : {"", "0123", "FEDCBA98765432100123456789ABCDEF", "fedcba98765432100123456789abcdeg",
                          "fedcba98765432100123456789abcdef0"}) {
    EXPECT_FALSE(BlockKey::FromHex(bad).has_value()) << bad;
  }
}

}  // namespace
}  // namespace kvx::kv::tier

namespace kvx::kv::tier {
namespace {

// A chunk's key names its tokens, model, spec and tenant, whatever its
// length, and never a prefix block's key.
TEST(ChunkKeyTest, DependsOnEverythingTheStoredBytesDependOn) {
  const std::vector<int32_t> t = testing::Tokens(23);
  const BlockSpace space = Space("codec=f16");
  const BlockKey key = ChunkKey(space, 7, t);
  EXPECT_EQ(key, ChunkKey(Space("codec=f16"), 7, t));
  EXPECT_NE(key, ChunkKey(space, 8, t));
  EXPECT_NE(key, ChunkKey(Space("codec=f16", 0x9999), 7, t));
  EXPECT_NE(key, ChunkKey(Space("codec=int8"), 7, t));
  std::vector<int32_t> other = t;
  other.back() += 1;
  EXPECT_NE(key, ChunkKey(space, 7, other));
  EXPECT_NE(key, ChunkKey(space, 7, std::span<const int32_t>(t).first(22)));
  const std::vector<int32_t> block(t.begin(), t.begin() + 16);
  EXPECT_NE(ChunkKey(Space("codec=f16", 0x1234, 16), 7, block), BlockKeys(Space("codec=f16", 0x1234, 16), 7, block)[0]);
}

}  // namespace
}  // namespace kvx::kv::tier
