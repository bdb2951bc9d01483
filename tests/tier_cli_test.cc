// The KV tiers end to end through real processes on a tiny synthetic model:
// a `kvx serve` restarted on the same --cache-dir and a second `kvx batch`
// process on it admit the prompt from the disk, a process sharing
// --cache-redis admits it from Redis, and each gives the texts of the
// process that computed it.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>
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

// A `kvx serve` process of our own, its stderr in a file; SIGTERM at the end.
class ServeProcess {
 public:
  ~ServeProcess() { Stop(); }
  // Starts it and waits (up to 60 s) for "listening on http://HOST:PORT".
  bool Start(const std::vector<std::string>& flags, const std::string& log) {
    std::vector<std::string> args = {BinaryDir() + "/kvx", "serve", "--port", "0"};
    args.insert(args.end(), flags.begin(), flags.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t files;
    posix_spawn_file_actions_init(&files);
    posix_spawn_file_actions_addopen(&files, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int spawned = posix_spawn(&pid_, argv[0], &files, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&files);
    if (spawned != 0) return false;
    const std::string marker = "listening on http://127.0.0.1:";
    for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60); std::chrono::steady_clock::now() < until;) {
      std::stringstream text;
      text << std::ifstream(log).rdbuf();
      const std::string out = text.str();
      if (const size_t at = out.find(marker); at != std::string::npos && out.find('\n', at) != std::string::npos) {
        port_ = std::stoi(out.substr(at + marker.size()));
        return true;
      }
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  nlohmann::json Complete(const std::string& prompt) {
    httplib::Client client("127.0.0.1", port_);
    client.set_read_timeout(60, 0);
    const nlohmann::json body = {{"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}};
    auto res = client.Post("/v1/completions", body.dump(), "application/json");
    if (!res || res->status != 200) return {};
    return nlohmann::json::parse(res->body);
  }
  std::string Metrics() {
    httplib::Client client("127.0.0.1", port_);
    auto res = client.Get("/metrics");
    return res ? res->body : "";
  }
  void Stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

TEST(TierCliTest, ARestartedServerHitsItsCacheDirectory) {
  kv::tier::testing::TempDir dir;
  std::string prompt;
  for (int i = 0; i < 60; ++i) prompt += "word" + std::to_string(i) + " ";
  const std::vector<std::string> flags = {"-m", TinyModel(), "--kv", "codec=f16,page=16", "-c", "512", "--cache-dir",
                                          dir.path(), "--cache-block", "32"};
  nlohmann::json first, second;
  {
    ServeProcess serve;
    ASSERT_TRUE(serve.Start(flags, TempDir() + "/tier_serve1.log"));
    first = serve.Complete(prompt);
  }  // SIGTERM: the server stops, its tier store finishes its writes
  ServeProcess serve;
  ASSERT_TRUE(serve.Start(flags, TempDir() + "/tier_serve2.log"));
  second = serve.Complete(prompt);
  ASSERT_FALSE(first.is_null());
  ASSERT_FALSE(second.is_null());
  EXPECT_EQ(second["choices"][0]["text"], first["choices"][0]["text"]);
  const nlohmann::json& details = second["usage"]["prompt_tokens_details"];
  EXPECT_GE(details["cached_tokens_by_tier"].value("disk", 0), 32) << second.dump();
  const std::string metrics = serve.Metrics();
  EXPECT_NE(metrics.find("kvx_tier_hits_total{tier=\"disk " + dir.path() + "\"}"), std::string::npos) << metrics;
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

// Chunks in the tiers: lines with "chunks" computed by one process are
// chunk-cache hits in a second process on the same --cache-dir (a restart)
// or on the same Redis (another server), with the first process's texts.
TEST(TierCliTest, ChunksSurviveARestartAndAreSharedThroughRedis) {
  std::string doc_a, doc_b;
  for (int i = 0; i < 40; ++i) doc_a += "alpha" + std::to_string(i) + " ", doc_b += "beta" + std::to_string(i) + " ";
  const std::string in = TempDir() + "/tier_chunks.jsonl";
  {
    std::ofstream f(in);
    f << nlohmann::json{{"chunks", {doc_a, doc_b}}, {"prompt", "Q1?"}, {"max_tokens", 4}, {"seed", 1}}.dump() << "\n";
  }
  auto run = [&](const std::vector<std::string>& cache, const std::string& out) {
    std::vector<std::string> argv = {BinaryDir() + "/kvx", "batch", in, "-m", TinyModel(), "--kv", "codec=f16,page=16",
                                     "-c", "1024", "--temp", "0", "--cache-block", "32", "-o", out};
    argv.insert(argv.end(), cache.begin(), cache.end());
    const auto r = RunCommand(argv);
    EXPECT_TRUE(r.exited && r.exit_code == 0) << r.Describe() << "\n" << r.output;
    const auto lines = testing::ReadJsonLines(out);
    return lines.empty() ? nlohmann::json() : lines[0];
  };
  kv::tier::testing::TempDir dir;
  const nlohmann::json first = run({"--cache-dir", dir.path()}, TempDir() + "/tier_chunks1.jsonl");
  const nlohmann::json second = run({"--cache-dir", dir.path()}, TempDir() + "/tier_chunks2.jsonl");
  ASSERT_FALSE(first.is_null());
  ASSERT_FALSE(second.is_null());
  EXPECT_EQ(first["chunk_cache_tokens"].get<int>(), 0) << first.dump();
  EXPECT_EQ(second["chunk_cache_tokens"].get<int>(), first["chunk_tokens"].get<int>()) << second.dump();
  EXPECT_EQ(second["text"], first["text"]);
  if (kv::tier::testing::FindRedisServer().empty()) GTEST_SKIP() << "redis-server is not installed";
  kv::tier::testing::RedisServer redis;
  ASSERT_TRUE(redis.Start());
  run({"--cache-redis", redis.url()}, TempDir() + "/tier_chunks3.jsonl");
  const nlohmann::json shared = run({"--cache-redis", redis.url()}, TempDir() + "/tier_chunks4.jsonl");
  ASSERT_FALSE(shared.is_null());
  EXPECT_EQ(shared["chunk_cache_tokens"].get<int>(), first["chunk_tokens"].get<int>()) << shared.dump();
  EXPECT_EQ(shared["text"], first["text"]);
}

// --cache-codec compact end to end: kvx calibrate-storage writes the
// transform of a model and --kv; a restarted process with the same file
// hits the disk blocks the first wrote, one with another calibration's file
// then misses them (no garbage: the block header's digest), a file of another
// spec is refused naming both fingerprints. Without a file, the first start
// calibrates on the bundled text and caches the transform, the next finds it.
TEST(TierCliTest, CompactBlocksHitOnlyWithTheirTransform) {
  kv::tier::testing::TempDir dir, cache;
  const std::string kvx = BinaryDir() + "/kvx", t1 = cache.path() + "/t1.kvxt", t2 = cache.path() + "/t2.kvxt";
  const std::string other_text = TempDir() + "/tier_other_calib.txt";
  {
    std::ofstream f(other_text);
    for (int i = 0; i < 400; ++i) f << "another " << i * 7919 % 113 << " calibration text, ";
  }
  auto calibrate = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {kvx, "calibrate-storage", "-m", TinyModel(), "--kv", "codec=f16,page=16", "-c", "1024"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const auto r = RunCommand(argv);
    EXPECT_TRUE(r.exited && r.exit_code == 0) << r.Describe() << "\n" << r.output;
  };
  calibrate({"-o", t1});
  calibrate({"-o", t2, "-f", other_text});
  auto compact = [&](const std::string& file, const std::string& out) {
    return Batch({"--cache-dir", dir.path(), "--cache-codec", "compact", "--storage-transform", file}, out);
  };
  const auto first = compact(t1, TempDir() + "/tier_compact1.jsonl");
  const auto same = compact(t1, TempDir() + "/tier_compact2.jsonl");
  const auto other = compact(t2, TempDir() + "/tier_compact3.jsonl");  // (then overwrites them with its own)
  ASSERT_EQ(first.size(), 2u);
  ASSERT_EQ(other.size(), 2u);
  ASSERT_EQ(same.size(), 2u);
  EXPECT_EQ(FromTier(first[0], "disk"), 0);
  EXPECT_EQ(FromTier(other[0], "disk"), 0) << other[0].dump();
  EXPECT_EQ(other[0]["text"], first[0]["text"]);  // recomputed, as the first process did
  EXPECT_GE(FromTier(same[0], "disk"), 32) << same[0].dump();
  auto r = RunCommand({kvx, "batch", Requests(), "-m", TinyModel(), "--kv", "codec=f32,page=16", "-c", "1024",
                       "--cache-dir", dir.path(), "--cache-codec", "compact", "--storage-transform", t1});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("kvx: error: --storage-transform: " + t1 + " is the storage transform of model"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("not of this one, model"), std::string::npos) << r.output;
  setenv("KVX_TUNE_CACHE", cache.path().c_str(), 1);
  r = RunCommand({kvx, "batch", Requests(), "-m", TinyModel(), "-c", "1024", "--cache-dir", dir.path(), "--cache-codec",
                  "compact", "-o", TempDir() + "/tier_compact4.jsonl"});
  EXPECT_NE(r.output.find("calibrated one on the bundled text"), std::string::npos) << r.output;
  r = RunCommand({kvx, "batch", Requests(), "-m", TinyModel(), "-c", "1024", "--cache-dir", dir.path(), "--cache-codec",
                  "compact", "-o", TempDir() + "/tier_compact5.jsonl"});
  EXPECT_NE(r.output.find("(the cache's for this model and --kv)"), std::string::npos) << r.output;
  unsetenv("KVX_TUNE_CACHE");
  r = RunCommand({kvx, "batch", Requests(), "-m", TinyModel(), "--kv", "codec=int8", "--cache-dir", dir.path(),
                  "--cache-codec", "compact"});
  EXPECT_NE(r.output.find("kvx: error: --cache-codec compact codes f16 and f32 pools"), std::string::npos) << r.output;
}

TEST(TierCliTest, BadCacheFlagsAndFieldsAreClearErrors) {
  const std::string pin = TempDir() + "/tier_pin.jsonl";
  std::ofstream(pin) << R"({"prompt": "x", "cache": "pin"})" << "\n";
  auto r = RunCommand({BinaryDir() + "/kvx", "batch", pin, "-m", TinyModel()});  // no host-RAM tier to pin in
  EXPECT_NE(r.output.find("start with --cache-ram-bytes"), std::string::npos) << r.output;
  EXPECT_EQ(r.exit_code, 1) << r.output;
  std::ofstream(pin) << R"({"prompt": "x", "cache": "pinned"})" << "\n";
  r = RunCommand({BinaryDir() + "/kvx", "batch", pin, "-m", TinyModel()});
  EXPECT_NE(r.output.find("kvx: error: " + pin + ":1: \"cache\" must be"), std::string::npos) << r.output;
  r = RunCommand({BinaryDir() + "/kvx", "batch", Requests(), "-m", TinyModel(), "--cache-redis", "http://x"});
  EXPECT_NE(r.output.find("kvx: error: --cache-redis"), std::string::npos) << r.output;
  r = RunCommand({BinaryDir() + "/kvx", "batch", Requests(), "-m", TinyModel(), "--cache-dir", "/tmp", "--cache-block",
                  "20"});
  EXPECT_NE(r.output.find("kvx: error: --cache-block"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace kvx
