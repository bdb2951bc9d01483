// Server: kvx's OpenAI-compatible HTTP server (cpp-httplib) over one
// engine::Scheduler. It keeps the routes and the lifecycle; a completion is
// parsed and built into a scheduler request by server/openai.h (chat
// template, tokenizer), checked by Scheduler::Submit (the one gate), and
// answered whole or streamed by server/completion.h.
//
// Endpoints:
//   POST /v1/completions, /v1/chat/completions   stream or not, OpenAI shapes
//   GET  /v1/models                              the one model served
//   GET  /health                                 200 {"status":"ok"}; 503 while shutting down
//   GET  /metrics                                Prometheus text (server/metrics.h)
//   POST /v1/sessions/{name}/save | /restore     named sessions to/from session files
//                                                (engine/session_file.h) in --session-dir
//   GET  /v1/sessions, DELETE /v1/sessions/{name}
// With API keys, every endpoint but /health needs "Authorization: Bearer
// KEY" (401 otherwise), and the key is the request's tenant; without keys
// the tenant is the advisory `user` (server/tenants.h). Named sessions and
// their files are per tenant: another tenant's is 404, as a missing one.
// Another method on a served path is 405 with Allow; 429 (a full queue: the
// one retryable refusal) carries Retry-After.
//
// Clients that leave: a stream's client is noticed at the next write (a
// token, or a ": keep-alive" comment sent every 100 ms while the request
// waits or prefills); a non-streaming request's handler checks its
// connection every 100 ms while it waits (ClientConnection::Gone in
// server/http_transport.h: a client that only half-closed still gets its
// answer). Either way the request is cancelled at once (Scheduler::Cancel
// frees its sequences before the next step).
//
// Connections (server/http_transport.h): a thread each, up to
// --max-connections (503 beyond), header and request deadlines (408), the
// body budget for every framing (413), pipelined requests in order.
//
// Shutdown (Stop, e.g. on SIGTERM): new requests get 503; requests in flight
// may finish for `shutdown_grace_seconds`, then the rest are cancelled
// (streams end with an error event and [DONE]); then the listener stops.
//
// Thread-safety: Stop may be called from any thread (before Run too);
// handlers run on their connection's thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/scheduler.h"
#include "server/chat_template.h"
#include "server/completion.h"
#include "server/transport_limits.h"
#include "server/metrics.h"
#include "server/tenants.h"
#include "util/status.h"

namespace httplib {
struct Request;
struct Response;
}

namespace kvx::server {

class HttpTransport;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                 // 0: any free port (see port())
  std::vector<ApiKey> api_keys;    // none: no authentication; else each key is a tenant (server/tenants.h)
  bool reuse_port = false;         // SO_REUSEPORT: let other processes listen on the same port
  std::string model_id;            // the name /v1/models reports
  std::string kv_spec;             // reported by /v1/models
  TransportLimits limits;          // connections, timeouts, body size (server/http_transport.h)
  int max_n = 16;                  // samples per request
  std::string session_dir;         // "": session endpoints answer 501
  std::string chat_template;       // a Jinja chat template (--chat-template); "": the model's
  double shutdown_grace_seconds = 5;
  engine::ChunkRepair chunk_repair;  // of requests with chunks that name none (--chunk-repair)
};

class Server final : private CompletionHost {
 public:
  // Binds the socket (IoError naming host:port when it cannot). The
  // scheduler must outlive the server.
  static Result<std::unique_ptr<Server>> Create(engine::Scheduler& scheduler, const ServerOptions& options);
  ~Server();

  int port() const { return port_; }
  // Serves until Stop(); returns when the listener has stopped.
  void Run();
  // The shutdown above; blocks until in-flight requests ended. Idempotent.
  void Stop();


 private:
  Server(engine::Scheduler& scheduler, const ServerOptions& options);
  // The routes: hooks (authentication, error pages, counters), the
  // informational endpoints, completions, named sessions.
  void Routes();
  void InstallHooks();
  // Registers `handler` for `method` ("GET", "POST", "DELETE") on `pattern`
  // and remembers the pair: another method on a served path is 405 with
  // Allow (AllowedMethods: ", "-joined, "" for a path nothing serves).
  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;
  void Route(const std::string& method, const std::string& pattern, Handler handler);
  std::string AllowedMethods(const std::string& path) const;
  void InfoRoutes();
  void CompletionRoutes();
  void SessionRoutes();
  void HandleCompletion(bool chat, const httplib::Request& req, httplib::Response& res);
  // The request's tenant: its key's, or (without keys) its `user`'s.
  Tenant TenantOf(const httplib::Request& req, const std::string& user) const;
  // A session endpoint's work on the scheduler thread ("save", "restore",
  // "delete"); its answer's fields go into *out.
  Status SessionAction(const std::string& action, const Tenant& tenant, const std::string& name, nlohmann::json* out);
  HttpCounters Counters() const;
  // CompletionHost.
  engine::Scheduler& scheduler() override { return scheduler_; }
  void Track(engine::RequestId id, bool live) override;
  std::shared_ptr<void> OpenResponse() override;
  void CountDisconnect() override;

  engine::Scheduler& scheduler_;
  ServerOptions options_;
  std::unique_ptr<HttpTransport> http_;
  std::unique_ptr<ChatTemplate> chat_;
  Tenants tenants_;
  std::vector<std::pair<std::string, std::string>> routes_;  // (path pattern, method); set before listening
  int port_ = 0;
  int64_t created_ = 0;
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> next_id_{1};
  mutable std::mutex mu_;
  std::condition_variable idle_;
  std::set<engine::RequestId> live_;  // submitted, not finished
  int open_calls_ = 0;                // handlers still producing a response
  HttpCounters counters_;
  std::mutex stop_mu_;
  bool stopped_ = false;
};

}  // namespace kvx::server
