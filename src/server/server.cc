#include "server/server.h"

#include <httplib.h>

#include <chrono>
#include <ctime>
#include <deque>
#include <filesystem>
#include <random>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "engine/session_file.h"
#include "server/client_socket.h"
#include "server/openai.h"
#include "server/text_stream.h"

namespace kvx::server {

using nlohmann::json;

namespace {

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void SendJson(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(Dump(j), "application/json");
}

void SendError(httplib::Response& res, const ApiError& e) { SendJson(res, e.status, e.ToJson()); }

ApiError FromStatus(const Status& s, const std::string& param = "") {
  ApiError e;
  e.message = s.message();
  e.param = param;
  switch (s.code()) {
    case StatusCode::kInvalidArgument: e.status = 400; break;
    case StatusCode::kNotFound: e.status = 404; e.code = "not_found"; break;
    case StatusCode::kDataLoss: e.status = 400; e.code = "invalid_session_file"; break;
    case StatusCode::kUnimplemented: e.status = 400; e.code = "unsupported"; break;
    case StatusCode::kResourceExhausted: e.status = 429; e.type = "rate_limit_error"; break;
    default: e.status = 500; e.type = "server_error"; break;
  }
  return e;
}

const char* FinishName(engine::FinishReason r) {
  return r == engine::FinishReason::kStop ? "stop" : "length";
}

}  // namespace

// The shared state of one request: the scheduler's callback pushes events,
// the HTTP thread consumes them.
struct Server::Call {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<engine::RequestEvent> events;
  bool done = false;
  engine::RequestId id = 0;
  // HTTP thread only.
  CompletionParams params;
  std::string object_id;
  int64_t created = 0;
  int prompt_tokens = 0;
  std::string echo;
  struct Sample {
    std::unique_ptr<TextStream> text;
    int tokens = 0;
    bool finished = false;       // no more text for this sample
    const char* reason = nullptr;
    bool role_sent = false;      // chat streams: the first delta carries the role
  };
  std::vector<Sample> samples;
  bool cancelled_for_stops = false;
  Status failure;              // a sample's kError
  bool cancelled = false;      // cancelled by shutdown
  engine::RequestTiming timing;
};

Result<std::unique_ptr<Server>> Server::Create(engine::Scheduler& scheduler, const ServerOptions& options) {
  std::unique_ptr<Server> s(new Server(scheduler, options));
  const engine::Engine& e = scheduler.engine();
  const model::Tokenizer& tok = e.model().tokenizer();
  KVX_ASSIGN_OR_RETURN(std::string source, e.model().file().GetStringOr("tokenizer.chat_template", ""));
  // A template that cannot be parsed, or passes the sandbox's limits on one
  // message, fails the start (serving ChatML instead would be silently wrong).
  KVX_ASSIGN_OR_RETURN(ChatTemplate chat, ChatTemplate::Create(source, tok));
  s->chat_ = std::make_unique<ChatTemplate>(std::move(chat));
  s->Routes();
  if (options.port == 0) {
    s->port_ = s->http_->bind_to_any_port(options.host);
    if (s->port_ < 0) return IoError("cannot bind to " + options.host + " (any port)");
  } else {
    if (!s->http_->bind_to_port(options.host, options.port)) {
      return IoError("cannot listen on " + options.host + ":" + std::to_string(options.port) +
                     " (port in use or host not local?); pick another with --port");
    }
    s->port_ = options.port;
  }
  return s;
}

Server::Server(engine::Scheduler& scheduler, const ServerOptions& options)
    : scheduler_(scheduler), options_(options), http_(std::make_unique<httplib::Server>()) {
  created_ = static_cast<int64_t>(std::time(nullptr));
  const int threads =
      options_.http_threads > 0 ? options_.http_threads : 2 * scheduler_.options().max_running + 16;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http_->set_payload_max_length(options_.max_body_bytes);
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
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
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
  http_->stop();
}

namespace {

// Per-handler bookkeeping: counts an open call while a response is produced.
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

// Applies one event to the call; returns the text it adds to its sample
// (streams send it; non-streams accumulate it).
std::string Apply(Server::Call& c, const model::Tokenizer& tok, const engine::RequestEvent& e) {
  if (e.sample < 0 || e.sample >= static_cast<int>(c.samples.size())) return {};
  Server::Call::Sample& s = c.samples[e.sample];
  if (e.kind == engine::RequestEvent::Kind::kToken) {
    if (s.finished) return {};
    ++s.tokens;
    std::string out = s.text->Add(tok.TokenToPiece(e.token, /*special=*/false));
    if (s.text->stopped()) {
      s.finished = true;
      s.reason = "stop";
    }
    return out;
  }
  if (e.done) c.timing = e.timing;
  if (s.finished) return {};
  s.finished = true;
  std::string out = s.text->Flush();
  switch (e.reason) {
    case engine::FinishReason::kLength:
    case engine::FinishReason::kStop: s.reason = FinishName(e.reason); break;
    case engine::FinishReason::kCancelled:
      s.reason = "stop";
      if (!c.cancelled_for_stops) c.cancelled = true;
      break;
    case engine::FinishReason::kError:
      s.reason = "stop";
      c.failure = e.status.ok() ? Internal("generation failed") : e.status;
      break;
  }
  return out;
}

bool AllFinished(const Server::Call& c) {
  for (const auto& s : c.samples) {
    if (!s.finished) return false;
  }
  return true;
}

json Usage(const Server::Call& c) {
  int completion = 0;
  for (const auto& s : c.samples) completion += s.tokens;
  return json{{"prompt_tokens", c.prompt_tokens},
              {"completion_tokens", completion},
              {"total_tokens", c.prompt_tokens + completion},
              {"prompt_tokens_details", {{"cached_tokens", c.timing.cached_tokens}}}};
}

json Chunk(const Server::Call& c, int index, const std::string& text, const char* reason, bool role) {
  json choice;
  choice["index"] = index;
  if (c.params.chat) {
    json delta = json::object();
    if (role) delta["role"] = "assistant";
    if (!text.empty() || role) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = reason == nullptr ? json(nullptr) : json(reason);
  return json{{"id", c.object_id},
              {"object", c.params.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", c.created},
              {"model", c.params.model},
              {"choices", json::array({choice})}};
}

}  // namespace

void Server::Routes() {
  httplib::Server& svr = *http_;

  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (options_.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") == "Bearer " + options_.api_key) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    ApiError e;
    e.status = 401;
    e.message = "Incorrect API key provided: send 'Authorization: Bearer <key>' with the key kvx serve was given";
    e.code = "invalid_api_key";
    SendError(res, e);
    return httplib::Server::HandlerResponse::Handled;
  });
  svr.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e;
    e.status = res.status;
    e.message = res.status == 404 ? "no such endpoint"
                : res.status == 413 ? "the request body is too large"
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

  svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (draining_) {
      SendJson(res, 503, {{"status", "shutting down"}});
    } else {
      SendJson(res, 200, {{"status", "ok"}});
    }
  });
  svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(RenderMetrics(scheduler_.Stats(), Counters()), "text/plain; version=0.0.4");
  });
  svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const engine::Engine& engine = scheduler_.engine();
    json m = {{"id", options_.model_id},
              {"object", "model"},
              {"created", created_},
              {"owned_by", "kvx"},
              {"meta", {{"n_ctx", engine.n_ctx()}, {"n_vocab", engine.model().config().n_vocab}, {"kv", options_.kv_spec}}}};
    SendJson(res, 200, {{"object", "list"}, {"data", json::array({m})}});
  });

  auto completion = [this](bool chat) {
    return [this, chat](const httplib::Request& req, httplib::Response& res) {
      const engine::Engine& engine = scheduler_.engine();
      const model::Tokenizer& tok = engine.model().tokenizer();
      if (draining_) return SendError(res, ApiError{503, "the server is shutting down", "server_error", "", ""});
      auto call = std::make_shared<Call>();
      ParseLimits limits;
      limits.max_n = std::min(options_.max_n, scheduler_.options().max_running);
      if (auto e = ParseCompletionRequest(req.body, chat, limits, &call->params)) return SendError(res, *e);
      CompletionParams& p = call->params;
      if (p.model.empty()) p.model = options_.model_id;

      // Prompt tokens.
      std::vector<int32_t> prompt;
      if (chat) {
        auto text = chat_->Render(p.messages, /*add_generation_prompt=*/true);
        if (!text.ok()) return SendError(res, FromStatus(text.status(), "messages"));
        const bool has_bos = !chat_->bos_text().empty() && text->rfind(chat_->bos_text(), 0) == 0;
        auto ids = tok.Encode(*text, /*add_special=*/!has_bos, /*parse_special=*/true);
        if (!ids.ok()) return SendError(res, FromStatus(ids.status(), "messages"));
        prompt = std::move(ids).value();
      } else if (p.prompt_tokens) {
        prompt = *p.prompt_tokens;
        for (int32_t t : prompt) {
          if (t >= engine.model().config().n_vocab) {
            return SendError(res, ApiError{400, "prompt token " + std::to_string(t) + " is outside the vocabulary of " +
                                                    std::to_string(engine.model().config().n_vocab),
                                           "invalid_request_error", "prompt", ""});
          }
        }
      } else {
        auto ids = tok.Encode(p.prompt, /*add_special=*/true, /*parse_special=*/true);
        if (!ids.ok()) return SendError(res, FromStatus(ids.status(), "prompt"));
        prompt = std::move(ids).value();
        if (p.echo) call->echo = p.prompt;
      }
      const int n_ctx = engine.n_ctx();
      if (prompt.empty() && p.session.empty()) {
        return SendError(res, ApiError{400, "the prompt is empty", "invalid_request_error", chat ? "messages" : "prompt", ""});
      }
      if (static_cast<int>(prompt.size()) >= n_ctx) {
        return SendError(res, ApiError{400,
                                       "This model's maximum context length is " + std::to_string(n_ctx) +
                                           " tokens, but the prompt has " + std::to_string(prompt.size()) +
                                           " tokens (the answer needs at least one more); shorten the prompt",
                                       "invalid_request_error", chat ? "messages" : "prompt",
                                       "context_length_exceeded"});
      }
      call->prompt_tokens = static_cast<int>(prompt.size());

      engine::GenerationRequest g;
      g.prompt = std::move(prompt);
      const int room = n_ctx - call->prompt_tokens;
      g.max_tokens = std::min(room, p.max_tokens.value_or(chat ? room : 16));
      g.sampling.temperature = p.temperature;
      g.sampling.top_p = p.top_p;
      g.sampling.top_k = p.top_k;
      g.sampling.min_p = p.min_p;
      g.sampling.repeat_penalty = p.repeat_penalty;
      g.sampling.seed = p.seed ? *p.seed : std::random_device{}();
      g.n = p.n;
      g.stop_at_eog = !p.ignore_eos;
      if (chat) g.stop_tokens = chat_->stop_tokens();
      if (!p.user.empty()) g.tenant_salt = XXH3_64bits(p.user.data(), p.user.size()) | 1;
      if (!p.session.empty()) {
        // Continue the named session when it exists; keep the result under its name.
        bool exists = false;
        Status st = scheduler_.RunBetweenSteps([&](engine::Engine&) {
          exists = scheduler_.SessionSequence(p.session).ok();
          return Status::Ok();
        });
        if (!st.ok()) return SendError(res, FromStatus(st));
        if (exists) {
          g.resume_session = p.session;
          // The text continues the session: no second BOS.
          if (!chat && !p.prompt_tokens && !g.prompt.empty() && g.prompt[0] == tok.bos() && tok.bos() >= 0) {
            g.prompt.erase(g.prompt.begin());
          }
        }
        g.save_session = p.session;
        if (!exists && g.prompt.empty()) {
          return SendError(res, ApiError{404, "no session '" + p.session + "'", "invalid_request_error", "session", "not_found"});
        }
      }
      for (int i = 0; i < p.n; ++i) {
        call->samples.emplace_back();
        call->samples.back().text = std::make_unique<TextStream>(p.stop);
      }
      call->object_id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(created_) + "-" + std::to_string(next_id_++);
      call->created = static_cast<int64_t>(std::time(nullptr));

      std::weak_ptr<Call> weak = call;
      auto submitted = scheduler_.Submit(std::move(g), [weak](const engine::RequestEvent& e) {
        auto c = weak.lock();
        if (!c) return;
        std::lock_guard<std::mutex> lock(c->mu);
        c->events.push_back(e);
        if (e.done) c->done = true;
        c->cv.notify_all();
      });
      if (!submitted.ok()) return SendError(res, FromStatus(submitted.status(), chat ? "messages" : "prompt"));
      call->id = *submitted;
      Track(call->id, true);

      // Takes the events that arrived (waiting up to `wait`); true once done.
      auto take = [call](std::deque<engine::RequestEvent>* out, std::chrono::milliseconds wait) {
        std::unique_lock<std::mutex> lock(call->mu);
        call->cv.wait_for(lock, wait, [&] { return !call->events.empty() || call->done; });
        out->swap(call->events);
        return call->done && call->events.empty();
      };
      // Cancels the request once every sample hit a stop string.
      auto maybe_cancel = [this, call] {
        if (!call->cancelled_for_stops && AllFinished(*call)) {
          call->cancelled_for_stops = true;
          scheduler_.Cancel(call->id);
        }
      };

      if (!p.stream) {
        OpenCall open(mu_, idle_, open_calls_);
        std::vector<std::string> texts(p.n, call->echo);
        bool done = false, client_gone = false;
        // A client that hangs up while it waits frees its sequences at once,
        // as a stream's does: every 100 ms the connection's socket is
        // checked (found once the request has waited that long).
        int fd = -1;
        bool looked_up = false;
        while (!done) {
          std::deque<engine::RequestEvent> events;
          done = take(&events, std::chrono::milliseconds(100));
          for (const auto& e : events) texts[e.sample] += Apply(*call, tok, e);
          maybe_cancel();
          if (done || client_gone) continue;
          if (!looked_up) {
            looked_up = true;
            fd = FindConnectionSocket(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
          }
          if (fd >= 0 && PeerClosed(fd)) {
            client_gone = true;
            scheduler_.Cancel(call->id);  // then wait for it to land, as streams do
            std::lock_guard<std::mutex> lock(mu_);
            counters_.client_disconnects++;
          }
        }
        Track(call->id, false);
        if (client_gone) {
          // Nobody reads it; 499 (nginx's "client closed request") counts it in kvx_http_responses_total.
          return SendError(res, ApiError{499, "the client closed the connection", "invalid_request_error", "", ""});
        }
        if (!call->failure.ok()) return SendError(res, FromStatus(call->failure));
        if (call->cancelled) return SendError(res, ApiError{503, "the server is shutting down", "server_error", "", ""});
        json choices = json::array();
        for (int i = 0; i < p.n; ++i) {
          json c = {{"index", i}, {"logprobs", nullptr}, {"finish_reason", call->samples[i].reason ? call->samples[i].reason : "stop"}};
          if (chat) {
            c["message"] = {{"role", "assistant"}, {"content", texts[i]}};
          } else {
            c["text"] = texts[i];
          }
          choices.push_back(c);
        }
        SendJson(res, 200,
                 {{"id", call->object_id},
                  {"object", chat ? "chat.completion" : "text_completion"},
                  {"created", call->created},
                  {"model", p.model},
                  {"choices", choices},
                  {"usage", Usage(*call)}});
        return;
      }

      // Streaming: server-sent events, one chunk per piece of text.
      auto open = std::make_shared<OpenCall>(mu_, idle_, open_calls_);
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream",
          [this, call, take, maybe_cancel, open](size_t, httplib::DataSink& sink) {
            const model::Tokenizer& tok = scheduler_.engine().model().tokenizer();
            auto send = [&](const json& j) {
              const std::string line = "data: " + Dump(j) + "\n\n";
              return sink.write(line.data(), line.size());
            };
            auto gone = [&] {
              scheduler_.Cancel(call->id);
              std::lock_guard<std::mutex> lock(mu_);
              counters_.client_disconnects++;
              return false;
            };
            if (!call->echo.empty()) {
              for (int i = 0; i < call->params.n; ++i) {
                if (!send(Chunk(*call, i, call->echo, nullptr, false))) return gone();
              }
              call->echo.clear();
            }
            std::deque<engine::RequestEvent> events;
            const bool done = take(&events, std::chrono::milliseconds(100));
            if (events.empty() && !done) {
              // Nothing yet (queued, prefilling): a comment line shows whether the client is still there.
              static const char kKeepAlive[] = ": keep-alive\n\n";
              if (!sink.write(kKeepAlive, sizeof kKeepAlive - 1)) return gone();
              return true;
            }
            for (const auto& e : events) {
              Call::Sample& s = call->samples[e.sample];
              const bool was_finished = s.finished;
              const std::string text = Apply(*call, tok, e);
              const bool role = call->params.chat && !s.role_sent;
              if (!text.empty() || role) {
                s.role_sent = true;
                if (!send(Chunk(*call, e.sample, text, nullptr, role))) return gone();
              }
              if (s.finished && !was_finished && call->failure.ok() && !call->cancelled) {
                if (!send(Chunk(*call, e.sample, "", s.reason, false))) return gone();
              }
            }
            maybe_cancel();
            if (!done) return true;
            if (!call->failure.ok() || call->cancelled) {
              const ApiError err = call->cancelled ? ApiError{503, "the server is shutting down", "server_error", "", ""}
                                                   : FromStatus(call->failure);
              send(err.ToJson());
            } else if (call->params.include_usage) {
              json u = Chunk(*call, 0, "", nullptr, false);
              u["choices"] = json::array();
              u["usage"] = Usage(*call);
              send(u);
            }
            static const char kDone[] = "data: [DONE]\n\n";
            sink.write(kDone, sizeof kDone - 1);
            sink.done();
            return true;
          },
          [this, call, open](bool success) {
            if (!success) scheduler_.Cancel(call->id);
            // Wait (briefly) for the cancellation to land so the pool is free
            // when the client's next request arrives.
            {
              std::unique_lock<std::mutex> lock(call->mu);
              call->cv.wait_for(lock, std::chrono::seconds(5), [&] { return call->done; });
            }
            Track(call->id, false);
          });
    };
  };
  svr.Post("/v1/completions", completion(false));
  svr.Post("/v1/chat/completions", completion(true));

  // Named sessions and their files.
  auto session_path = [this](const std::string& name) {
    return (std::filesystem::path(options_.session_dir) / (name + ".kvxs")).string();
  };
  auto session_handler = [this, session_path](const std::string& action) {
    return [this, session_path, action](const httplib::Request& req, httplib::Response& res) {
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
      Status st = scheduler_.RunBetweenSteps([&](engine::Engine& e) -> Status {
        if (action == "delete") return scheduler_.DropSession(name);
        if (action == "save") {
          KVX_ASSIGN_OR_RETURN(kv::SeqId seq, scheduler_.SessionSequence(name));
          KVX_ASSIGN_OR_RETURN(std::vector<int32_t> pending, scheduler_.SessionPendingTokens(name));
          KVX_RETURN_IF_ERROR(engine::SaveSessionFile(e, seq, session_path(name), {.logits = {}, .pending = pending}));
          out["tokens"] = e.kv_manager().length(seq) + static_cast<int>(pending.size());
          return Status::Ok();
        }
        KVX_ASSIGN_OR_RETURN(engine::RestoredSession r, engine::LoadSessionFile(e, session_path(name)));
        const int tokens = e.kv_manager().length(r.seq) + static_cast<int>(r.pending.size());
        Status adopted = scheduler_.AdoptSession(name, r.seq, e.kv_manager().salt(r.seq), r.pending);
        if (!adopted.ok()) {
          e.kv_manager().ReleaseSequence(r.seq);
          return adopted;
        }
        out["tokens"] = tokens;
        return Status::Ok();
      });
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
  svr.Post(R"(/v1/sessions/([^/]+)/save)", session_handler("save"));
  svr.Post(R"(/v1/sessions/([^/]+)/restore)", session_handler("restore"));
  svr.Delete(R"(/v1/sessions/([^/]+))", session_handler("delete"));
  svr.Get("/v1/sessions", [this](const httplib::Request&, httplib::Response& res) {
    std::vector<std::string> names;
    Status st = scheduler_.RunBetweenSteps([&](engine::Engine&) {
      names = scheduler_.SessionNames();
      return Status::Ok();
    });
    if (!st.ok()) return SendError(res, FromStatus(st));
    SendJson(res, 200, {{"object", "list"}, {"data", names}});
  });
}

}  // namespace kvx::server
