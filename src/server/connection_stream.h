// One client connection as cpp-httplib reads and writes it (an
// httplib::Stream), with the limits kvx serve puts on what a client may
// send. It replaces cpp-httplib 0.11's SocketStream, which (a) is made anew
// for each request, so bytes it had read past the first request (pipelined
// requests) were dropped and the connection stalled until the keep-alive
// timeout; (b) reports a half-closed client (EOF on its side) as not
// writable, so it never got its answer; (c) bounds each read, never a
// request, so one header line a second held a worker forever; (d) counts no
// chunked body against the payload limit.
//
// Here one stream lives as long as its connection (its read buffer keeps
// pipelined requests), and each request has deadlines and byte budgets:
//   head   the request line and headers must arrive within the header
//          timeout of the request's first byte, in at most kMaxHeadBytes;
//   body   the whole request within the request timeout of its first byte;
//          the body (as framed by Content-Length, or the payload of its
//          chunks) within max_body_bytes.
// A read past a deadline or a budget fails, and failure() says which, so the
// server can answer 408, 413 or 431 and close the connection.
//
// Thread-safety: one thread (the connection's) uses a stream.
#pragma once

#include <httplib.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "server/transport_limits.h"

namespace kvx::server {

// The request line and headers of one request at most (cpp-httplib checks a
// line's length only once it has read the whole line into memory).
inline constexpr size_t kMaxHeadBytes = 64 << 10;

// Follows a chunked body's framing as its bytes are read: the payload
// bytes so far and whether the last chunk and the final CRLF arrived. A
// framing it does not take (extensions are skipped; trailers are not taken,
// as cpp-httplib 0.11 takes none) makes it invalid(), after which every
// byte counts as payload, so the budget holds whatever the library parses.
class ChunkedBodyMeter {
 public:
  void Feed(const char* data, size_t n);
  uint64_t payload() const { return payload_; }
  bool done() const { return state_ == State::kDone; }
  bool invalid() const { return state_ == State::kInvalid; }

 private:
  // kCr, kLf: a line end, then after_.
  enum class State { kSize, kExtension, kData, kCr, kLf, kDone, kInvalid };
  void Fail() { state_ = State::kInvalid; }
  State state_ = State::kSize;
  State after_ = State::kData;
  uint64_t size_ = 0;  // of the chunk being read
  int digits_ = 0;
  uint64_t payload_ = 0;
};

// How a request frames its body, from its headers.
struct BodyFraming {
  // kRefused: a framing the server refuses (its body is never read).
  enum class Kind { kNone, kLength, kChunked, kRefused };
  Kind kind = Kind::kNone;
  uint64_t length = 0;  // kLength
};

class ConnectionStream : public httplib::Stream {
 public:
  enum class Failure { kNone, kTimeout, kHeadTooLarge, kBodyTooLarge, kBroken };

  // `stopping` is polled while waiting to read, so a stopping server does
  // not wait for a slow client's deadline.
  ConnectionStream(int fd, const TransportLimits& limits, std::function<bool()> stopping);

  // Waits up to `seconds` for the first byte of the next request (already
  // buffered, or arriving). False: the client closed, went quiet or the
  // server is stopping.
  bool WaitForRequest(double seconds);
  // A request starts: its deadlines run from now.
  void BeginRequest();
  // Its headers are in: what follows is its body, framed so.
  void BeginBody(const BodyFraming& framing);
  // Whether another request may follow on this connection: nothing failed
  // and the body was read exactly to its end (a refused or unread body
  // leaves bytes that are not a request).
  bool Reusable() const;
  Failure failure() const { return failure_; }
  // Whether the request declared (Content-Length) a body over the budget.
  bool DeclaredBodyTooLarge() const {
    return framing_.kind == BodyFraming::Kind::kLength && framing_.length > limits_.max_body_bytes;
  }
  // Bytes written for the current request (0: no response started).
  size_t written() const { return written_; }
  // Writes bytes that are not the response (an interim 1xx response).
  bool WriteInterim(const std::string& bytes);

  // httplib::Stream.
  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  socket_t socket() const override { return fd_; }

 private:
  using Clock = std::chrono::steady_clock;
  enum class Phase { kIdle, kHead, kBody };
  // Reads more from the socket into the buffer, waiting until `deadline`;
  // false on EOF or failure (failure_ set unless EOF).
  bool Fill(Clock::time_point deadline);
  // How many of the `n` buffered bytes at hand the body may take (0 and
  // failure_ set when it is over budget).
  size_t AdmitBody(size_t n);
  bool SendAll(const char* data, size_t n);
  void Fail(Failure f) {
    if (failure_ == Failure::kNone) failure_ = f;
  }

  int fd_;
  TransportLimits limits_;
  std::function<bool()> stopping_;
  std::vector<char> buf_;
  size_t begin_ = 0, end_ = 0;  // unread bytes: buf_[begin_, end_)
  bool eof_ = false;
  Phase phase_ = Phase::kIdle;
  Clock::time_point head_deadline_, request_deadline_;
  size_t head_bytes_ = 0;
  BodyFraming framing_;
  uint64_t body_bytes_ = 0;  // read so far (Content-Length framing)
  ChunkedBodyMeter chunks_;
  Failure failure_ = Failure::kNone;
  size_t written_ = 0;
};

}  // namespace kvx::server
