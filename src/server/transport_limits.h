// What kvx serve lets a client take (flags of `kvx serve`; enforced by
// server/http_transport.h and server/connection_stream.h). Its own header so
// that server/server.h and the command line need not include cpp-httplib.
#pragma once

#include <cstddef>

namespace kvx::server {

struct TransportLimits {
  int max_connections = 256;               // beyond: 503 at accept
  double header_timeout_seconds = 10;      // first byte of a request -> end of its headers
  double request_timeout_seconds = 60;     // first byte of a request -> end of its body
  double keep_alive_timeout_seconds = 5;   // idle between requests (and before the first)
  size_t max_body_bytes = 8 << 20;         // Content-Length, or a chunked body's payload
};

}  // namespace kvx::server
