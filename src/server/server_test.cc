// The server in-process (HTTP on loopback, a scheduler on the tiny synthetic
// model), with threads on both sides, so the TSan stage (ctest label
// `threads`) checks its locking: concurrent streaming and plain requests,
// a client that leaves mid-stream (its request cancelled), session save and
// restore, and Stop() with a stream in flight.
#include "server/server.h"

#include <httplib.h>
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "model/synthetic_model.h"
#include "support/test_data.h"
#include "support/raw_client.h"

#include "server/server_test_fixture.h"

namespace kvx::server {
namespace {

using nlohmann::json;

TEST_F(ServerTest, ConcurrentStreamsAndPlainRequests) {
  std::atomic<int> ok{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 8; ++i) {
    clients.emplace_back([this, i, &ok] {
      auto c = Client();
      const bool stream = i % 2 == 0;
      json body = {{"prompt", "client " + std::to_string(i % 3)}, {"max_tokens", 6}, {"stream", stream}, {"seed", i}};
      auto r = c.Post("/v1/completions", body.dump(), "application/json");
      if (!r || r->status != 200) return;
      if (stream) {
        if (r->body.find("data: [DONE]") == std::string::npos) return;
        if (r->body.find("\"finish_reason\":\"length\"") == std::string::npos &&
            r->body.find("\"finish_reason\":\"stop\"") == std::string::npos) {
          return;
        }
      } else {
        const int n = json::parse(r->body)["usage"]["completion_tokens"];  // fewer at end-of-text
        if (n < 1 || n > 6) return;
      }
      ++ok;
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok.load(), 8);
  // A response can reach its client before the scheduler's loop has
  // retired the sequence and updated the gauge: wait for it, bounded.
  const auto t0 = std::chrono::steady_clock::now();
  json m = Metrics();
  while (m["kvx_sequences_running"] != 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    m = Metrics();
  }
  EXPECT_EQ(m["kvx_sequences_running"], 0);
}

TEST_F(ServerTest, ClientLeavingMidStreamIsCancelled) {
  const json before = Metrics();
  // A raw client: send the request, read until the first event, hang up.
  const std::string body = json{{"prompt", "go"}, {"max_tokens", 2000}, {"stream", true}, {"temperature", 0}}.dump();
  const int fd = PostRaw(body);
  ASSERT_GE(fd, 0);
  std::string got;
  char buf[4096];
  while (got.find("data: {") == std::string::npos) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    ASSERT_GT(n, 0);
    got.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  const auto t0 = std::chrono::steady_clock::now();
  json m;
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    m = Metrics();
  } while (m["kvx_requests_cancelled_total"] == before["kvx_requests_cancelled_total"] &&
           std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  EXPECT_EQ(m["kvx_requests_cancelled_total"].get<double>(), before["kvx_requests_cancelled_total"].get<double>() + 1);
  EXPECT_EQ(m["kvx_sequences_running"], 0);
  EXPECT_LT(m["kvx_generated_tokens_total"].get<double>() - before["kvx_generated_tokens_total"].get<double>(), 2000);
}

// A non-streaming client that hangs up while its request runs: the server
// notices (its socket, polled while the handler waits) and cancels the
// request, so its sequence leaves the batch at once, not after max_tokens.
TEST_F(ServerTest, PlainClientLeavingIsCancelled) {
  const json before = Metrics();
  const std::string body =
      json{{"prompt", "go"}, {"max_tokens", 2000}, {"n", 4}, {"stream", false}, {"ignore_eos", true}}.dump();
  const int fd = PostRaw(body);
  ASSERT_GE(fd, 0);
  // Wait until it runs (4 samples, so that it lasts), then hang up.
  const auto t0 = std::chrono::steady_clock::now();
  json m;
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    m = Metrics();
  } while (m["kvx_requests_running"] != 1 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  ASSERT_EQ(m["kvx_requests_running"], 1);
  close(fd);
  const auto t1 = std::chrono::steady_clock::now();
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    m = Metrics();
  } while (m["kvx_sequences_running"] != 0 && std::chrono::steady_clock::now() - t1 < std::chrono::seconds(5));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  EXPECT_EQ(m["kvx_sequences_running"], 0);
  EXPECT_LT(seconds, 3.0);
  EXPECT_EQ(m["kvx_requests_cancelled_total"].get<double>(), before["kvx_requests_cancelled_total"].get<double>() + 1);
  EXPECT_EQ(m["kvx_client_disconnects_total"].get<double>(), before["kvx_client_disconnects_total"].get<double>() + 1);
  EXPECT_LT(m["kvx_generated_tokens_total"].get<double>() - before["kvx_generated_tokens_total"].get<double>(), 4 * 2000);
}

TEST_F(ServerTest, SessionSaveRestoreAndBadFile) {
  auto c = Client();
  json body = {{"prompt", "remember this"}, {"max_tokens", 4}, {"temperature", 0}, {"session", "t1"}};
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(r && r->status == 200);
  r = c.Post("/v1/sessions/t1/save", "", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  r = c.Post("/v1/sessions/t1/restore", "", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  std::ofstream(opts_.session_dir + "/junk.kvxs") << "KVXSESS junk";
  r = c.Post("/v1/sessions/junk/restore", "", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "invalid_session_file");
  r = c.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

// Scheduler::Submit is the one gate: its rejections reach the client with
// OpenAI's status, param and code, before any stream starts.
TEST_F(ServerTest, TheGatesRejectionsKeepTheirCodes) {
  auto c = Client();
  auto post = [&](const json& body) {
    auto r = c.Post("/v1/completions", body.dump(), "application/json");
    EXPECT_TRUE(r);
    return r ? std::make_pair(r->status, json::parse(r->body, nullptr, false)) : std::make_pair(0, json());
  };
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "stream" : "plain");
    auto [status, j] = post({{"prompt", {1, 100000}}, {"stream", stream}});
    EXPECT_EQ(status, 400);
    EXPECT_EQ(j["error"]["param"], "prompt");
    EXPECT_NE(j["error"]["message"].get<std::string>().find("outside the vocabulary"), std::string::npos) << j;
    std::tie(status, j) = post({{"prompt", std::vector<int>(2048, 7)}, {"stream", stream}});  // fills n_ctx
    EXPECT_EQ(status, 400);
    EXPECT_EQ(j["error"]["code"], "context_length_exceeded");
    EXPECT_EQ(j["error"]["param"], "prompt");
    std::tie(status, j) = post({{"prompt", ""}, {"stream", stream}});
    EXPECT_EQ(status, 400);
    EXPECT_EQ(j["error"]["param"], "prompt");
    std::tie(status, j) = post({{"prompt", ""}, {"session", "nobody"}, {"stream", stream}});
    EXPECT_EQ(status, 404);
    EXPECT_EQ(j["error"]["code"], "not_found");
    EXPECT_EQ(j["error"]["param"], "session");
  }
  // A session made by one request is continued by the next, even with an
  // empty prompt (its pending token).
  EXPECT_EQ(post({{"prompt", "abc"}, {"max_tokens", 2}, {"session", "s2"}}).first, 200);
  EXPECT_EQ(post({{"prompt", ""}, {"max_tokens", 2}, {"session", "s2"}}).first, 200);
}

// A served path asked with another method is 405 naming the allowed ones;
// an unknown path stays 404.
TEST_F(ServerTest, WrongMethodIs405WithAllow) {
  auto c = Client();
  struct Case {
    const char* method;
    const char* path;
    int status;
    const char* allow;
  };
  const Case cases[] = {
      {"GET", "/v1/completions", 405, "POST"},
      {"POST", "/health", 405, "GET"},
      {"DELETE", "/v1/models", 405, "GET"},
      {"GET", "/v1/sessions/x/save", 405, "POST"},
      {"POST", "/v1/sessions/x", 405, "DELETE"},
      {"GET", "/v1/nothing", 404, ""},
  };
  for (const Case& k : cases) {
    const std::string m = k.method;
    auto r = m == "GET" ? c.Get(k.path) : m == "POST" ? c.Post(k.path, "{}", "application/json") : c.Delete(k.path);
    ASSERT_TRUE(r) << k.method << " " << k.path;
    EXPECT_EQ(r->status, k.status) << k.method << " " << k.path;
    EXPECT_EQ(r->get_header_value("Allow"), k.allow) << k.method << " " << k.path;
    EXPECT_EQ(json::parse(r->body)["error"]["type"], "invalid_request_error");
  }
}

// --chat-template replaces the model's template, checked by the same
// sandbox at start.
TEST_F(ServerTest, ChatTemplateOverride) {
  ServerOptions own = opts_;
  own.chat_template = "{% call x() %}{% endcall %}";
  auto bad = Server::Create(*scheduler_, own);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("the --chat-template file"), std::string::npos) << bad.status().ToString();
  own.chat_template = "{{ (-9223372036854775807 - 1) // -1 }}";
  EXPECT_FALSE(Server::Create(*scheduler_, own).ok());
  // A template that prints the last message alone: fewer prompt tokens than ChatML.
  own.chat_template = "{{ messages[-1]['content'] }}";
  auto srv = Server::Create(*scheduler_, own);
  ASSERT_TRUE(srv.ok()) << srv.status().ToString();
  std::thread t([&] { (*srv)->Run(); });
  httplib::Client plain("127.0.0.1", (*srv)->port());
  const json chat = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 1}};
  for (int i = 0; i < 500 && !plain.Get("/health"); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  auto ours = plain.Post("/v1/chat/completions", chat.dump(), "application/json");
  auto chatml = Client().Post("/v1/chat/completions", chat.dump(), "application/json");
  (*srv)->Stop();
  t.join();
  ASSERT_TRUE(ours && chatml);
  ASSERT_EQ(ours->status, 200) << ours->body;
  EXPECT_LT(json::parse(ours->body)["usage"]["prompt_tokens"], json::parse(chatml->body)["usage"]["prompt_tokens"]);
}

// A port in use is an error, not a second listener: cpp-httplib's default
// SO_REUSEPORT let a second kvx serve start silently and take half the
// connections.
TEST_F(ServerTest, APortInUseIsAnError) {
  ServerOptions again = opts_;
  again.port = server_->port();
  auto second = Server::Create(*scheduler_, again);
  ASSERT_FALSE(second.ok()) << "a second server listens on port " << again.port;
  EXPECT_NE(second.status().message().find("cannot listen"), std::string::npos) << second.status().ToString();
  again.reuse_port = true;  // asked for: both may listen (this one too must, then)
  ServerOptions first = opts_;
  first.reuse_port = true;
  first.port = 0;
  auto a = Server::Create(*scheduler_, first);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  again.port = (*a)->port();
  EXPECT_TRUE(Server::Create(*scheduler_, again).ok());
}

// With keys, every endpoint but /health needs one: /metrics tells pool
// bytes and request counts. Each key is a tenant.
class KeyedServerTest : public ServerTest {
 protected:
  KeyedServerTest() { api_keys_ = {{"alice", "key-a"}, {"bob", "key-b"}}; }
  // A request as the tenant holding `key`: (status, body as JSON).
  std::pair<int, json> As(const std::string& key, const std::string& method, const std::string& path,
                          const json& body = nullptr) {
    auto c = Client();
    const httplib::Headers auth = {{"Authorization", "Bearer " + key}};
    httplib::Result r = method == "GET"    ? c.Get(path, auth)
                        : method == "POST" ? c.Post(path, auth, body.is_null() ? "" : body.dump(), "application/json")
                                           : c.Delete(path, auth);
    if (!r) return {0, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
};

TEST_F(KeyedServerTest, EveryEndpointButHealthNeedsTheKey) {
  auto c = Client();
  for (const char* path : {"/metrics", "/v1/models"}) {
    auto r = c.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 401) << path;
    EXPECT_EQ(json::parse(r->body)["error"]["code"], "invalid_api_key") << path;
    auto ok = c.Get(path, {{"Authorization", "Bearer key-b"}});
    ASSERT_TRUE(ok) << path;
    EXPECT_EQ(ok->status, 200) << path;
  }
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

// A tenant (a key) sees, saves, restores, deletes and continues only its
// own sessions: another tenant's is 404 with the body of a missing one,
// whatever `user` it claims. Session files are per tenant too.
TEST_F(KeyedServerTest, TenantsSeeOnlyTheirOwnSessions) {
  const json turn = {{"prompt", "remember this"}, {"max_tokens", 3}, {"temperature", 0}, {"session", "s"}};
  ASSERT_EQ(As("key-a", "POST", "/v1/completions", turn).first, 200);
  EXPECT_EQ(As("key-a", "GET", "/v1/sessions").second["data"], json::array({"s"}));
  json spoof = turn;
  spoof["user"] = "alice";
  spoof["prompt"] = "";
  const auto missing = As("key-b", "POST", "/v1/sessions/nothing/save");
  EXPECT_EQ(missing.first, 404);
  for (const auto& [method, path, body] : std::vector<std::tuple<std::string, std::string, json>>{
           {"GET", "/v1/sessions", nullptr},
           {"POST", "/v1/sessions/s/save", nullptr},
           {"DELETE", "/v1/sessions/s", nullptr},
           {"POST", "/v1/completions", spoof}}) {
    const auto [status, j] = As("key-b", method, path, body);
    if (method == "GET") {
      EXPECT_EQ(status, 200);
      EXPECT_EQ(j["data"], json::array()) << "bob lists alice's sessions";
      continue;
    }
    EXPECT_EQ(status, 404) << method << " " << path << ": " << j;
    if (path == "/v1/sessions/s/save") {
      json expected = missing.second;
      expected["error"]["message"] = "no session named 's'";
      EXPECT_EQ(j, expected) << "not the answer for a missing session";
    }
  }
  // Both save a session "s" to a file: each restores its own.
  ASSERT_EQ(As("key-a", "POST", "/v1/sessions/s/save").first, 200);
  EXPECT_EQ(As("key-b", "POST", "/v1/sessions/s/restore").first, 404);
  json longer = turn;
  longer["prompt"] = "a much longer turn than alice's, to tell them apart";
  ASSERT_EQ(As("key-b", "POST", "/v1/completions", longer).first, 200);
  const auto bob_saved = As("key-b", "POST", "/v1/sessions/s/save");
  ASSERT_EQ(bob_saved.first, 200);
  const auto alice_restored = As("key-a", "POST", "/v1/sessions/s/restore");
  ASSERT_EQ(alice_restored.first, 200) << alice_restored.second;
  EXPECT_LT(alice_restored.second["tokens"], bob_saved.second["tokens"]);
  EXPECT_EQ(As("key-b", "POST", "/v1/sessions/s/restore").second["tokens"], bob_saved.second["tokens"]);
  // Alice's session is still there for her, and only for her.
  EXPECT_EQ(As("key-a", "DELETE", "/v1/sessions/s").first, 200);
  EXPECT_EQ(As("key-a", "DELETE", "/v1/sessions/s").first, 404);
  EXPECT_EQ(As("key-b", "GET", "/v1/sessions").second["data"], json::array({"s"}));
}

// Without keys the tenant is the advisory `user` (a completion's field, the
// session endpoints' query parameter).
TEST_F(ServerTest, WithoutKeysTheUserIsTheTenant) {
  auto c = Client();
  const json turn = {{"prompt", "hello"}, {"max_tokens", 2}, {"session", "u"}, {"user", "carol"}};
  ASSERT_EQ(c.Post("/v1/completions", turn.dump(), "application/json")->status, 200);
  EXPECT_EQ(json::parse(c.Get("/v1/sessions?user=carol")->body)["data"], json::array({"u"}));
  EXPECT_EQ(json::parse(c.Get("/v1/sessions")->body)["data"], json::array());
  EXPECT_EQ(c.Delete("/v1/sessions/u?user=dave")->status, 404);
  EXPECT_EQ(c.Delete("/v1/sessions/u?user=carol")->status, 200);
}

// A pool of 64 KiB (about 256 tokens of the tiny model's f16 KV) and a
// queue of one request.
class TightServerTest : public ServerTest {
 protected:
  TightServerTest() {
    kv_spec_ = "budget=64K";
    max_queue_ = 1;
  }
};

// A request the pool cannot hold even alone fails with 400 naming the
// budget, not with 429: retrying it cannot help.
TEST_F(TightServerTest, ARequestThatCannotFitIsNotRetryable) {
  auto c = Client();
  const json body = {{"prompt", "go"}, {"max_tokens", 1500}, {"ignore_eos", true}};
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["error"]["code"], "kv_budget_exceeded");
  EXPECT_NE(j["error"]["message"].get<std::string>().find("budget"), std::string::npos) << j;
  EXPECT_FALSE(r->has_header("Retry-After"));
}

// A prompt the pool can never hold is refused before any stream starts:
// 400 with the numbers, not a 200 stream that ends in an error.
TEST_F(TightServerTest, APromptThePoolCannotHoldIsRefusedAtOnce) {
  auto c = Client();
  const json body = {{"prompt", std::vector<int>(600, 7)}, {"stream", true}};
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  const json j = json::parse(r->body, nullptr, false);
  EXPECT_EQ(j["error"]["code"], "kv_budget_exceeded") << r->body;
  EXPECT_EQ(j["error"]["param"], "prompt");
  EXPECT_NE(j["error"]["message"].get<std::string>().find("600 tokens"), std::string::npos) << j;
}

// A full queue is the retryable refusal: 429 with Retry-After. The queue
// (of one) is held full by a request submitted while a task holds the
// scheduler thread between steps.
TEST_F(TightServerTest, AFullQueueIs429WithRetryAfter) {
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  std::thread holder([&] {
    (void)scheduler_->RunBetweenSteps([&](engine::Engine&) {
      entered.set_value();
      released.wait();
      return Status::Ok();
    });
  });
  entered.get_future().wait();
  engine::GenerationRequest held;
  held.prompt = {1, 2, 3};
  ASSERT_TRUE(scheduler_->Submit(held, [](const engine::RequestEvent&) {}).ok());
  auto c = Client();
  auto r = c.Post("/v1/completions", json{{"prompt", "me too"}}.dump(), "application/json");
  release.set_value();
  holder.join();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429) << r->body;
  EXPECT_EQ(json::parse(r->body)["error"]["type"], "rate_limit_error");
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
}

TEST_F(ServerTest, StopEndsAStreamInFlight) {
  std::atomic<bool> ended{false};
  std::string got;
  std::thread client([&] {
    auto c = Client();
    json body = {{"prompt", "long"}, {"max_tokens", 250}, {"stream", true}};
    auto r = c.Post("/v1/completions", body.dump(), "application/json");
    if (r) got = r->body;
    ended = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  server_->Stop();
  client.join();
  EXPECT_TRUE(ended.load());
  thread_.join();  // Run returned
}

// A client that shuts down its write side once its request is sent (as
// `nc -N` does) is still there: it gets its answer (it got nothing when an
// end-of-stream counted as a client gone). PlainClientLeavingIsCancelled
// is the other side: a client that closes is still noticed.
TEST_F(ServerTest, HalfClosedPlainClientGetsItsAnswer) {
  // The scheduler is held between steps for 400 ms, so the request waits
  // and its handler looks at its connection (every 100 ms) after the FIN.
  std::promise<void> entered;
  std::thread holder([&] {
    (void)scheduler_->RunBetweenSteps([&](engine::Engine&) {
      entered.set_value();
      std::this_thread::sleep_for(std::chrono::milliseconds(400));
      return Status::Ok();
    });
  });
  entered.get_future().wait();
  const int fd = PostRaw(json{{"prompt", "go"}, {"max_tokens", 8}, {"stream", false}}.dump());
  ASSERT_GE(fd, 0);
  shutdown(fd, SHUT_WR);
  const std::string response = testing::ReadUntilClosed(fd, std::chrono::seconds(30));
  close(fd);
  holder.join();
  EXPECT_EQ(response.rfind("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200", 0), 0u) << response.substr(0, 300);
  EXPECT_NE(response.find("\"text_completion\""), std::string::npos) << response.substr(0, 300);
}

// The done-when: a busy and attacked server stays observable.
// 64 streaming clients (4 per sequence slot, so most wait in the queue)
// and 60 slowloris connections (a header line a second, reconnecting when
// cut) for 12 s, while a load balancer's probe opens a connection for
// /health every 50 ms: its p99 stays under 100 ms (cpp-httplib's pool of
// 2 x 16 + 16 workers queued it behind the streams: up to 21 s), every
// stream completes, the slow connections are cut (408).
class BusyServerTest : public ServerTest {
 protected:
  BusyServerTest() { max_running_ = 16; }
};

TEST_F(BusyServerTest, HealthStaysFastUnderStreamsAndSlowConnections) {
#if defined(__SANITIZE_THREAD__)
  // 105 s under TSan (the 64 streams' last requests), far beyond a unit
  // test's few seconds; the other server tests cover its locking there.
  GTEST_SKIP() << "the soak test is not run under ThreadSanitizer (too slow)";
#endif
  using Clock = std::chrono::steady_clock;
  const auto end = Clock::now() + std::chrono::seconds(12);
  std::atomic<int> streams_ok{0}, streams_failed{0};
  std::vector<std::thread> streams;
  for (int i = 0; i < 64; ++i) {
    streams.emplace_back([&, i] {
      for (int k = 0; Clock::now() < end; ++k) {
        auto c = Client();
        const json body = {{"prompt", "client " + std::to_string(i) + " turn " + std::to_string(k)},
                           {"max_tokens", 200}, {"stream", true}, {"ignore_eos", true}};
        auto r = c.Post("/v1/completions", body.dump(), "application/json");
        const bool ok = r && r->status == 200 && r->body.find("data: [DONE]") != std::string::npos;
        (ok ? streams_ok : streams_failed)++;
      }
    });
  }
  std::thread slowloris([&] {
    std::vector<int> slow(60, -1);
    for (int tick = 0; Clock::now() < end; ++tick) {
      for (int& fd : slow) {
        pollfd p{fd, POLLIN, 0};
        if (fd >= 0 && (poll(&p, 1, 0) > 0 || !testing::SendAll(fd, "X-Slow-" + std::to_string(tick) + ": 1\r\n"))) {
          close(fd);  // answered (408) or cut: come back
          fd = -1;
        }
        if (fd < 0) {
          fd = testing::ConnectLoopback(server_->port());
          if (fd >= 0) testing::SendAll(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n");
        }
      }
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    for (int fd : slow) close(fd);
  });
  std::vector<double> health_ms;
  int health_failed = 0;
  std::this_thread::sleep_for(std::chrono::seconds(1));  // the load is on
  // The gauges are read mid-run: at the end the slow connections and the
  // streams are closing (a snapshot then raced with them).
  json mid;
  const auto halfway = end - std::chrono::seconds(5);
  while (Clock::now() < end) {
    const auto t0 = Clock::now();
    auto r = Client().Get("/health");
    health_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    if (!r || r->status != 200) ++health_failed;
    if (mid.is_null() && Clock::now() >= halfway) mid = Metrics();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const json m = Metrics();
  slowloris.join();
  for (auto& t : streams) t.join();
  ASSERT_GT(health_ms.size(), 50u);
  std::sort(health_ms.begin(), health_ms.end());
  const double p50 = health_ms[health_ms.size() / 2], p99 = health_ms[health_ms.size() * 99 / 100];
  std::printf("/health under load: %zu probes, p50 %.1f ms, p99 %.1f ms, max %.1f ms; %d streams done\n",
              health_ms.size(), p50, p99, health_ms.back(), streams_ok.load());
  EXPECT_EQ(health_failed, 0);
  EXPECT_LT(p99, 100.0);
  EXPECT_EQ(streams_failed, 0);
  EXPECT_GE(streams_ok, 64);
  EXPECT_GE(mid["kvx_http_connections"], 100) << "the load was not on";
  EXPECT_GE(mid["kvx_queue_length"], 16) << "the streams did not wait for the scheduler";
  EXPECT_GE(m["kvx_http_request_timeouts_total"], 60) << "slow connections were not cut";
}

}  // namespace
}  // namespace kvx::server
