// HttpTransport: kvx serve's HTTP/1.1 transport. cpp-httplib 0.11
// (Debian 12's) parses requests, routes them and writes responses; this
// class replaces what it does with connections (its virtual
// process_and_close_socket and its task queue), because that part could be
// taken down by one client (docs/serving.md, "Hostile clients"):
//
//   - a thread per connection, up to TransportLimits::max_connections, and
//     no queue: a connection never waits behind others for a worker, so
//     /health and /metrics are answered at once while every request worker
//     is busy (streams waiting for the scheduler) or trickled at. Beyond the
//     cap a connection gets 503 with Retry-After at once, written by the
//     accepting thread (cpp-httplib queued it behind busy workers);
//   - each connection's requests are read through one ConnectionStream
//     (server/connection_stream.h): pipelined requests are answered in
//     order, deadlines bound a request's head and body (408), the body
//     budget holds for chunked bodies (413), a head over 64 KiB is 431;
//   - framings that the library would read wrongly or without bound are
//     refused before the body is read (Refusal()): a Transfer-Encoding other
//     than chunked (501), both Content-Length and Transfer-Encoding or a
//     malformed Content-Length (400), a Content-Encoding (415: the library
//     would inflate it past any budget). A body-less POST is a body of 0
//     bytes, not "until the client closes";
//   - a connection whose request was refused, failed or left unread bytes
//     is closed after its answer (Connection: close), gently: the write
//     side first, then what the client still sends is read briefly, so
//     that it gets the answer rather than a reset;
//   - StopListening works before the listener runs too (cpp-httplib's
//     stop() does nothing then, and listen() then never returned).
//
// Handlers learn about their connection through CurrentConnection(): a
// connection is served by one thread from accept to close.
#pragma once

#include <httplib.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "server/connection_stream.h"

namespace kvx::server {

// An error the transport answers, or has the server answer.
struct TransportError {
  int status = 400;
  std::string message;
};

// The connection a request came on, for its handler.
class ClientConnection {
 public:
  explicit ClientConnection(ConnectionStream& stream) : stream_(stream) {}

  // Whether the client went away while its request runs, without blocking
  // or consuming a pipelined request. An end-of-stream from the client is a
  // half-close (it still reads) or a close (it reads no more): the first
  // time one is seen (HTTP/1.1), an interim "100 Continue" tells them
  // apart, since a closed socket answers it with a reset, seen at the next
  // call. An HTTP/1.0 client cannot be asked: its end-of-stream counts as a
  // half-close.
  bool Gone();

  // Called with each request's headers (setup_request): its framing.
  void Start(httplib::Request& req);
  const std::optional<TransportError>& refusal() const { return refusal_; }
  ConnectionStream& stream() { return stream_; }

 private:
  ConnectionStream& stream_;
  bool http11_ = true;
  bool probed_ = false;
  std::optional<TransportError> refusal_;
};

// The connection the calling thread serves (nullptr off a connection's
// thread).
ClientConnection* CurrentConnection();

struct TransportStats {
  int64_t open_connections = 0;
  uint64_t refused_connections = 0;  // 503 at the cap
  uint64_t request_timeouts = 0;     // 408
};

class HttpTransport : public httplib::Server {
 public:
  // error_body: the body (JSON) of an error response the transport writes
  // itself (503 at the cap, 408/431 before a request line was read).
  HttpTransport(const TransportLimits& limits, std::function<std::string(const TransportError&)> error_body);

  // Binds host:port (0: any free port) and listens with a backlog a burst
  // of clients does not overflow (cpp-httplib listens with 5: the rest of a
  // burst waits for SYN retransmits, 1 s and more). The port, or -1.
  int Bind(const std::string& host, int port);
  // Stops accepting and ends the connections' waits; Run (listen_after_bind)
  // returns once every connection thread ended. Works before Run too.
  void StopListening();
  TransportStats Stats() const;

  // For the pre-routing handler: the current request's framing refusal.
  static std::optional<TransportError> Refusal();
  // For the error handler: why reading the current request failed (408,
  // 413, 431), if it did.
  static std::optional<TransportError> ReadFailure();

 protected:
  bool process_and_close_socket(socket_t sock) override;

 private:
  void Serve(ConnectionStream& stream);
  void RefuseConnection(socket_t sock);

  TransportLimits limits_;
  std::function<std::string(const TransportError&)> error_body_;
  std::atomic<int64_t> open_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> timeouts_{0};
};

}  // namespace kvx::server
