#include "server/http_transport.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <strings.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace kvx::server {
namespace {

// Requests one connection may carry (the Keep-Alive header says so).
constexpr size_t kMaxRequestsPerConnection = 1000;

thread_local ClientConnection* t_connection = nullptr;
// Set on the accepting thread while it refuses a connection over the cap.
thread_local bool t_over_cap = false;

// cpp-httplib's task queue, replaced: a thread for each connection, made
// when none is free and kept for the next one, up to `max` connections;
// beyond them a connection is handed back to the accepting thread at once
// (t_over_cap), which refuses it.
class ConnectionThreads : public httplib::TaskQueue {
 public:
  ConnectionThreads(int max, std::atomic<int64_t>& open) : max_(max), open_(open) {}

  void enqueue(std::function<void()> fn) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (busy_ >= max_) {
      lock.unlock();
      t_over_cap = true;
      fn();
      t_over_cap = false;
      return;
    }
    open_ = ++busy_;
    jobs_.push_back(std::move(fn));
    // busy_ counts queued and running jobs; a thread per job.
    if (static_cast<size_t>(busy_) > threads_.size()) {
      threads_.emplace_back([this] { Work(); });
    } else {
      cv_.notify_one();
    }
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      shutting_down_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  void Work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return !jobs_.empty() || shutting_down_; });
      if (jobs_.empty()) return;
      std::function<void()> fn = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
      open_ = --busy_;
    }
  }

  const int max_;
  std::atomic<int64_t>& open_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  int busy_ = 0;
  bool shutting_down_ = false;
};

const char* Reason(int status) {
  switch (status) {
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Bad Request";
  }
}

// A whole error response that closes the connection.
std::string ErrorResponse(const TransportError& e, const std::string& body) {
  std::string out = "HTTP/1.1 " + std::to_string(e.status) + " " + Reason(e.status) + "\r\n";
  out += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  if (e.status == 503) out += "Retry-After: 1\r\n";
  return out + "Connection: close\r\n\r\n" + body;
}

// Closes a connection so that the client reads what was sent (nginx's
// "lingering close"): closing a socket with unread input resets the
// connection, and a client still sending a body we refused (413 on its
// Content-Length) would see the reset, not the answer. The write side is
// shut first (the client sees the answer end), then input is read and
// dropped, never kept, until the client closes, is quiet for a second, or
// for 5 s at most (not while the server stops).
void CloseGently(int fd, bool linger) {
  shutdown(fd, SHUT_WR);
  char sink[16 << 10];
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(linger ? 5 : 0);
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 1000) <= 0 || recv(fd, sink, sizeof sink, MSG_DONTWAIT) <= 0) break;
  }
  close(fd);
}

TransportError BodyTooLarge() { return {413, "the request body is too large (--max-body)"}; }

bool AllDigits(const std::string& s) {
  return !s.empty() && s.size() <= 18 && s.find_first_not_of("0123456789") == std::string::npos;
}

}  // namespace

ClientConnection* CurrentConnection() { return t_connection; }

void ClientConnection::Start(httplib::Request& req) {
  http11_ = req.version == "HTTP/1.1";
  probed_ = false;
  refusal_.reset();
  BodyFraming framing;
  const size_t lengths = req.get_header_value_count("Content-Length");
  const size_t codings = req.get_header_value_count("Transfer-Encoding");
  const std::string encoding = req.get_header_value("Content-Encoding");
  if (!encoding.empty() && strcasecmp(encoding.c_str(), "identity") != 0) {
    refusal_ = {415, "request bodies with Content-Encoding '" + encoding +
                         "' are not accepted (inflated, they could exceed --max-body): send the body uncompressed"};
  } else if (codings > 0) {
    const std::string coding = req.get_header_value("Transfer-Encoding");
    if (codings > 1 || strcasecmp(coding.c_str(), "chunked") != 0) {
      refusal_ = {501, "Transfer-Encoding '" + coding + "' is not supported: send Content-Length or chunked"};
    } else if (lengths > 0) {
      refusal_ = {400, "a request cannot have both Content-Length and Transfer-Encoding"};
    } else {
      framing.kind = BodyFraming::Kind::kChunked;
    }
  } else if (lengths > 0) {
    const std::string length = req.get_header_value("Content-Length");
    if (lengths > 1 || !AllDigits(length)) {
      refusal_ = {400, "invalid Content-Length '" + length + "': one decimal number of bytes"};
    } else {
      framing.kind = BodyFraming::Kind::kLength;
      framing.length = std::stoull(length);
    }
  } else {
    // No framing: an empty body (RFC 9112 6.3), not "until the client closes" as cpp-httplib reads a POST.
    req.set_header("Content-Length", "0");
    framing.kind = BodyFraming::Kind::kLength;
  }
  if (refusal_) framing.kind = BodyFraming::Kind::kRefused;
  stream_.BeginBody(framing);
}

bool ClientConnection::Gone() {
  pollfd p{stream_.socket(), static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if ((p.revents & (POLLERR | POLLHUP | POLLNVAL)) != 0) return true;
  if ((p.revents & POLLRDHUP) == 0 || probed_ || !http11_) return false;
  probed_ = true;
  return !stream_.WriteInterim("HTTP/1.1 100 Continue\r\n\r\n");
}

HttpTransport::HttpTransport(const TransportLimits& limits,
                             std::function<std::string(const TransportError&)> error_body)
    : limits_(limits), error_body_(std::move(error_body)) {
  new_task_queue = [this] { return new ConnectionThreads(limits_.max_connections, open_); };
  set_payload_max_length(limits_.max_body_bytes);
  set_keep_alive_max_count(kMaxRequestsPerConnection);
  set_keep_alive_timeout(static_cast<time_t>(limits_.keep_alive_timeout_seconds));
  // A client that asks before sending its body (Expect: 100-continue, as
  // curl does for large ones) is refused before it sends it, not invited
  // with 100 (cpp-httplib's answer to every such request).
  set_expect_100_continue_handler([this](const httplib::Request&, httplib::Response& res) {
    std::optional<TransportError> refused = Refusal();
    if (!refused && t_connection != nullptr && t_connection->stream().DeclaredBodyTooLarge()) {
      refused = BodyTooLarge();
    }
    if (!refused) return 100;
    res.status = refused->status;
    res.set_content(error_body_(*refused), "application/json");
    return refused->status;
  });
  // A response on a connection that cannot carry another request says so.
  set_post_routing_handler([](const httplib::Request&, httplib::Response& res) {
    ClientConnection* c = CurrentConnection();
    if (c != nullptr && !c->stream().Reusable()) {
      res.headers.erase("Keep-Alive");
      res.set_header("Connection", "close");
    }
  });
}

int HttpTransport::Bind(const std::string& host, int port) {
  const int bound = port == 0 ? bind_to_any_port(host) : (bind_to_port(host, port) ? port : -1);
  if (bound >= 0) ::listen(svr_sock_, SOMAXCONN);  // a second listen() only resizes the backlog
  return bound;
}

void HttpTransport::StopListening() {
  // cpp-httplib's stop() does this only once its accept loop runs; the loop
  // checks the socket before each accept, and shutdown() wakes an accept.
  const socket_t sock = svr_sock_.exchange(INVALID_SOCKET);
  if (sock == INVALID_SOCKET) return;
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
}

TransportStats HttpTransport::Stats() const { return {open_.load(), refused_.load(), timeouts_.load()}; }

std::optional<TransportError> HttpTransport::Refusal() {
  return t_connection != nullptr ? t_connection->refusal() : std::nullopt;
}

std::optional<TransportError> HttpTransport::ReadFailure() {
  if (t_connection == nullptr) return std::nullopt;
  switch (t_connection->stream().failure()) {
    case ConnectionStream::Failure::kTimeout:
      return TransportError{408, "the request did not arrive in time (--header-timeout for the request line and "
                                 "headers, --request-timeout for the whole request)"};
    case ConnectionStream::Failure::kHeadTooLarge:
      return TransportError{431, "the request line and headers exceed 64 KiB"};
    case ConnectionStream::Failure::kBodyTooLarge:
      return BodyTooLarge();
    default:
      return std::nullopt;
  }
}

bool HttpTransport::process_and_close_socket(socket_t sock) {
  if (t_over_cap) {
    RefuseConnection(sock);
    return false;
  }
  ConnectionStream stream(sock, limits_, [this] { return svr_sock_ == INVALID_SOCKET; });
  Serve(stream);
  CloseGently(sock, /*linger=*/svr_sock_ != INVALID_SOCKET);
  return true;
}

void HttpTransport::Serve(ConnectionStream& stream) {
  ClientConnection connection(stream);
  t_connection = &connection;
  for (size_t served = 0; stream.WaitForRequest(limits_.keep_alive_timeout_seconds);) {
    stream.BeginRequest();
    const bool last = ++served == kMaxRequestsPerConnection;
    bool client_closes = false;
    const bool ok = process_request(stream, last, client_closes,
                                    [&](httplib::Request& req) { connection.Start(req); });
    if (stream.failure() == ConnectionStream::Failure::kTimeout) timeouts_++;
    if (auto failed = ReadFailure(); failed && stream.written() == 0) {
      // Failed in the request line: cpp-httplib answers nothing then.
      const std::string response = ErrorResponse(*failed, error_body_(*failed));
      stream.write(response.data(), response.size());
    }
    if (!ok || client_closes || last || !stream.Reusable()) break;
  }
  t_connection = nullptr;
}

// Over the cap, on the accepting thread: answer without blocking (a new
// socket's send buffer is empty) and close.
void HttpTransport::RefuseConnection(socket_t sock) {
  refused_++;
  const TransportError e{503, "the server has --max-connections " + std::to_string(limits_.max_connections) +
                                  " connections open; retry shortly"};
  const std::string response = ErrorResponse(e, error_body_(e));
  (void)send(sock, response.data(), response.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  shutdown(sock, SHUT_WR);
  char sink[4096];
  for (int i = 0; i < 16 && recv(sock, sink, sizeof sink, MSG_DONTWAIT) > 0; ++i) {
  }
  close(sock);
}

}  // namespace kvx::server
