#include "server/completion.h"

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <mutex>

#include "server/http_transport.h"
#include "server/text_stream.h"

namespace kvx::server {

using nlohmann::json;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void SendJson(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(Dump(j), "application/json");
}

void SendError(httplib::Response& res, const ApiError& e) {
  if (e.status == 429) res.set_header("Retry-After", "1");  // a full queue drains in about a request's time
  SendJson(res, e.status, e.ToJson());
}

namespace {

// The shared state of one request: the scheduler's callback pushes events,
// the HTTP thread consumes them.
struct Call {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<engine::RequestEvent> events;
  bool done = false;
  // HTTP thread only.
  engine::RequestId id = 0;
  CompletionParams params;
  std::string object_id;
  int64_t created = 0;
  int prompt_tokens = 0;
  std::string echo;
  struct Sample {
    std::unique_ptr<TextStream> text;
    int tokens = 0;
    bool finished = false;  // no more text for this sample
    const char* reason = nullptr;
    bool role_sent = false;  // chat streams: the first delta carries the role
  };
  std::vector<Sample> samples;
  bool cancelled_for_stops = false;
  Status failure;          // a sample's kError
  bool cancelled = false;  // cancelled by shutdown
  engine::RequestTiming timing;

  // Takes the events that arrived (waiting up to `wait`); true once done.
  bool Take(std::deque<engine::RequestEvent>* out, std::chrono::milliseconds wait) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, wait, [&] { return !events.empty() || done; });
    out->swap(events);
    return done && events.empty();
  }
  bool AllFinished() const {
    for (const auto& s : samples) {
      if (!s.finished) return false;
    }
    return true;
  }
  // Cancels the request once every sample hit a stop string.
  void CancelIfAllStopped(engine::Scheduler& scheduler) {
    if (!cancelled_for_stops && AllFinished()) {
      cancelled_for_stops = true;
      scheduler.Cancel(id);
    }
  }
  // The error a failed or cut request answers with (ok: none).
  std::optional<ApiError> Error() const {
    if (!failure.ok()) return GenerationError(failure);
    if (cancelled) return ShuttingDownError();
    return std::nullopt;
  }
};

// Applies one event to the call; returns the text it adds to its sample
// (streams send it; non-streams accumulate it).
std::string Apply(Call& c, const model::Tokenizer& tok, const engine::RequestEvent& e) {
  if (e.sample < 0 || e.sample >= static_cast<int>(c.samples.size())) return {};
  Call::Sample& s = c.samples[e.sample];
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
    case engine::FinishReason::kLength: s.reason = "length"; break;
    case engine::FinishReason::kStop: s.reason = "stop"; break;
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

json Usage(const Call& c) {
  int completion = 0;
  for (const auto& s : c.samples) completion += s.tokens;
  json details = {{"cached_tokens", c.timing.cached_tokens}};
  if (!c.timing.cached_by_tier.empty()) {  // KV tiers: where the cached tokens came from
    int from_tiers = 0;
    json by_tier = json::object();
    for (const auto& [tier, n] : c.timing.cached_by_tier) {
      by_tier[tier] = n;
      from_tiers += n;
    }
    by_tier["pool"] = c.timing.cached_tokens - from_tiers;
    details["cached_tokens_by_tier"] = by_tier;
  }
  if (c.timing.chunk_tokens > 0) {  // chunk reuse: the chunks' tokens, from the chunk cache, recomputed in context
    details["chunk_tokens"] = c.timing.chunk_tokens;
    details["chunk_cache_tokens"] = c.timing.chunk_cached_tokens;
    details["chunk_recomputed_tokens"] = c.timing.chunk_recomputed_tokens;
  }
  return json{{"prompt_tokens", c.prompt_tokens},
              {"completion_tokens", completion},
              {"total_tokens", c.prompt_tokens + completion},
              {"prompt_tokens_details", details}};
}

json Chunk(const Call& c, int index, const std::string& text, const char* reason, bool role) {
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

// Waits for every event, then answers one JSON object. A client that hangs
// up while it waits frees its sequences at once, as a stream's does: every
// 100 ms its connection is checked (one that only half-closed is still
// answered).
void AnswerWhole(CompletionHost& host, Call& call, httplib::Response& res) {
  std::shared_ptr<void> open = host.OpenResponse();
  const model::Tokenizer& tok = host.scheduler().engine().model().tokenizer();
  std::vector<std::string> texts(call.params.n, call.echo);
  bool done = false, client_gone = false;
  ClientConnection* connection = CurrentConnection();
  while (!done) {
    std::deque<engine::RequestEvent> events;
    done = call.Take(&events, std::chrono::milliseconds(100));
    for (const auto& e : events) texts[e.sample] += Apply(call, tok, e);
    call.CancelIfAllStopped(host.scheduler());
    if (done || client_gone) continue;
    if (connection != nullptr && connection->Gone()) {
      client_gone = true;
      host.scheduler().Cancel(call.id);  // then wait for it to land, as streams do
      host.CountDisconnect();
    }
  }
  host.Track(call.id, false);
  if (client_gone) {
    // Nobody reads it; 499 (nginx's "client closed request") counts it in kvx_http_responses_total.
    return SendError(res, ApiError{499, "the client closed the connection", "invalid_request_error", "", ""});
  }
  if (auto e = call.Error()) return SendError(res, *e);
  json choices = json::array();
  for (int i = 0; i < call.params.n; ++i) {
    const char* reason = call.samples[i].reason ? call.samples[i].reason : "stop";
    json c = {{"index", i}, {"logprobs", nullptr}, {"finish_reason", reason}};
    if (call.params.chat) {
      c["message"] = {{"role", "assistant"}, {"content", texts[i]}};
    } else {
      c["text"] = texts[i];
    }
    choices.push_back(c);
  }
  SendJson(res, 200,
           {{"id", call.object_id},
            {"object", call.params.chat ? "chat.completion" : "text_completion"},
            {"created", call.created},
            {"model", call.params.model},
            {"choices", choices},
            {"usage", Usage(call)}});
}

// One round of a stream: the events that arrived become chunks (a final
// chunk with its finish_reason per sample that ended); at the end, the
// error or the usage, then [DONE]. False when the client is gone.
bool StreamRound(CompletionHost& host, Call& call, httplib::DataSink& sink) {
  const model::Tokenizer& tok = host.scheduler().engine().model().tokenizer();
  auto send = [&](const json& j) {
    const std::string line = "data: " + Dump(j) + "\n\n";
    return sink.write(line.data(), line.size());
  };
  auto gone = [&] {
    host.scheduler().Cancel(call.id);
    host.CountDisconnect();
    return false;
  };
  if (!call.echo.empty()) {
    for (int i = 0; i < call.params.n; ++i) {
      if (!send(Chunk(call, i, call.echo, nullptr, false))) return gone();
    }
    call.echo.clear();
  }
  std::deque<engine::RequestEvent> events;
  const bool done = call.Take(&events, std::chrono::milliseconds(100));
  if (events.empty() && !done) {
    // Nothing yet (queued, prefilling): a comment line shows whether the client is still there.
    static const char kKeepAlive[] = ": keep-alive\n\n";
    return sink.write(kKeepAlive, sizeof kKeepAlive - 1) || gone();
  }
  for (const auto& e : events) {
    Call::Sample& s = call.samples[e.sample];
    const bool was_finished = s.finished;
    const std::string text = Apply(call, tok, e);
    const bool role = call.params.chat && !s.role_sent;
    if (!text.empty() || role) {
      s.role_sent = true;
      if (!send(Chunk(call, e.sample, text, nullptr, role))) return gone();
    }
    if (s.finished && !was_finished && !call.Error()) {
      if (!send(Chunk(call, e.sample, "", s.reason, false))) return gone();
    }
  }
  call.CancelIfAllStopped(host.scheduler());
  if (!done) return true;
  if (auto err = call.Error()) {
    send(err->ToJson());
  } else if (call.params.include_usage) {
    json u = Chunk(call, 0, "", nullptr, false);
    u["choices"] = json::array();
    u["usage"] = Usage(call);
    send(u);
  }
  static const char kDone[] = "data: [DONE]\n\n";
  sink.write(kDone, sizeof kDone - 1);
  sink.done();
  return true;
}

void AnswerStream(CompletionHost& host, std::shared_ptr<Call> call, httplib::Response& res) {
  std::shared_ptr<void> open = host.OpenResponse();
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [&host, call, open](size_t, httplib::DataSink& sink) { return StreamRound(host, *call, sink); },
      [&host, call, open](bool success) {
        if (!success) host.scheduler().Cancel(call->id);
        // Wait (briefly) for the cancellation to land so the pool is free
        // when the client's next request arrives.
        {
          std::unique_lock<std::mutex> lock(call->mu);
          call->cv.wait_for(lock, std::chrono::seconds(5), [&] { return call->done; });
        }
        host.Track(call->id, false);
      });
}

}  // namespace

void AnswerCompletion(CompletionHost& host, const CompletionParams& params, BuiltRequest built,
                      const std::string& object_id, httplib::Response& res) {
  auto call = std::make_shared<Call>();
  call->params = params;
  call->object_id = object_id;
  call->created = static_cast<int64_t>(std::time(nullptr));
  call->prompt_tokens = built.prompt_tokens;
  call->echo = std::move(built.echo);
  for (int i = 0; i < params.n; ++i) {
    call->samples.emplace_back();
    call->samples.back().text = std::make_unique<TextStream>(params.stop);
  }
  std::weak_ptr<Call> weak = call;
  engine::RequestPart rejected = engine::RequestPart::kNone;
  auto submitted = host.scheduler().Submit(
      std::move(built.request),
      [weak](const engine::RequestEvent& e) {
        auto c = weak.lock();
        if (!c) return;
        std::lock_guard<std::mutex> lock(c->mu);
        c->events.push_back(e);
        if (e.done) c->done = true;
        c->cv.notify_all();
      },
      &rejected);
  if (!submitted.ok()) return SendError(res, SubmitError(submitted.status(), rejected, params.chat));
  call->id = *submitted;
  host.Track(call->id, true);
  if (params.stream) return AnswerStream(host, std::move(call), res);
  AnswerWhole(host, *call, res);
}

}  // namespace kvx::server
