// The transport on its own (no model): hostile and unusual clients on real
// loopback sockets against an HttpTransport with tight limits and a few
// routes. Each case failed on cpp-httplib's own connection handling.
#include "server/http_transport.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>
#include <vector>

#include "support/raw_client.h"

namespace kvx::server {
namespace {

using namespace std::chrono_literals;
using testing::ConnectLoopback;
using testing::CountOf;
using testing::ReadUntilClosed;
using testing::SendAll;

class HttpTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    limits_.max_connections = 4;
    limits_.header_timeout_seconds = 1;
    limits_.request_timeout_seconds = 3;
    limits_.keep_alive_timeout_seconds = 2;
    limits_.max_body_bytes = 64 << 10;
    http_ = std::make_unique<HttpTransport>(limits_, [](const TransportError& e) {
      return "{\"error\":{\"message\":\"" + e.message + "\"}}";
    });
    // The hooks kvx's server installs (server.cc), reduced to the transport's part.
    http_->set_pre_routing_handler([](const httplib::Request&, httplib::Response& res) {
      auto refused = HttpTransport::Refusal();
      if (!refused) return httplib::Server::HandlerResponse::Unhandled;
      res.status = refused->status;
      res.set_content(refused->message, "text/plain");
      return httplib::Server::HandlerResponse::Handled;
    });
    http_->set_error_handler([](const httplib::Request&, httplib::Response& res) {
      if (auto failed = HttpTransport::ReadFailure()) {
        res.status = failed->status;
        res.set_content(failed->message, "text/plain");
      }
    });
    http_->Get("/n", [](const httplib::Request& req, httplib::Response& res) {
      res.set_content("n=" + req.get_param_value("i"), "text/plain");
    });
    http_->Post("/size", [this](const httplib::Request& req, httplib::Response& res) {
      bodies_++;
      res.set_content(std::to_string(req.body.size()), "text/plain");
    });
    // Waits 600 ms as a non-streaming completion does, watching its client.
    http_->Get("/wait", [this](const httplib::Request&, httplib::Response& res) {
      bool gone = false;
      for (int i = 0; i < 6 && !gone; ++i) {
        std::this_thread::sleep_for(100ms);
        gone = CurrentConnection()->Gone();
      }
      if (gone) gone_++;
      res.set_content(gone ? "gone" : "stayed", "text/plain");
    });
    port_ = http_->Bind("127.0.0.1", 0);
    ASSERT_GT(port_, 0);
    thread_ = std::thread([this] { http_->listen_after_bind(); });
  }
  void TearDown() override {
    http_->StopListening();
    thread_.join();
  }
  int Connect() { return ConnectLoopback(port_); }
  // Polls until `done` holds or 3 s pass.
  template <typename F>
  bool WaitFor(F done) {
    for (auto until = std::chrono::steady_clock::now() + 3s; std::chrono::steady_clock::now() < until;) {
      if (done()) return true;
      std::this_thread::sleep_for(10ms);
    }
    return done();
  }

  TransportLimits limits_;
  std::unique_ptr<HttpTransport> http_;
  int port_ = 0;
  std::thread thread_;
  std::atomic<int> bodies_{0};
  std::atomic<int> gone_{0};
};

// A chunked body is counted as it arrives: past --max-body the client gets
// 413 while it is still sending, the handler never sees the body, and the
// server stops reading (it read about the budget, not the 60 MB).
TEST_F(HttpTransportTest, AChunkedBodyOverTheLimitIs413WhileItArrives) {
  const int fd = Connect();
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, "POST /size HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"));
  const std::string chunk = "4000\r\n" + std::string(0x4000, 'a') + "\r\n";
  size_t sent = 0;
  bool answered = false;
  while (sent < (60u << 20) && !answered) {
    pollfd p{fd, POLLIN | POLLOUT, 0};
    ASSERT_GT(poll(&p, 1, 5000), 0) << "the server neither reads nor answers";
    answered = (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
    if (!answered && send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL | MSG_DONTWAIT) > 0) sent += chunk.size();
  }
  const std::string response = ReadUntilClosed(fd, 3s);
  close(fd);
  EXPECT_EQ(response.rfind("HTTP/1.1 413", 0), 0u) << response.substr(0, 200);
  EXPECT_NE(response.find("Connection: close"), std::string::npos);
  EXPECT_NE(response.find("--max-body"), std::string::npos);
  EXPECT_EQ(bodies_, 0);
  // What the client got into the connection: the budget plus socket buffers, far from 60 MB.
  EXPECT_LT(sent, 24u << 20);
}

// Within the budget a chunked body is read whole and the connection stays
// usable (the next request on it is answered).
TEST_F(HttpTransportTest, AChunkedBodyWithinTheLimitIsReadAndTheConnectionKept) {
  const int fd = Connect();
  ASSERT_GE(fd, 0);
  const std::string data(40000, 'b');
  std::string request = "POST /size HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  request += "9c40;ext=1\r\n" + data + "\r\n0\r\n\r\n";  // 0x9c40 = 40000
  request += "GET /n?i=2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  ASSERT_TRUE(SendAll(fd, request));
  const std::string response = ReadUntilClosed(fd, 3s);
  close(fd);
  EXPECT_NE(response.find("\r\n\r\n40000"), std::string::npos) << response;
  EXPECT_NE(response.find("n=2"), std::string::npos) << response;
}

// A Content-Length body over the budget is refused without being read
// (cpp-httplib would read all of it to skip it).
TEST_F(HttpTransportTest, ADeclaredBodyOverTheLimitIs413AtOnce) {
  const int fd = Connect();
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, "POST /size HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\nabc"));
  const std::string response = ReadUntilClosed(fd, 3s);
  close(fd);
  EXPECT_EQ(response.rfind("HTTP/1.1 413", 0), 0u) << response;
  // A client that asks first (Expect: 100-continue) is refused, not invited to send it.
  const int asks = Connect();
  ASSERT_TRUE(SendAll(asks, "POST /size HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n"
                            "Expect: 100-continue\r\n\r\n"));
  const std::string refused = ReadUntilClosed(asks, 3s);
  close(asks);
  EXPECT_EQ(refused.rfind("HTTP/1.1 413", 0), 0u) << refused;
  EXPECT_NE(refused.find("--max-body"), std::string::npos) << refused;
  EXPECT_EQ(bodies_, 0);
}

// Framings the server does not take are refused before the body is read,
// and the connection is closed (its unread bytes are not a request).
TEST_F(HttpTransportTest, FramingsItDoesNotTakeAreRefused) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"Transfer-Encoding: gzip, chunked\r\n", "HTTP/1.1 501"},
      {"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", "HTTP/1.1 400"},
      {"Content-Length: 5\r\nContent-Length: 6\r\n", "HTTP/1.1 400"},
      {"Content-Length: -5\r\n", "HTTP/1.1 400"},
      {"Content-Length: 5\r\nContent-Encoding: gzip\r\n", "HTTP/1.1 415"},
  };
  for (const auto& [headers, status] : cases) {
    const int fd = Connect();
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(SendAll(fd, "POST /size HTTP/1.1\r\nHost: x\r\n" + headers + "\r\nhello" +
                                "GET /n?i=1 HTTP/1.1\r\nHost: x\r\n\r\n"));
    const std::string response = ReadUntilClosed(fd, 3s);
    close(fd);
    EXPECT_EQ(response.rfind(status, 0), 0u) << headers << response;
    EXPECT_EQ(CountOf(response, "HTTP/1.1 "), 1) << headers << response;
  }
  EXPECT_EQ(bodies_, 0);
  // A POST without any framing has an empty body (cpp-httplib read until the client closed).
  const int fd = Connect();
  ASSERT_TRUE(SendAll(fd, "POST /size HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_NE(ReadUntilClosed(fd, 500ms).find("\r\n\r\n0"), std::string::npos);
  close(fd);
}

// Slowloris: one header line every 200 ms never completes the head within
// the 1 s header timeout: 408, the connection closed, its thread freed.
TEST_F(HttpTransportTest, TrickledHeadersGet408) {
  const int fd = Connect();
  ASSERT_GE(fd, 0);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(SendAll(fd, "GET /n?i=1 HTTP/1.1\r\n"));
  std::string response;
  for (int i = 0; i < 25 && response.empty(); ++i) {
    std::this_thread::sleep_for(200ms);
    if (!SendAll(fd, "X-Slow-" + std::to_string(i) + ": 1\r\n")) break;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 0) > 0) response = ReadUntilClosed(fd, 1s);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  close(fd);
  EXPECT_EQ(response.rfind("HTTP/1.1 408", 0), 0u) << response;
  EXPECT_LT(seconds, 2.5);
  EXPECT_TRUE(WaitFor([&] { return http_->Stats().open_connections == 0; }));
  EXPECT_EQ(http_->Stats().request_timeouts, 1u);
}

// A request line that never ends is cut at 64 KiB (cpp-httplib buffered it
// whole before checking its length).
TEST_F(HttpTransportTest, AnEndlessHeadIs431) {
  const int fd = Connect();
  ASSERT_GE(fd, 0);
  SendAll(fd, "GET /n?i=" + std::string(100 << 10, '1'));
  const std::string response = ReadUntilClosed(fd, 3s);
  close(fd);
  EXPECT_EQ(response.rfind("HTTP/1.1 431", 0), 0u) << response.substr(0, 200);
}

// Beyond --max-connections a connection gets 503 with Retry-After at once,
// not a place in a queue; once one closes, new ones are served again.
TEST_F(HttpTransportTest, ConnectionsBeyondTheCapGet503) {
  std::vector<int> held;
  for (int i = 0; i < limits_.max_connections; ++i) {
    held.push_back(Connect());
    ASSERT_TRUE(SendAll(held.back(), "GET /n?i=1 HTTP/1.1\r\n"));  // a head that has not ended
  }
  ASSERT_TRUE(WaitFor([&] { return http_->Stats().open_connections == limits_.max_connections; }));
  const int fd = Connect();
  ASSERT_GE(fd, 0);
  SendAll(fd, "GET /n?i=1 HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string response = ReadUntilClosed(fd, 3s);
  close(fd);
  EXPECT_EQ(response.rfind("HTTP/1.1 503", 0), 0u) << response;
  EXPECT_NE(response.find("Retry-After: 1\r\n"), std::string::npos) << response;
  EXPECT_NE(response.find("{\"error\":{\"message\":\"the server has --max-connections 4"), std::string::npos)
      << response;
  EXPECT_EQ(http_->Stats().refused_connections, 1u);
  close(held.back());
  held.pop_back();
  ASSERT_TRUE(WaitFor([&] { return http_->Stats().open_connections < limits_.max_connections; }));
  const int again = Connect();
  SendAll(again, "GET /n?i=7 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_NE(ReadUntilClosed(again, 3s).find("n=7"), std::string::npos);
  close(again);
  for (int h : held) close(h);
}

// Five pipelined requests in one write get five answers, in order, at once
// (cpp-httplib dropped the bytes it had read past the first request and
// waited for more until its keep-alive timeout).
TEST_F(HttpTransportTest, PipelinedRequestsAreAnsweredInOrder) {
  const int fd = Connect();
  ASSERT_GE(fd, 0);
  std::string requests;
  for (int i = 0; i < 5; ++i) requests += "GET /n?i=" + std::to_string(i) + " HTTP/1.1\r\nHost: x\r\n\r\n";
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(SendAll(fd, requests));
  std::string got;
  while (CountOf(got, "n=") < 5 && std::chrono::steady_clock::now() - t0 < 3s) {
    const std::string more = ReadUntilClosed(fd, 100ms);
    got += more;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  close(fd);
  ASSERT_EQ(CountOf(got, "HTTP/1.1 200"), 5) << got;
  size_t at = 0;
  for (int i = 0; i < 5; ++i) {
    at = got.find("n=" + std::to_string(i), at);
    ASSERT_NE(at, std::string::npos) << "answer " << i << " missing or out of order: " << got;
  }
  EXPECT_LT(seconds, 1.0);
}

// A client that shuts down its write side after its request still reads
// the answer, from a handler that watches its connection (it sees the
// end-of-stream, asks with an interim 100, and the client is still there);
// a client that closes is seen gone.
TEST_F(HttpTransportTest, AHalfClosedClientGetsItsAnswerAClosedOneIsGone) {
  int fd = Connect();
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, "GET /wait HTTP/1.1\r\nHost: x\r\n\r\n"));
  shutdown(fd, SHUT_WR);
  const std::string response = ReadUntilClosed(fd, 3s);
  close(fd);
  EXPECT_EQ(response.rfind("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200", 0), 0u) << response;
  EXPECT_NE(response.find("stayed"), std::string::npos) << response;
  EXPECT_EQ(gone_, 0);

  fd = Connect();
  ASSERT_TRUE(SendAll(fd, "GET /wait HTTP/1.1\r\nHost: x\r\n\r\n"));
  close(fd);
  EXPECT_TRUE(WaitFor([&] { return gone_ == 1; }));
}

// Stop before the listener runs still stops it (cpp-httplib's stop() did
// nothing then, and listen_after_bind never returned).
TEST(HttpTransportStopTest, StopBeforeListenEndsListen) {
  HttpTransport http(TransportLimits{}, [](const TransportError&) { return std::string(); });
  ASSERT_GT(http.Bind("127.0.0.1", 0), 0);
  http.StopListening();
  auto listening = std::async(std::launch::async, [&] { return http.listen_after_bind(); });
  const bool returned = listening.wait_for(3s) == std::future_status::ready;
  EXPECT_TRUE(returned) << "listen_after_bind did not return after StopListening";
  if (!returned) http.stop();  // it runs now: the library's own stop ends it
}

}  // namespace
}  // namespace kvx::server
