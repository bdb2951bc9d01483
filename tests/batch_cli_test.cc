// `kvx batch` end to end on a tiny synthetic model: one output line per
// request in input order, shared prefixes computed once (cache hits reported),
// the same texts with and without grouping (grouping changes the order work is
// done in, never a request's tokens), and bad lines named (a prompt the KV
// pool can never hold included).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "support/run_command.h"
#include "support/test_data.h"

namespace kvx {
namespace {

using testing::BinaryDir;
using testing::RunCommand;
using testing::TempDir;

std::string TinyModel() { return testing::TinyModelFile("batch_tiny.gguf"); }

std::string WriteRequests(const std::string& name) {
  const std::string path = TempDir() + "/" + name;
  std::ofstream f(path);
  const std::string system = "You are a helpful assistant. Answer briefly and precisely. ";
  for (int i = 0; i < 9; ++i) {
    nlohmann::json j;
    j["prompt"] = (i % 3 ? system + system + system : std::string()) + "Question " + std::to_string(i) + "?";
    j["max_tokens"] = 5 + i;
    j["seed"] = i;
    j["id"] = i * 10;
    f << j.dump() << "\n";
  }
  return path;
}

std::vector<nlohmann::json> RunBatch(const std::string& in, const std::string& out, const std::string& extra,
                                     const std::string& kv = "codec=f16,page=16") {
  std::vector<std::string> argv = {BinaryDir() + "/kvx", "batch", in, "-m", TinyModel(), "--kv", kv,
                                   "-c", "512", "-o", out};
  if (!extra.empty()) argv.push_back(extra);
  const auto r = RunCommand(argv);
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.Describe() << "\n" << r.output;
  EXPECT_NE(r.output.find("from the prefix cache"), std::string::npos) << r.output;
  return testing::ReadJsonLines(out);
}

TEST(BatchCliTest, OneLinePerRequestSharedPrefixesOnce) {
  const std::string in = WriteRequests("batch_in.jsonl");
  const auto grouped = RunBatch(in, TempDir() + "/batch_out.jsonl", "");
  const auto plain = RunBatch(in, TempDir() + "/batch_plain.jsonl", "--no-grouping");
  ASSERT_EQ(grouped.size(), 9u);
  ASSERT_EQ(plain.size(), 9u);
  int cached = 0;
  for (int i = 0; i < 9; ++i) {
    EXPECT_EQ(grouped[i]["index"], i);
    EXPECT_EQ(grouped[i]["id"], i * 10);
    EXPECT_FALSE(grouped[i].contains("error")) << grouped[i].dump();
    EXPECT_LE(grouped[i]["generated_tokens"].get<int>(), 5 + i);
    // The time to first token splits into the queue's and the admitted request's.
    EXPECT_GE(grouped[i]["queue_ms"].get<double>(), 0);
    EXPECT_NEAR(grouped[i]["queue_ms"].get<double>() + grouped[i]["admitted_ttft_ms"].get<double>(),
                grouped[i]["ttft_ms"].get<double>(), 1e-6);
    EXPECT_EQ(grouped[i]["text"], plain[i]["text"]) << "request " << i;
    if (i % 3) cached += grouped[i]["cached_tokens"].get<int>() > 0;
  }
  EXPECT_EQ(cached, 6);  // every request with the shared system prompt started from the cache
}

// With a policy that compresses once, each request is compressed after its
// prompt, but the shared prefixes' warm-ups are not (compress = false): the
// requests still start from the cache.
TEST(BatchCliTest, SharedPrefixesStillCachedWithAOncePolicy) {
  const std::string in = WriteRequests("batch_once_in.jsonl");
  const auto out = RunBatch(in, TempDir() + "/batch_once_out.jsonl", "", "codec=f16,page=16;policy=snapkv,ratio=0.5");
  ASSERT_EQ(out.size(), 9u);
  int cached = 0;
  for (int i = 0; i < 9; ++i) {
    EXPECT_FALSE(out[i].contains("error")) << out[i].dump();
    if (i % 3) cached += out[i]["cached_tokens"].get<int>() > 0;
  }
  EXPECT_EQ(cached, 6);
}

// --compress-at prefix: each shared prefix is compressed once (its
// warm-up) and the group's requests fork it; a continuous policy's warm-up
// is kept too. The summary says so (hits by kind, compressions).
TEST(BatchCliTest, CompressedPrefixesAreReused) {
  const std::string in = WriteRequests("batch_reuse_in.jsonl");
  for (const std::string kv : {"codec=f16,page=16;policy=snapkv,ratio=0.5", "codec=f16,page=16;policy=h2o,ratio=0.5"}) {
    const std::string out = TempDir() + "/batch_reuse_out.jsonl";
    const auto r = RunCommand({BinaryDir() + "/kvx", "batch", in, "-m", TinyModel(), "--kv", kv, "-c", "512", "-o",
                               out, "--compress-at", "prefix"});
    ASSERT_TRUE(r.exited && r.exit_code == 0) << r.Describe() << "\n" << r.output;
    // The six requests of the one group fork its kept prefix.
    EXPECT_NE(r.output.find("from 6 compressed-cache hits"), std::string::npos) << kv << "\n" << r.output;
    EXPECT_NE(r.output.find("6 requests started from theirs"), std::string::npos) << kv << "\n" << r.output;
    // snapkv: the warm-up and the three requests without a shared prefix.
    if (kv.find("snapkv") != std::string::npos) {
      EXPECT_NE(r.output.find("| 4 compressions"), std::string::npos) << r.output;
    }
    const auto lines = testing::ReadJsonLines(out);
    ASSERT_EQ(lines.size(), 9u);
    for (int i = 1; i < 9; i += (i % 3 == 2 ? 2 : 1)) EXPECT_GT(lines[i]["cached_tokens"].get<int>(), 0) << i;
  }
}

TEST(BatchCliTest, BadLinesAreNamed) {
  const std::string in = TempDir() + "/batch_bad.jsonl";
  std::ofstream(in) << "{\"prompt\": \"ok\"}\n\n{\"max_tokens\": 3}\n";
  const auto r = RunCommand({BinaryDir() + "/kvx", "batch", in, "-m", TinyModel()});
  EXPECT_TRUE(r.exited && r.exit_code == 1) << r.Describe();
  EXPECT_NE(r.output.find("batch_bad.jsonl:3: missing the required field \"prompt\""), std::string::npos) << r.output;
  std::ofstream(in) << "{\"prompt\": \"ok\", \"max_tokens\": 0}\n";
  const auto r2 = RunCommand({BinaryDir() + "/kvx", "batch", in, "-m", TinyModel()});
  EXPECT_NE(r2.output.find(":1: \"max_tokens\" must be in [1, 1000000]"), std::string::npos) << r2.output;
  std::ofstream(in) << "not json\n";
  const auto r3 = RunCommand({BinaryDir() + "/kvx", "batch", in, "-m", TinyModel()});
  EXPECT_NE(r3.output.find(":1: not valid JSON"), std::string::npos) << r3.output;
}

// A prompt whose KV is more than the whole pool is refused by the
// scheduler's gate, naming its line, while earlier requests are in flight
// (they are cancelled; their callbacks' state outlives the scheduler).
TEST(BatchCliTest, APromptThePoolCannotHoldIsNamed) {
  const std::string in = TempDir() + "/batch_pool.jsonl";
  {
    std::ofstream f(in);
    for (int i = 0; i < 4; ++i) f << nlohmann::json{{"prompt", "short " + std::to_string(i)}, {"max_tokens", 8}}.dump() << "\n";
    std::string big;
    for (int i = 0; i < 30; ++i) big += "word" + std::to_string(i) + " ";
    f << nlohmann::json{{"prompt", big}}.dump() << "\n";
  }
  const auto r = RunCommand({BinaryDir() + "/kvx", "batch", in, "-m", TinyModel(), "-c", "512", "--kv",
                             "codec=f16,page=16,budget=16K"});
  EXPECT_TRUE(r.exited && r.exit_code == 1) << r.Describe() << "\n" << r.output;
  EXPECT_NE(r.output.find("batch_pool.jsonl:5: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("more than the whole KV pool holds (budget 16384 bytes)"), std::string::npos) << r.output;
}

// Lines with "chunks": the second line's chunks, reordered, come from the
// chunk cache the first filled; the output says so; a plain line alongside
// is unaffected; bad chunk fields name their line.
TEST(BatchCliTest, ChunkLinesReuseTheChunkCache) {
  const std::string in = TempDir() + "/batch_chunks.jsonl";
  const std::string a = "The first document is about rivers. ", b = "The second one lists 4 8 15 16 23 42. ";
  {
    std::ofstream f(in);
    f << nlohmann::json{{"chunks", {a, b}}, {"prompt", "Q1?"}, {"max_tokens", 4}, {"chunk_repair", "none"}}.dump()
      << "\n";
    f << nlohmann::json{{"chunks", {b, a}}, {"prompt", "Q2?"}, {"max_tokens", 4}}.dump() << "\n";
    f << nlohmann::json{{"prompt", "plain"}, {"max_tokens", 4}}.dump() << "\n";
  }
  const auto out = RunBatch(in, TempDir() + "/batch_chunks_out.jsonl", "");
  ASSERT_EQ(out.size(), 3u);
  for (const auto& line : out) EXPECT_FALSE(line.contains("error")) << line.dump();
  const int chunk_tokens = out[0]["chunk_tokens"];
  EXPECT_GT(chunk_tokens, 10);
  EXPECT_EQ(out[0]["chunk_cache_tokens"], 0);
  EXPECT_EQ(out[0]["chunk_recomputed_tokens"], 0);
  EXPECT_EQ(out[1]["chunk_tokens"], chunk_tokens);
  EXPECT_EQ(out[1]["chunk_cache_tokens"], chunk_tokens);
  EXPECT_GT(out[1]["chunk_recomputed_tokens"].get<int>(), 0);  // the default repair, epic,k=16
  EXPECT_FALSE(out[2].contains("chunk_tokens"));

  std::ofstream(in) << "{\"prompt\": \"q\", \"chunks\": [\"a\", 3]}\n";
  auto r = RunCommand({BinaryDir() + "/kvx", "batch", in, "-m", TinyModel()});
  EXPECT_NE(r.output.find(":1: \"chunks\"[1] must be a string"), std::string::npos) << r.output;
  std::ofstream(in) << "{\"prompt\": \"q\", \"chunk_repair\": \"none\"}\n";
  r = RunCommand({BinaryDir() + "/kvx", "batch", in, "-m", TinyModel()});
  EXPECT_NE(r.output.find(":1: \"chunk_repair\" needs \"chunks\""), std::string::npos) << r.output;
  std::ofstream(in) << "{\"prompt\": \"q\", \"chunks\": [\"a\"], \"chunk_repair\": \"blend,r=7\"}\n";
  r = RunCommand({BinaryDir() + "/kvx", "batch", in, "-m", TinyModel()});
  EXPECT_NE(r.output.find(":1: chunk repair 'blend,r=7'"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace kvx
