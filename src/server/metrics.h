// Prometheus text exposition (version 0.0.4) of the scheduler's Stats() and
// the server's own HTTP counters, for GET /metrics.
//
// Thread-safety: pure function.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "engine/scheduler.h"

namespace kvx::server {

struct HttpCounters {
  std::map<int, uint64_t> responses_by_status;  // e.g. {200: 12, 400: 3}
  uint64_t client_disconnects = 0;              // streams the client left before the end
  int64_t open_connections = 0;                 // server/http_transport.h
  uint64_t refused_connections = 0;             // 503 at --max-connections
  uint64_t request_timeouts = 0;                // 408
};

std::string RenderMetrics(const engine::SchedulerStats& stats, const HttpCounters& http);

}  // namespace kvx::server
