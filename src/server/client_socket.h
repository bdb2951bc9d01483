// The socket a request came on, so that a handler that waits (a
// non-streaming completion) can notice a client that went away and cancel
// its work. cpp-httplib 0.11 (Debian 12's) does not hand the socket to
// handlers, nor has it Request::is_connection_closed (0.15+); a streaming
// response notices a gone client when a write fails, a plain one writes
// nothing until the end. The request does carry both ends' addresses, and
// while its handler runs its connection is open, so exactly one of the
// process's sockets has that (local, peer) address pair.
#pragma once

#include <string>

namespace kvx::server {

// The descriptor of the connected socket whose local address is
// local_addr:local_port and whose peer is remote_addr:remote_port (numeric
// addresses, as cpp-httplib fills httplib::Request), or -1. Scans
// /proc/self/fd: call it once per request, and only for requests that wait.
int FindConnectionSocket(const std::string& local_addr, int local_port, const std::string& remote_addr,
                         int remote_port);

// Whether the peer of connected socket `fd` has closed its end (or the
// connection broke), without blocking and without consuming data: an
// orderly close or a shut-down write side (POLLRDHUP, a peek reading 0
// bytes) or an error. A client that pipelines its next request is still
// there.
bool PeerClosed(int fd);

}  // namespace kvx::server
