// Chunk reuse ("chunks", docs/kv-reuse.md) through the server end to end:
// threads on both sides, so the TSan stage checks them too.
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "server/server_test_fixture.h"

namespace kvx::server {
namespace {

class ChunkServerTest : public ServerTest {
 protected:
  ChunkServerTest() { chunk_cache_bytes_ = 64 << 20; }
  std::pair<int, json> Post(const json& body) {
    auto c = Client();
    auto r = c.Post("/v1/completions", body.dump(), "application/json");
    if (!r) return {0, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  static json Chunked(std::vector<std::string> chunks, const std::string& repair) {
    return {{"chunks", chunks}, {"prompt", " so the answer is"}, {"max_tokens", 8}, {"temperature", 0},
            {"ignore_eos", true}, {"chunk_repair", repair}};
  }
  const std::string a_ = "The first document talks about rivers and the sea. ";
  const std::string b_ = "A second one lists numbers: 4 8 15 16 23 42. ";
  const std::string c_ = "The third is short.";
};

// The second request, its chunks reordered, takes every chunk from the
// chunk cache; usage says so; full and blend,r=1 answer what the plain
// prompt of the same tokens answers; and the assembled sequences never
// entered the prefix cache: the plain prompt finds nothing cached.
TEST_F(ChunkServerTest, ChunksAreReusedReorderedAndNeverEnterThePrefixCache) {
  auto [status, first] = Post(Chunked({a_, b_, c_}, "blend,r=0.15,layer=0"));
  ASSERT_EQ(status, 200) << first;
  const json& u1 = first["usage"]["prompt_tokens_details"];
  const int chunk_tokens = u1["chunk_tokens"];
  EXPECT_GT(chunk_tokens, 20);
  EXPECT_EQ(u1["chunk_cache_tokens"], 0);
  EXPECT_EQ(u1["chunk_recomputed_tokens"], static_cast<int>(std::ceil(0.15 * chunk_tokens)));
  auto [status2, second] = Post(Chunked({c_, a_, b_}, "none"));
  ASSERT_EQ(status2, 200) << second;
  const json& u2 = second["usage"]["prompt_tokens_details"];
  EXPECT_EQ(u2["chunk_tokens"], chunk_tokens);
  EXPECT_EQ(u2["chunk_cache_tokens"], chunk_tokens);
  EXPECT_EQ(u2["chunk_recomputed_tokens"], 0);
  EXPECT_EQ(second["usage"]["prompt_tokens"], first["usage"]["prompt_tokens"]);

  std::vector<std::string> texts;
  for (const char* repair : {"full", "blend,r=1,layer=0", "epic,k=1000"}) {
    auto [st, j] = Post(Chunked({a_, b_, c_}, repair));
    ASSERT_EQ(st, 200) << j;
    EXPECT_EQ(j["usage"]["prompt_tokens_details"]["chunk_recomputed_tokens"], chunk_tokens) << repair;
    texts.push_back(j["choices"][0]["text"]);
  }
  const std::vector<std::string> chunks = {a_, b_, c_};
  auto prompt = engine::MakeChunkPrompt(engine_->model().tokenizer(), chunks, " so the answer is", true, {});
  ASSERT_TRUE(prompt.ok()) << prompt.status().ToString();
  json plain = {{"prompt", prompt->Tokens()}, {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true}};
  auto [st, j] = Post(plain);
  ASSERT_EQ(st, 200) << j;
  for (const std::string& t : texts) EXPECT_EQ(t, j["choices"][0]["text"]);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << "an assembled sequence entered the prefix cache";
  EXPECT_FALSE(j["usage"]["prompt_tokens_details"].contains("chunk_tokens"));
  std::tie(st, j) = Post(plain);  // (the prefix cache works: the plain prompt's own blocks are found)
  EXPECT_GT(j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0);
  EXPECT_GT(scheduler_->Stats().chunk_cache.hits, 0);
}

// Several requests with chunks at once (assembled one by one, then decoding
// in the same steps) answer what each answers alone.
TEST_F(ChunkServerTest, ConcurrentChunkedRequestsAnswerAsAlone) {
  const std::vector<std::vector<std::string>> orders = {{a_, b_, c_}, {c_, b_, a_}, {b_, a_}, {c_, a_, b_}};
  std::vector<std::string> alone;
  for (const auto& o : orders) alone.push_back(Post(Chunked(o, "blend,r=0.3")).second["choices"][0]["text"]);
  std::vector<std::future<std::string>> together;
  for (const auto& o : orders) {
    together.push_back(std::async(std::launch::async, [&, o] {
      return Post(Chunked(o, "blend,r=0.3")).second["choices"][0]["text"].get<std::string>();
    }));
  }
  for (size_t i = 0; i < orders.size(); ++i) EXPECT_EQ(together[i].get(), alone[i]) << i;
}

TEST_F(ChunkServerTest, BadChunksAreClear400s) {
  auto expect = [&](const json& body, const std::string& param, const std::string& words) {
    auto [st, j] = Post(body);
    EXPECT_EQ(st, 400) << body;
    EXPECT_EQ(j["error"]["param"], param) << j;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(words), std::string::npos) << j;
  };
  expect({{"prompt", "q"}, {"chunks", {"a", 3}}}, "chunks", "must be a string");
  expect({{"prompt", "q"}, {"chunks", "a"}}, "chunks", "array of strings");
  expect({{"prompt", {1, 2}}, {"chunks", {"a"}}}, "chunks", "prompt as text");
  expect({{"prompt", "q"}, {"chunks", std::vector<std::string>(65, "x")}}, "chunks", "more than the 64");
  expect({{"prompt", "q"}, {"chunks", {"a"}}, {"chunk_repair", "blend,r=2"}}, "chunk_repair", "fraction");
  expect({{"prompt", "q"}, {"chunks", {"a"}}, {"chunk_repair", "blend,layer=99"}}, "chunks", "check layer");
  expect({{"prompt", "q"}, {"chunks", {"a"}}, {"session", "s"}}, "chunks", "session");
  auto [st, j] = Post({{"prompt", "q"}, {"chunks", {std::string(3000, 'x'), "y"}}});
  EXPECT_EQ(st, 400);
  EXPECT_EQ(j["error"]["code"], "context_length_exceeded") << j;
}

// Chat content parts as chunks (server/chat_chunks.h): with chunk_repair,
// each text part of a message's content is a chunk (usage counts them, the
// parts reordered come from the chunk cache, /metrics counts them); the
// repairs that recompute everything answer alike; without chunk_repair the
// parts are joined as before (no chunk in usage).
TEST_F(ChunkServerTest, ChatContentPartsAreChunks) {
  auto chat = [&](std::vector<std::string> parts, const char* repair) {
    json content = json::array();
    for (const std::string& p : parts) content.push_back({{"type", "text"}, {"text", p}});
    json body = {{"messages", {{{"role", "system"}, {"content", "Answer from the documents."}},
                               {{"role", "user"}, {"content", content}}}},
                 {"max_tokens", 6}, {"temperature", 0}, {"ignore_eos", true}};
    if (repair != nullptr) body["chunk_repair"] = repair;
    auto c = Client();
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    return r ? std::make_pair(r->status, json::parse(r->body, nullptr, false)) : std::make_pair(0, json());
  };
  const std::vector<std::string> texts = {a_, b_, c_};
  const auto tokens = engine::TokenizeChunks(engine_->model().tokenizer(), texts, /*after_text=*/true);
  ASSERT_TRUE(tokens.ok());
  int chunk_tokens = 0;
  for (const auto& t : *tokens) chunk_tokens += static_cast<int>(t.size());
  auto [st, first] = chat({a_, b_, "", c_}, "none");
  ASSERT_EQ(st, 200) << first;
  EXPECT_EQ(first["usage"]["prompt_tokens_details"]["chunk_tokens"], chunk_tokens) << first;
  EXPECT_EQ(first["usage"]["prompt_tokens_details"]["chunk_cache_tokens"], 0);
  auto [st2, second] = chat({c_, a_, b_}, "none");
  ASSERT_EQ(st2, 200) << second;
  EXPECT_EQ(second["usage"]["prompt_tokens_details"]["chunk_cache_tokens"], chunk_tokens) << second;
  EXPECT_EQ(second["usage"]["prompt_tokens"], first["usage"]["prompt_tokens"]);
  std::vector<std::string> answers;
  for (const char* repair : {"full", "blend,r=1,layer=0", "epic,k=1000"}) {
    auto [s, j] = chat({a_, b_, c_}, repair);
    ASSERT_EQ(s, 200) << j;
    EXPECT_EQ(j["usage"]["prompt_tokens_details"]["chunk_recomputed_tokens"], chunk_tokens) << repair;
    answers.push_back(j["choices"][0]["message"]["content"]);
  }
  EXPECT_EQ(answers[1], answers[0]);
  EXPECT_EQ(answers[2], answers[0]);
  auto [s, joined] = chat({a_, b_, c_}, nullptr);
  ASSERT_EQ(s, 200) << joined;
  EXPECT_FALSE(joined["usage"]["prompt_tokens_details"].contains("chunk_tokens")) << joined;
  json m = Metrics();
  EXPECT_EQ(m["kvx_chunk_tokens_total"], 5 * chunk_tokens) << m;
  // From the cache: the reordered request, blend and epic (full looks up nothing).
  EXPECT_EQ(m["kvx_chunk_cache_tokens_total"], 3 * chunk_tokens) << m;
  EXPECT_EQ(m["kvx_chunk_computed_tokens_total"], chunk_tokens) << m;        // the first request's misses
  EXPECT_EQ(m["kvx_chunk_recomputed_tokens_total"], 3 * chunk_tokens) << m;
}

TEST_F(ChunkServerTest, BadChatPartsAreClear400s) {
  auto post = [&](const std::string& body) {
    auto c = Client();
    auto r = c.Post("/v1/chat/completions", body, "application/json");
    return r ? std::make_pair(r->status, json::parse(r->body, nullptr, false)) : std::make_pair(0, json());
  };
  json image = {{"messages", {{{"role", "user"},
                               {"content", {{{"type", "text"}, {"text", "see"}},
                                            {{"type", "image_url"}, {"image_url", {{"url", "http://x/y.png"}}}}}}}}},
                {"chunk_repair", "none"}};
  auto [st, j] = post(image.dump());
  EXPECT_EQ(st, 400);
  EXPECT_EQ(j["error"]["param"], "messages[0].content") << j;
  EXPECT_NE(j["error"]["message"].get<std::string>().find("text only"), std::string::npos) << j;
  // A part boundary inside a character: JSON can only carry it as the two
  // halves of a surrogate pair, which is not valid JSON text.
  std::tie(st, j) = post(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud83d"},)"
                         R"( {"type": "text", "text": "\ude00"}]}], "chunk_repair": "none"})");
  EXPECT_EQ(st, 400);
  EXPECT_NE(j["error"]["message"].get<std::string>().find("not valid JSON"), std::string::npos) << j;
}

TEST_F(ServerTest, ChunksWithoutAChunkCacheAreRefused) {
  auto c = Client();
  auto r = c.Post("/v1/completions", json{{"prompt", "q"}, {"chunks", {"a"}}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("--chunk-cache-bytes"), std::string::npos) << r->body;
}

class KiviChunkServerTest : public ChunkServerTest {
 protected:
  KiviChunkServerTest() { kv_spec_ = "codec=kivi4,page=16"; }
};

TEST_F(KiviChunkServerTest, ASpecThatCannotTakeChunksIsA400NamingTheFix) {
  auto [st, j] = Post(Chunked({a_}, "none"));
  EXPECT_EQ(st, 400);
  EXPECT_EQ(j["error"]["param"], "chunks");
  EXPECT_NE(j["error"]["message"].get<std::string>().find("KIVI"), std::string::npos) << j;
  EXPECT_EQ(Post({{"prompt", "plain prompts still work"}, {"max_tokens", 2}}).first, 200);
}

}  // namespace
}  // namespace kvx::server
