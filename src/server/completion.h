// Answering one completion request (/v1/completions, /v1/chat/completions)
// once server/openai.h built it: submits it to the scheduler (the gate's
// rejections become API errors), then answers whole (one JSON object when
// every sample ended) or streamed (server-sent events: a chunk per piece of
// text, a ": keep-alive" comment every 100 ms while nothing comes, an error
// event if the request fails or the server shuts down, then [DONE]). Stop
// strings are cut from the text (server/text_stream.h); once every sample
// hit one, the request is cancelled. A client that leaves cancels its
// request at once: a stream's at the next write, a plain one's when its
// connection shows the client gone (ClientConnection::Gone in
// server/http_transport.h), polled every 100 ms.
//
// Thread-safety: AnswerCompletion runs on an HTTP worker thread; the
// scheduler's callbacks reach it through a mutex-guarded event queue.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/scheduler.h"
#include "server/openai.h"

namespace httplib {
struct Response;
}  // namespace httplib

namespace kvx::server {

// What a completion needs from the server that runs it.
class CompletionHost {
 public:
  virtual engine::Scheduler& scheduler() = 0;
  // A submitted request is live until its last event (the server cancels
  // live requests when it shuts down).
  virtual void Track(engine::RequestId id, bool live) = 0;
  // Held while a response is being produced (shutdown waits for them).
  virtual std::shared_ptr<void> OpenResponse() = 0;
  virtual void CountDisconnect() = 0;

 protected:
  ~CompletionHost() = default;
};

// Submits `built` and answers it on `res` as `params` asks (stream or not).
void AnswerCompletion(CompletionHost& host, const CompletionParams& params, BuiltRequest built,
                      const std::string& object_id, httplib::Response& res);

// JSON responses (invalid UTF-8 from a model replaced, never thrown on).
std::string Dump(const nlohmann::json& j);
void SendJson(httplib::Response& res, int status, const nlohmann::json& j);
void SendError(httplib::Response& res, const ApiError& e);

}  // namespace kvx::server
