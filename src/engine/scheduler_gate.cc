// The gate: every check a request passes before it is queued (Submit), and
// the checks of a resumed session, made again at admission against the
// session as it is then. Callers (the server, kvx batch) check nothing of
// their own; an API maps the status and the RequestPart to its error codes.
#include <string>

#include "engine/scheduler.h"
#include "engine/scheduler_request.h"

namespace kvx::engine {
namespace {

Status NoSession(const std::string& name) { return NotFound("no session named '" + name + "'"); }

// `what` has `tokens` tokens; a context of n_ctx holds them and one answer
// token only if tokens < n_ctx. The wording is OpenAI's (clients parse it).
Status ContextExceeded(const std::string& what, int64_t tokens, int n_ctx) {
  return InvalidArgument("This model's maximum context length is " + std::to_string(n_ctx) + " tokens, but " +
                         what + " " + std::to_string(tokens) +
                         " tokens (the answer needs at least one more); shorten the prompt");
}

}  // namespace

Result<RequestId> Scheduler::Submit(GenerationRequest request, EventCallback on_event, RequestPart* rejected) {
  RequestPart part = RequestPart::kNone;
  auto reject = [&](Status st) {
    if (rejected != nullptr) *rejected = part;
    return st;
  };
  if (Status st = CheckRequest(request, &part); !st.ok()) return reject(st);
  part = RequestPart::kNone;
  if (!on_event) return reject(InvalidArgument("a request needs an event callback"));
  auto r = std::make_unique<Request>();
  r->on_event = std::move(on_event);
  r->submit_time = Now();
  r->samples.resize(static_cast<size_t>(request.n));
  for (int i = 0; i < request.n; ++i) {
    r->samples[i].index = i;
    r->samples[i].forked = i == 0;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return reject(InvalidArgument("the scheduler is shutting down; no new requests"));
  if (Status st = ResolveSession(request, &part); !st.ok()) return reject(st);
  part = RequestPart::kNone;
  if (static_cast<int>(live_.size()) >= options_.max_queue) {
    return reject(ResourceExhausted("too many requests in flight (" + std::to_string(live_.size()) + "); retry later"));
  }
  r->req = std::move(request);
  r->id = next_id_++;
  const RequestId id = r->id;
  live_[id] = true;
  inbox_.push_back(std::move(r));
  wake_.notify_one();
  return id;
}

Result<CacheMode> ParseCacheMode(std::string_view text) {
  if (text == "default") return CacheMode::kDefault;
  if (text == "none") return CacheMode::kNone;
  if (text == "pin") return CacheMode::kPin;
  if (text == "unpin") return CacheMode::kUnpin;
  return InvalidArgument("\"cache\" must be \"default\" (read and write cached KV), \"none\" (neither), \"pin\" "
                         "(keep the prompt's blocks in the host-RAM tier) or \"unpin\"");
}

// A pin holds the prompt's full blocks in the host-RAM tier: there must be
// one, large enough, and a prompt that is the whole text (no session).
Status Scheduler::CheckPin(const GenerationRequest& r) const {
  const uint64_t capacity = tiers_ ? tiers_->pin_capacity() : 0;
  if (capacity == 0) {
    return InvalidArgument("\"cache\": \"pin\" and \"unpin\" keep blocks in the host-RAM KV tier, and there is "
                           "none: start with --cache-ram-bytes SIZE");
  }
  if (!r.resume_session.empty() || !r.continue_session.empty()) {
    return InvalidArgument("\"cache\": \"pin\" and \"unpin\" take a prompt without a session");
  }
  const int64_t B = tiers_->block_tokens(), blocks = static_cast<int64_t>(r.prompt.size()) / B;
  const uint64_t need = KvBytesFor(blocks * B);  // the blocks' pages (a block adds its header and tokens)
  if (r.cache == CacheMode::kPin && need > capacity) {
    return InvalidArgument("the pin needs " + std::to_string(blocks) + " blocks (" + std::to_string(need) +
                           " bytes) in the host-RAM tier, which holds " + std::to_string(capacity) +
                           " bytes: raise --cache-ram-bytes or pin a shorter prompt");
  }
  return Status::Ok();
}

Status Scheduler::CheckRequest(const GenerationRequest& r, RequestPart* part) const {
  *part = RequestPart::kCache;
  if (r.cache == CacheMode::kPin || r.cache == CacheMode::kUnpin) KVX_RETURN_IF_ERROR(CheckPin(r));
  *part = RequestPart::kPrompt;
  if (r.prompt.empty() && r.resume_session.empty() && r.continue_session.empty()) {
    return InvalidArgument("the prompt is empty: give at least one token (or continue a session)");
  }
  for (int32_t t : r.prompt) {
    if (t < 0 || t >= n_vocab_) {
      return InvalidArgument("prompt token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                             std::to_string(n_vocab_) + ")");
    }
  }
  *part = RequestPart::kContext;
  const int64_t prompt = static_cast<int64_t>(r.prompt.size());
  if (prompt >= engine_.n_ctx()) return ContextExceeded("the prompt has", prompt, engine_.n_ctx());
  if (r.compress_at < 0 || r.compress_at > prompt) {
    return InvalidArgument("compress_at (" + std::to_string(r.compress_at) + ") must be in [0, " +
                           std::to_string(prompt) + "]: a number of prompt tokens, 0 for the whole prompt");
  }
  *part = RequestPart::kKvBudget;
  KVX_RETURN_IF_ERROR(CheckPoolHolds("the prompt", prompt));
  *part = RequestPart::kMaxTokens;
  if (r.max_tokens < 1) return InvalidArgument("max_tokens must be at least 1");
  *part = RequestPart::kSampling;
  KVX_RETURN_IF_ERROR(r.sampling.Validate());
  *part = RequestPart::kSamples;
  if (r.n < 1 || r.n > options_.max_running) {
    return InvalidArgument("n (samples) must be in [1, " + std::to_string(options_.max_running) + "], got " +
                           std::to_string(r.n));
  }
  *part = RequestPart::kSession;
  if (!r.continue_session.empty() && !r.resume_session.empty() && r.continue_session != r.resume_session) {
    return InvalidArgument("continue_session and resume_session name different sessions");
  }
  if (r.chunks != nullptr) KVX_RETURN_IF_ERROR(CheckChunks(r, part));
  *part = RequestPart::kNone;
  return Status::Ok();
}

Status Scheduler::ResolveSession(GenerationRequest& r, RequestPart* part) const {
  *part = RequestPart::kSession;
  if (!r.continue_session.empty()) {
    r.save_session = r.continue_session;
    if (session_index_.count({r.tenant_salt, r.continue_session}) != 0) {
      r.resume_session = r.continue_session;
    } else if (r.prompt.empty()) {
      return NoSession(r.continue_session);
    }
  }
  if (r.resume_session.empty()) return Status::Ok();
  auto it = session_index_.find({r.tenant_salt, r.resume_session});
  if (it == session_index_.end()) return NoSession(r.resume_session);
  const int32_t bos = engine_.model().tokenizer().bos();
  if (r.drop_bos_when_resuming && bos >= 0 && !r.prompt.empty() && r.prompt[0] == bos) r.prompt.erase(r.prompt.begin());
  return CheckResume(r, it->second, part);
}

Status Scheduler::CheckResume(const GenerationRequest& r, const SessionSummary& s, RequestPart* part) const {
  *part = RequestPart::kSession;
  if (!s.has_pending && r.prompt.empty()) {
    return InvalidArgument("nothing to continue: session '" + r.resume_session +
                           "' has no pending tokens and the prompt is empty");
  }
  *part = RequestPart::kContext;
  const int64_t tokens = s.tokens + static_cast<int64_t>(r.prompt.size());
  if (tokens >= engine_.n_ctx()) return ContextExceeded("the session and the prompt hold", tokens, engine_.n_ctx());
  *part = RequestPart::kKvBudget;
  KVX_RETURN_IF_ERROR(CheckPoolHolds("the session and the prompt", tokens));
  *part = RequestPart::kNone;
  return Status::Ok();
}

// Admission gives a request the KV of its tokens (plus the first answer's)
// at once, in pages nobody else holds or could free: more than the whole
// pool is never admitted, whatever else runs, so it is refused now rather
// than failing when it reaches the head of the queue.
Status Scheduler::CheckPoolHolds(const std::string& what, int64_t tokens) const {
  const uint64_t need = KvBytesFor(tokens + 1), budget = engine_.kv_manager().pool().budget_bytes();
  if (need <= budget) return Status::Ok();
  return InvalidArgument(what + " (" + std::to_string(tokens) + " tokens) needs " + std::to_string(need) +
                         " bytes of KV, more than the whole KV pool holds (budget " + std::to_string(budget) +
                         " bytes); shorten it or raise budget= in --kv");
}

Scheduler::SessionSummary Scheduler::Summary(const SessionEntry& e) const {
  const int64_t in_kv = e.swapped ? static_cast<int64_t>(e.swapped->image.tokens.size()) : engine_.kv_manager().length(e.seq);
  return {in_kv + static_cast<int64_t>(e.pending.size()), !e.pending.empty()};
}

void Scheduler::IndexSessions() {
  std::map<SessionKey, SessionSummary> index;
  for (const auto& [key, e] : sessions_) index[key] = Summary(e);
  std::lock_guard<std::mutex> lock(mu_);
  session_index_.swap(index);
}

// Admission's side of the gate: the session as it is now (it may have been
// dropped or replaced since Submit).
Status Scheduler::CheckResumeAtAdmission(const GenerationRequest& r, const SessionEntry** session) const {
  auto it = sessions_.find({r.tenant_salt, r.resume_session});
  if (it == sessions_.end()) return NoSession(r.resume_session);
  RequestPart part;
  KVX_RETURN_IF_ERROR(CheckResume(r, Summary(it->second), &part));
  *session = &it->second;
  return Status::Ok();
}

}  // namespace kvx::engine
