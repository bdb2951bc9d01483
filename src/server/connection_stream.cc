#include "server/connection_stream.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace kvx::server {
namespace {

// A client that reads nothing for this long is gone (cpp-httplib's default
// write timeout, which it also sets as SO_SNDTIMEO on each connection).
constexpr int kWriteTimeoutMs = 5000;
// Waits are sliced so that a stopping server is noticed within this.
constexpr int kStopCheckMs = 100;

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Numeric host and port of a socket's local or peer address.
void AddressOf(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  const int got = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len)
                       : getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  if (got != 0 || getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, host, sizeof host, serv, sizeof serv,
                              NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return;
  }
  ip = host;
  port = std::atoi(serv);
}

}  // namespace

void ChunkedBodyMeter::Feed(const char* data, size_t n) {
  for (size_t i = 0; i < n;) {
    if (state_ == State::kInvalid) {
      payload_ += n - i;
      return;
    }
    if (state_ == State::kData) {
      const uint64_t take = std::min<uint64_t>(n - i, size_);
      payload_ += take;
      size_ -= take;
      i += take;
      if (size_ == 0) {
        state_ = State::kCr;
        after_ = State::kSize;
      }
      continue;
    }
    const char c = data[i];
    switch (state_) {
      case State::kSize:
        if (const int d = HexDigit(c); d >= 0 && digits_ < 15) {  // 60 bits: no overflow
          size_ = size_ * 16 + static_cast<uint64_t>(d);
          ++digits_;
        } else if (c == ';' && digits_ > 0) {
          state_ = State::kExtension;
        } else if (c == '\r' && digits_ > 0) {
          state_ = State::kLf;
          after_ = State::kData;
        } else {
          Fail();
          continue;  // this byte counts as payload
        }
        break;
      case State::kExtension:
        if (c == '\r') {
          state_ = State::kLf;
          after_ = State::kData;
        }
        break;
      case State::kCr:
      case State::kLf:
        if (c != (state_ == State::kCr ? '\r' : '\n')) {
          Fail();
          continue;
        }
        if (state_ == State::kCr) {
          state_ = State::kLf;
        } else if (after_ == State::kData && size_ == 0) {  // the last chunk: one more line end
          state_ = State::kCr;
          after_ = State::kDone;
        } else {
          state_ = after_;
          digits_ = 0;
        }
        break;
      default:  // kDone: bytes past the end are not this body's
        Fail();
        continue;
    }
    ++i;
  }
}

ConnectionStream::ConnectionStream(int fd, const TransportLimits& limits, std::function<bool()> stopping)
    : fd_(fd), limits_(limits), stopping_(std::move(stopping)), buf_(16 << 10) {}

bool ConnectionStream::WaitForRequest(double seconds) {
  if (begin_ < end_) return true;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  return Fill(deadline);
}

void ConnectionStream::BeginRequest() {
  const auto now = Clock::now();
  auto after = [&](double s) { return now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)); };
  phase_ = Phase::kHead;
  head_deadline_ = std::min(after(limits_.header_timeout_seconds), after(limits_.request_timeout_seconds));
  request_deadline_ = after(limits_.request_timeout_seconds);
  head_bytes_ = 0;
  framing_ = {};
  body_bytes_ = 0;
  chunks_ = {};
  failure_ = Failure::kNone;
  written_ = 0;
}

void ConnectionStream::BeginBody(const BodyFraming& framing) {
  phase_ = Phase::kBody;
  framing_ = framing;
}

bool ConnectionStream::Reusable() const {
  if (failure_ != Failure::kNone) return false;
  switch (framing_.kind) {
    case BodyFraming::Kind::kNone: return true;
    case BodyFraming::Kind::kLength: return body_bytes_ == framing_.length;
    case BodyFraming::Kind::kChunked: return chunks_.done();
    case BodyFraming::Kind::kRefused: return false;
  }
  return false;
}

bool ConnectionStream::Fill(Clock::time_point deadline) {
  if (eof_) return false;
  if (begin_ == end_) begin_ = end_ = 0;
  for (;;) {
    if (stopping_()) {
      Fail(Failure::kBroken);
      return false;
    }
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      Fail(Failure::kTimeout);
      return false;
    }
    pollfd p{fd_, POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, kStopCheckMs)));
    if (ready == 0 || (ready < 0 && errno == EINTR)) continue;
    const ssize_t got = ready < 0 ? -1 : recv(fd_, buf_.data() + end_, buf_.size() - end_, MSG_DONTWAIT);
    if (got > 0) {
      end_ += static_cast<size_t>(got);
      return true;
    }
    if (got == 0) {
      eof_ = true;
      return false;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      Fail(Failure::kBroken);
      return false;
    }
  }
}

size_t ConnectionStream::AdmitBody(size_t n) {
  switch (framing_.kind) {
    case BodyFraming::Kind::kLength:
      if (framing_.length > limits_.max_body_bytes) {
        Fail(Failure::kBodyTooLarge);  // cpp-httplib answers 413 and would read it all to skip it
        return 0;
      }
      n = static_cast<size_t>(std::min<uint64_t>(n, framing_.length - body_bytes_));
      body_bytes_ += n;
      break;
    case BodyFraming::Kind::kChunked:
      chunks_.Feed(buf_.data() + begin_, n);
      if (chunks_.payload() > limits_.max_body_bytes) Fail(Failure::kBodyTooLarge);
      break;
    default:  // no body, or one the server refused: nothing to read
      n = 0;
      break;
  }
  if (n == 0) Fail(Failure::kBroken);
  return failure_ == Failure::kNone ? n : 0;
}

ssize_t ConnectionStream::read(char* ptr, size_t size) {
  if (failure_ != Failure::kNone) return -1;
  if (begin_ == end_ && !Fill(phase_ == Phase::kHead ? head_deadline_ : request_deadline_)) {
    return failure_ == Failure::kNone ? 0 : -1;  // 0: the client closed its side
  }
  size_t n = std::min(size, end_ - begin_);
  if (phase_ == Phase::kHead) {
    head_bytes_ += n;
    if (head_bytes_ > kMaxHeadBytes) {
      Fail(Failure::kHeadTooLarge);
      return -1;
    }
  } else if (phase_ == Phase::kBody) {
    n = AdmitBody(n);
    if (n == 0) return -1;
  }
  std::memcpy(ptr, buf_.data() + begin_, n);
  begin_ += n;
  return static_cast<ssize_t>(n);
}

bool ConnectionStream::is_readable() const {
  if (begin_ < end_) return true;
  pollfd p{fd_, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

// Writable while the client reads: a client that half-closed (sent FIN
// after its request) still reads its answer; a reset or closed socket is
// not writable.
bool ConnectionStream::is_writable() const {
  pollfd p{fd_, POLLOUT, 0};
  int ready;
  do {
    ready = poll(&p, 1, kWriteTimeoutMs);
  } while (ready < 0 && errno == EINTR);
  return ready > 0 && (p.revents & POLLOUT) != 0 && (p.revents & (POLLERR | POLLHUP | POLLNVAL)) == 0;
}

bool ConnectionStream::SendAll(const char* data, size_t n) {
  while (n > 0) {
    if (!is_writable()) return false;
    const ssize_t sent = send(fd_, data, n, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return false;
    }
    data += sent;
    n -= static_cast<size_t>(sent);
  }
  return true;
}

ssize_t ConnectionStream::write(const char* ptr, size_t size) {
  if (!SendAll(ptr, size)) return -1;
  written_ += size;
  return static_cast<ssize_t>(size);
}

bool ConnectionStream::WriteInterim(const std::string& bytes) { return SendAll(bytes.data(), bytes.size()); }

void ConnectionStream::get_remote_ip_and_port(std::string& ip, int& port) const { AddressOf(fd_, true, ip, port); }

void ConnectionStream::get_local_ip_and_port(std::string& ip, int& port) const { AddressOf(fd_, false, ip, port); }

}  // namespace kvx::server
