// The KV tiers end to end through real `kvx batch` processes on a tiny
// synthetic model: a second process on the same --cache-dir (a restart)
// admits the prompt from the disk, a process on another machine's role
// sharing --cache-redis admits it from Redis, and both give the texts of the
// process that computed it.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "kv/tier/tier_test_util.h"
#include "support/run_command.h"
#include "support/test_data.h"

namespace kvx {
namespace {

using testing::BinaryDir;
using testing::RunCommand;
using testing::TempDir;

std::string TinyModel() { return testing::TinyModelFile("tier_tiny.gguf"); }

std::string Requests() {
  const std::string path = TempDir() + "/tier_in.jsonl";
  std::ofstream f(path);
  std::string system;
  for (int i = 0; i < 60; ++i) system += "word" + std::to_string(i) + " ";
  for (int i = 0; i < 2; ++i) f << nlohmann::json{{"prompt", system + "question " + std::to_string(i)}, {"seed", i}}.dump() << "\n";
  return path;
}

// Runs kvx batch with `cache` flags; its output lines.
std::vector<nlohmann::json> Batch(const std::vector<std::string>& cache, const std::string& out) {
  std::vector<std::string> argv = {BinaryDir() + "/kvx", "batch", Requests(), "-m", TinyModel(), "--kv",
                                   "codec=f16,page=16", "-c", "1024", "-n", "4", "--no-grouping", "--cache-block",
                                   "32", "-o", out};
  argv.insert(argv.end(), cache.begin(), cache.end());
  const auto r = RunCommand(argv);
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.Describe() << "\n" << r.output;
  return testing::ReadJsonLines(out);
}

int FromTier(const nlohmann::json& line, const std::string& tier) {
  return line.contains("cached_by_tier") ? line["cached_by_tier"].value(tier, 0) : 0;
}

TEST(TierCliTest, ARestartedProcessHitsTheDiskTier) {
  kv::tier::testing::TempDir dir;
  const auto first = Batch({"--cache-dir", dir.path()}, TempDir() + "/tier_out1.jsonl");
  const auto second = Batch({"--cache-dir", dir.path()}, TempDir() + "/tier_out2.jsonl");
  ASSERT_EQ(first.size(), 2u);
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(FromTier(first[0], "disk"), 0);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(second[i]["text"], first[i]["text"]);
    EXPECT_GE(second[i]["cached_tokens"].get<int>(), 32) << second[i].dump();
  }
  EXPECT_GE(FromTier(second[0], "disk"), 32) << second[0].dump();  // the first request's prefix came from disk
}

TEST(TierCliTest, TwoProcessesShareARedis) {
  if (kv::tier::testing::FindRedisServer().empty()) GTEST_SKIP() << "redis-server is not installed";
  kv::tier::testing::RedisServer redis;
  ASSERT_TRUE(redis.Start());
  const auto first = Batch({"--cache-redis", redis.url()}, TempDir() + "/tier_redis1.jsonl");
  const auto second = Batch({"--cache-redis", redis.url()}, TempDir() + "/tier_redis2.jsonl");
  ASSERT_EQ(second.size(), 2u);
  EXPECT_GE(FromTier(second[0], "redis"), 32) << second[0].dump();
  EXPECT_EQ(second[0]["text"], first[0]["text"]);
  EXPECT_EQ(second[1]["text"], first[1]["text"]);
}

TEST(TierCliTest, BadCacheFlagsAndFieldsAreClearErrors) {
  const std::string pin = TempDir() + "/tier_pin.jsonl";
  std::ofstream(pin) << R"({"prompt": "x", "cache": "pin"})" << "\n";
  auto r = RunCommand({BinaryDir() + "/kvx", "batch", pin, "-m", TinyModel()});
  EXPECT_NE(r.output.find("kvx: error: " + pin + ":1: \"cache\": \"pin\" is not supported yet"), std::string::npos)
      << r.output;
  r = RunCommand({BinaryDir() + "/kvx", "batch", Requests(), "-m", TinyModel(), "--cache-redis", "http://x"});
  EXPECT_NE(r.output.find("kvx: error: --cache-redis"), std::string::npos) << r.output;
  r = RunCommand({BinaryDir() + "/kvx", "batch", Requests(), "-m", TinyModel(), "--cache-dir", "/tmp", "--cache-block",
                  "20"});
  EXPECT_NE(r.output.find("kvx: error: --cache-block"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace kvx
