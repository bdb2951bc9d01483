#include "server/server.h"

#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <algorithm>
#include <filesystem>
#include <string_view>

#include "engine/session_file.h"
#include "server/http_transport.h"
#include "server/openai.h"
#include "util/check.h"

namespace kvx::server {

using nlohmann::json;

namespace {

// Counts an open response while it is produced (Stop waits for them).
class OpenCall {
 public:
  OpenCall(std::mutex& mu, std::condition_variable& cv, int& n) : mu_(mu), cv_(cv), n_(n) {
    std::lock_guard<std::mutex> lock(mu_);
    ++n_;
  }
  ~OpenCall() {
    std::lock_guard<std::mutex> lock(mu_);
    --n_;
    cv_.notify_all();
  }

 private:
  std::mutex& mu_;
  std::condition_variable& cv_;
  int& n_;
};

}  // namespace

Result<std::unique_ptr<Server>> Server::Create(engine::Scheduler& scheduler, const ServerOptions& options) {
  std::unique_ptr<Server> s(new Server(scheduler, options));
  const engine::Engine& e = scheduler.engine();
  const model::Tokenizer& tok = e.model().tokenizer();
  KVX_ASSIGN_OR_RETURN(std::string source, e.model().file().GetStringOr("tokenizer.chat_template", ""));
  const bool own = !options.chat_template.empty();
  // A template that cannot be parsed, or passes the sandbox's limits on one
  // message, fails the start (serving ChatML instead would be silently wrong).
  KVX_ASSIGN_OR_RETURN(ChatTemplate chat,
                       ChatTemplate::Create(own ? options.chat_template : source, tok,
                                            own ? "the --chat-template file" : ChatTemplate::kModelTemplate));
  s->chat_ = std::make_unique<ChatTemplate>(std::move(chat));
  s->Routes();
  s->port_ = s->http_->Bind(options.host, options.port);
  if (s->port_ < 0) {
    return IoError("cannot listen on " + options.host + ":" + std::to_string(options.port) +
                   " (port in use or host not local?); pick another with --port");
  }
  return s;
}

Server::Server(engine::Scheduler& scheduler, const ServerOptions& options)
    : scheduler_(scheduler),
      options_(options),
      http_(std::make_unique<HttpTransport>(options.limits, [](const TransportError& e) {
        return Dump(ApiError{e.status, e.message, e.status >= 500 ? "server_error" : "invalid_request_error", "", ""}
                        .ToJson());
      })),
      tenants_(options.api_keys) {
  created_ = static_cast<int64_t>(std::time(nullptr));
  // cpp-httplib sets SO_REUSEPORT by default, so a second server on a port in
  // use starts silently and takes half the connections (a stale build or
  // another model serving a random half). Exclusive unless asked: a port in
  // use is a bind error. SO_REUSEADDR only lets a restart rebind a port whose
  // old connections are in TIME_WAIT.
  const bool reuse_port = options_.reuse_port;
  http_->set_socket_options([reuse_port](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (reuse_port) setsockopt(sock, SOL_SOCKET, SO_REUSEPORT, &yes, sizeof(yes));
  });
}

Server::~Server() { Stop(); }

void Server::Run() { http_->listen_after_bind(); }

void Server::Track(engine::RequestId id, bool live) {
  std::lock_guard<std::mutex> lock(mu_);
  if (live) {
    live_.insert(id);
  } else {
    live_.erase(id);
  }
  idle_.notify_all();
}

HttpCounters Server::Counters() const {
  HttpCounters c;
  {
    std::lock_guard<std::mutex> lock(mu_);
    c = counters_;
  }
  const TransportStats t = http_->Stats();
  c.open_connections = t.open_connections;
  c.refused_connections = t.refused_connections;
  c.request_timeouts = t.request_timeouts;
  return c;
}

void Server::Stop() {
  std::lock_guard<std::mutex> stop_lock(stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  draining_ = true;
  {
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait_for(lock, std::chrono::duration<double>(options_.shutdown_grace_seconds),
                   [&] { return live_.empty() && open_calls_ == 0; });
    for (engine::RequestId id : live_) scheduler_.Cancel(id);
    idle_.wait_for(lock, std::chrono::seconds(10), [&] { return live_.empty() && open_calls_ == 0; });
  }
  http_->StopListening();
}

std::shared_ptr<void> Server::OpenResponse() { return std::make_shared<OpenCall>(mu_, idle_, open_calls_); }

void Server::CountDisconnect() {
  std::lock_guard<std::mutex> lock(mu_);
  counters_.client_disconnects++;
}

namespace {

// The one pattern form the routes use besides literal text: one path segment.
constexpr std::string_view kSegment = "([^/]+)";

// Whether `path` matches route `pattern` as cpp-httplib matches it. Not
// std::regex: instantiating its templates here makes Debian's uninstrumented
// cpp-httplib bind to our TSan-instrumented copies, and TSan then reports
// its thread-safe static regexes as races.
bool PathMatches(std::string_view pattern, std::string_view path) {
  size_t p = 0, q = 0;
  while (p < pattern.size()) {
    if (pattern.substr(p, kSegment.size()) == kSegment) {
      const size_t end = std::min(path.find('/', q), path.size());
      if (end == q) return false;
      p += kSegment.size();
      q = end;
    } else if (q < path.size() && path[q] == pattern[p]) {
      ++p;
      ++q;
    } else {
      return false;
    }
  }
  return q == path.size();
}

}  // namespace

void Server::Route(const std::string& method, const std::string& pattern, Handler handler) {
  std::string literal = pattern;
  for (size_t at; (at = literal.find(kSegment)) != std::string::npos;) literal.erase(at, kSegment.size());
  KVX_CHECK_MSG(literal.find_first_of("()[]{}*+?.|^$\\") == std::string::npos,
                "a route pattern beyond literal text and ([^/]+) segments");
  routes_.emplace_back(pattern, method);
  if (method == "GET") {
    http_->Get(pattern, std::move(handler));
  } else if (method == "POST") {
    http_->Post(pattern, std::move(handler));
  } else {
    KVX_CHECK_MSG(method == "DELETE", "a route with an unknown method");
    http_->Delete(pattern, std::move(handler));
  }
}

std::string Server::AllowedMethods(const std::string& path) const {
  std::string allow;
  for (const auto& [pattern, method] : routes_) {
    if (PathMatches(pattern, path)) allow += (allow.empty() ? "" : ", ") + method;
  }
  return allow;
}

void Server::Routes() {
  InstallHooks();
  InfoRoutes();
  CompletionRoutes();
  SessionRoutes();
}

// Authentication of every endpoint but /health (a load balancer's probe;
// /metrics tells pool bytes and request counts, so it is guarded too),
// OpenAI-shaped error pages, responses counted by status.
void Server::InstallHooks() {
  httplib::Server& svr = *http_;
  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (auto refused = HttpTransport::Refusal()) {  // a framing refused before its body is read
      SendError(res, ApiError{refused->status, refused->message, "invalid_request_error", "", ""});
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!tenants_.keyed() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    if (tenants_.Identify(req.get_header_value("Authorization"), "")) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e;
    e.status = 401;
    e.message = "Incorrect API key provided: send 'Authorization: Bearer <key>' with a key kvx serve was given";
    e.code = "invalid_api_key";
    SendError(res, e);
    return httplib::Server::HandlerResponse::Handled;
  });
  svr.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    const std::optional<TransportError> failed = HttpTransport::ReadFailure();  // 408, 413, 431
    if (failed) res.status = failed->status;
    if (res.status == 404) {
      // No route for this method: a path another method serves is 405.
      const std::string allow = AllowedMethods(req.path);
      if (!allow.empty()) {
        res.status = 405;
        res.set_header("Allow", allow);
      }
    }
    ApiError e;
    e.status = res.status;
    e.message = failed              ? failed->message
                : res.status == 404 ? "no such endpoint"
                : res.status == 405 ? "method not allowed"
                                     : std::string("HTTP error ") + std::to_string(res.status);
    if (res.status >= 500) e.type = "server_error";
    SendError(res, e);
    return httplib::Server::HandlerResponse::Handled;
  }));
  svr.set_logger([this](const httplib::Request&, const httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu_);
    counters_.responses_by_status[res.status]++;
  });
}

void Server::InfoRoutes() {
  Route("GET", "/health", [this](const httplib::Request&, httplib::Response& res) {
    if (draining_) {
      SendJson(res, 503, {{"status", "shutting down"}});
    } else {
      SendJson(res, 200, {{"status", "ok"}});
    }
  });
  Route("GET", "/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(RenderMetrics(scheduler_.Stats(), Counters()), "text/plain; version=0.0.4");
  });
  Route("GET", "/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const engine::Engine& engine = scheduler_.engine();
    json m = {{"id", options_.model_id},
              {"object", "model"},
              {"created", created_},
              {"owned_by", "kvx"},
              {"meta", {{"n_ctx", engine.n_ctx()}, {"n_vocab", engine.model().config().n_vocab}, {"kv", options_.kv_spec}}}};
    SendJson(res, 200, {{"object", "list"}, {"data", json::array({m})}});
  });
}

void Server::CompletionRoutes() {
  Route("POST", "/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleCompletion(/*chat=*/false, req, res);
  });
  Route("POST", "/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleCompletion(/*chat=*/true, req, res);
  });
}

// Parse (openai.h), build the request (chat template, tokenizer), answer
// (completion.h: Scheduler::Submit checks it, its rejections are API errors).
void Server::HandleCompletion(bool chat, const httplib::Request& req, httplib::Response& res) {
  if (draining_) return SendError(res, ShuttingDownError());
  ParseLimits limits;
  limits.max_n = std::min(options_.max_n, scheduler_.options().max_running);
  limits.chunk_repair = options_.chunk_repair;
  CompletionParams p;
  if (auto e = ParseCompletionRequest(req.body, chat, limits, &p)) return SendError(res, *e);
  if (p.model.empty()) p.model = options_.model_id;
  const engine::Engine& engine = scheduler_.engine();
  BuiltRequest built;
  if (auto e = BuildGenerationRequest(p, engine.model().tokenizer(), *chat_, engine.n_ctx(), &built)) {
    return SendError(res, *e);
  }
  built.request.tenant_salt = TenantOf(req, p.user).salt;
  const std::string object_id =
      (chat ? "chatcmpl-" : "cmpl-") + std::to_string(created_) + "-" + std::to_string(next_id_++);
  AnswerCompletion(*this, p, std::move(built), object_id, res);
}

Tenant Server::TenantOf(const httplib::Request& req, const std::string& user) const {
  // With keys the hook let only identified requests through.
  return tenants_.Identify(req.get_header_value("Authorization"), user).value_or(Tenant{});
}

// Named sessions and their files, each tenant's own (without keys, the
// `user` query parameter names the tenant, as `user` does in a completion).
void Server::SessionRoutes() {
  auto handler = [this](const std::string& action) {
    return [this, action](const httplib::Request& req, httplib::Response& res) {
      const std::string name = req.matches[1];
      if (!ValidSessionName(name)) {
        return SendError(res, ApiError{400, "session names are 1-64 characters of A-Z, a-z, 0-9, _ and -",
                                       "invalid_request_error", "name", ""});
      }
      if (action != "delete" && options_.session_dir.empty()) {
        return SendError(res, ApiError{501, "session files are off: start kvx serve with --session-dir DIR",
                                       "invalid_request_error", "", "sessions_disabled"});
      }
      json out = {{"session", name}};
      const Status st = SessionAction(action, TenantOf(req, req.get_param_value("user")), name, &out);
      if (!st.ok()) {
        ApiError err = FromStatus(st);
        if (st.code() == StatusCode::kInvalidArgument || st.code() == StatusCode::kUnimplemented) err.code = "invalid_session_file";
        if (st.code() == StatusCode::kIoError) err.status = 500;
        // Messages name files inside the session directory by session name only.
        size_t at = err.message.find(options_.session_dir);
        if (at != std::string::npos) err.message.replace(at, options_.session_dir.size(), "<session-dir>");
        return SendError(res, err);
      }
      out["status"] = action == "save" ? "saved" : action == "restore" ? "restored" : "deleted";
      SendJson(res, 200, out);
    };
  };
  Route("POST", R"(/v1/sessions/([^/]+)/save)", handler("save"));
  Route("POST", R"(/v1/sessions/([^/]+)/restore)", handler("restore"));
  Route("DELETE", R"(/v1/sessions/([^/]+))", handler("delete"));
  Route("GET", "/v1/sessions", [this](const httplib::Request& req, httplib::Response& res) {
    std::vector<std::string> names;
    const uint64_t salt = TenantOf(req, req.get_param_value("user")).salt;
    Status st = scheduler_.RunBetweenSteps([&](engine::Engine&) {
      names = scheduler_.SessionNames(salt);
      return Status::Ok();
    });
    if (!st.ok()) return SendError(res, FromStatus(st));
    SendJson(res, 200, {{"object", "list"}, {"data", names}});
  });
}

namespace {

// A tenant's session files are in a directory of its own (the nameless
// tenant's in --session-dir itself), named by its salt: tenant names may
// hold characters a file name should not.
std::filesystem::path SessionFilePath(const std::string& session_dir, const Tenant& tenant, const std::string& name) {
  std::filesystem::path dir(session_dir);
  if (tenant.salt != 0) {
    char sub[32];
    std::snprintf(sub, sizeof sub, "tenant-%016llx", static_cast<unsigned long long>(tenant.salt));
    dir /= sub;
  }
  return dir / (name + ".kvxs");
}

}  // namespace

Status Server::SessionAction(const std::string& action, const Tenant& tenant, const std::string& name, json* out) {
  const std::filesystem::path file = SessionFilePath(options_.session_dir, tenant, name);
  const std::string path = file.string();
  return scheduler_.RunBetweenSteps([&](engine::Engine& e) -> Status {
    if (action == "delete") return scheduler_.DropSession(tenant.salt, name);
    if (action == "save") {
      KVX_ASSIGN_OR_RETURN(kv::SeqId seq, scheduler_.SessionSequence(tenant.salt, name));
      KVX_ASSIGN_OR_RETURN(std::vector<int32_t> pending, scheduler_.SessionPendingTokens(tenant.salt, name));
      std::error_code ec;
      std::filesystem::create_directories(file.parent_path(), ec);
      if (ec) return IoError("cannot create the tenant's session directory: " + ec.message());
      KVX_RETURN_IF_ERROR(engine::SaveSessionFile(e, seq, path, {.logits = {}, .pending = pending}));
      (*out)["tokens"] = e.kv_manager().length(seq) + static_cast<int>(pending.size());
      return Status::Ok();
    }
    KVX_ASSIGN_OR_RETURN(engine::RestoredSession r, engine::LoadSessionFile(e, path));
    if (e.kv_manager().salt(r.seq) != tenant.salt) {
      // A file of another tenant's (copied here): not this tenant's to load.
      e.kv_manager().ReleaseSequence(r.seq);
      return NotFound("no session file " + path);
    }
    const int tokens = e.kv_manager().length(r.seq) + static_cast<int>(r.pending.size());
    Status adopted = scheduler_.AdoptSession(name, r.seq, tenant.salt, r.pending);
    if (!adopted.ok()) {
      e.kv_manager().ReleaseSequence(r.seq);
      return adopted;
    }
    (*out)["tokens"] = tokens;
    return Status::Ok();
  });
}

}  // namespace kvx::server
