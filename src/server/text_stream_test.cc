// TextStream and the request parser: stop strings cut across pieces and
// held back exactly as long as needed, only valid UTF-8 leaves, and every
// bad request field gives OpenAI's error naming the parameter.
#include "server/text_stream.h"

#include <gtest/gtest.h>

#include "server/metrics.h"
#include "server/openai.h"

namespace kvx::server {
namespace {

std::string Feed(TextStream& s, const std::vector<std::string>& pieces) {
  std::string out;
  for (const std::string& p : pieces) out += s.Add(p);
  return out + s.Flush();
}

TEST(TextStreamTest, StopStringAcrossPiecesCutsBeforeIt) {
  TextStream s({"END"});
  EXPECT_EQ(s.Add("hello E"), "hello ");  // "E" may start the stop string
  EXPECT_EQ(s.Add("N"), "");
  EXPECT_EQ(s.Add("Dx"), "");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.text(), "hello ");
  EXPECT_EQ(s.Add("more"), "");
}

TEST(TextStreamTest, FalseStartIsReleased) {
  TextStream s({"END"});
  EXPECT_EQ(s.Add("E"), "");
  EXPECT_EQ(s.Add("Nx"), "ENx");
  EXPECT_FALSE(s.stopped());
  EXPECT_EQ(s.Add("EN"), "");
  EXPECT_EQ(s.Flush(), "EN");  // the end: a partial stop string is text
}

TEST(TextStreamTest, EarliestOfSeveralStopsWins) {
  TextStream s({"cd", "b"});
  EXPECT_EQ(Feed(s, {"abcd"}), "a");
}

TEST(TextStreamTest, SplitUtf8WaitsForItsLastByte) {
  TextStream s;
  const std::string euro = "\xE2\x82\xAC";
  EXPECT_EQ(s.Add(euro.substr(0, 1)), "");
  EXPECT_EQ(s.Add(euro.substr(1, 1)), "");
  EXPECT_EQ(s.Add(euro.substr(2, 1) + "a"), euro + "a");
}

TEST(TextStreamTest, InvalidBytesBecomeReplacementCharacters) {
  TextStream s;
  EXPECT_EQ(Feed(s, {"a\xFF", "b\xE2\x82"}), "a\xEF\xBF\xBD" "b\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_TRUE(IsValidUtf8(s.text()));
  EXPECT_FALSE(IsValidUtf8("\xC0\x80"));      // overlong
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));  // surrogate
  EXPECT_TRUE(IsValidUtf8("\xF0\x9F\x98\x80"));
}

std::optional<ApiError> Parse(const std::string& body, bool chat = false) {
  CompletionParams p;
  return ParseCompletionRequest(body, chat, ParseLimits{}, &p);
}

TEST(OpenAIParseTest, GoodRequestsParse) {
  CompletionParams p;
  ASSERT_FALSE(ParseCompletionRequest(
      R"({"model":"m","prompt":"hi","max_tokens":5,"temperature":0,"top_p":0.5,"n":2,"stop":["a","b"],"seed":7,"stream":true,"stream_options":{"include_usage":true},"user":"u","session":"s-1","ignore_eos":true})",
      false, ParseLimits{}, &p));
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_EQ(p.prompt, "hi");
  EXPECT_EQ(*p.max_tokens, 5);
  EXPECT_EQ(p.n, 2);
  EXPECT_EQ(p.stop.size(), 2u);
  EXPECT_EQ(*p.seed, 7u);
  EXPECT_TRUE(p.stream && p.include_usage);
  ASSERT_FALSE(ParseCompletionRequest(R"({"prompt":[1,2,3]})", false, ParseLimits{}, &p));
  EXPECT_EQ(p.prompt_tokens->size(), 3u);
  ASSERT_FALSE(ParseCompletionRequest(
      R"({"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":null}]})",
      true, ParseLimits{}, &p));
  ASSERT_EQ(p.messages.size(), 3u);
  EXPECT_EQ(p.messages[1].content, "ab");
}

TEST(OpenAIParseTest, BadFieldsNameTheParameter) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"prompt":"x","temperature":"hot"})", "temperature"},
      {R"({"prompt":"x","temperature":3})", "temperature"},
      {R"({"prompt":"x","top_p":0})", "top_p"},
      {R"({"prompt":"x","max_tokens":0})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":1.5})", "max_tokens"},
      {R"({"prompt":"x","n":99})", "n"},
      {R"({"prompt":"x","stop":[1]})", "stop"},
      {R"({"prompt":"x","stop":["a","b","c","d","e"]})", "stop"},
      {R"({"prompt":"x","stream":"yes"})", "stream"},
      {R"({"prompt":"x","seed":"1"})", "seed"},
      {R"({"prompt":"x","logprobs":true})", "logprobs"},
      {R"({"prompt":"x","presence_penalty":1})", "presence_penalty"},
      {R"({"prompt":"x","session":"../etc"})", "session"},
      {R"({"prompt":"x","ignore_eos":1})", "ignore_eos"},
      {R"({"prompt":["a","b"]})", "prompt"},
      {R"({"prompt":[-1]})", "prompt"},
      {R"({"prompt":{}})", "prompt"},
      {R"({})", "prompt"},
  };
  for (const auto& [body, param] : cases) {
    auto e = Parse(body);
    ASSERT_TRUE(e.has_value()) << body;
    EXPECT_EQ(e->status, 400);
    EXPECT_EQ(e->param, param) << body << ": " << e->message;
  }
  const std::pair<const char*, const char*> chat[] = {
      {R"({"messages":[]})", "messages"},
      {R"({"messages":"hi"})", "messages"},
      {R"({"messages":[{"role":"wizard","content":"x"}]})", "messages[0].role"},
      {R"({"messages":[{"role":"user"}]})", "messages[0].content"},
      {R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})", "messages[0].content"},
  };
  for (const auto& [body, param] : chat) {
    auto e = Parse(body, true);
    ASSERT_TRUE(e.has_value()) << body;
    EXPECT_EQ(e->param, param) << body << ": " << e->message;
  }
  for (const char* body : {"{bad", "[1]", "\"x\"", "{\"prompt\":\"\xFF\"}"}) {
    auto e = Parse(body);
    ASSERT_TRUE(e.has_value()) << body;
    EXPECT_EQ(e->status, 400);
    EXPECT_EQ(e->ToJson()["error"]["type"], "invalid_request_error");
  }
}

TEST(MetricsTest, PrometheusTextHasCumulativeBuckets) {
  engine::SchedulerStats s;
  s.pool_bytes_used = 100;
  s.pool_budget_bytes = 1000;
  s.prefix_lookup_tokens = 10;
  s.prefix_hit_tokens = 4;
  s.ttft.Add(0.002);
  s.ttft.Add(0.5);
  s.page_classes.push_back({"kivi2 \"x\"", 512, 3});
  HttpCounters h;
  h.responses_by_status[200] = 5;
  const std::string text = RenderMetrics(s, h);
  EXPECT_NE(text.find("kvx_pool_bytes_used 100\n"), std::string::npos);
  EXPECT_NE(text.find("kvx_prefix_cache_hit_ratio 0.40000000000000002\n"), std::string::npos) << text;
  EXPECT_NE(text.find("kvx_ttft_seconds_bucket{le=\"+Inf\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("kvx_ttft_seconds_count 2\n"), std::string::npos);
  EXPECT_NE(text.find("kvx_pages_in_use{class=\"kivi2 \\\"x\\\"\",page_bytes=\"512\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("kvx_http_responses_total{code=\"200\"} 5\n"), std::string::npos);
}

}  // namespace
}  // namespace kvx::server
