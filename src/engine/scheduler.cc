#include "engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <set>

#include "engine/session.h"
#include "kv/radix_cache.h"
#include "kv/sequence_kv.h"
#include "util/check.h"

namespace kvx::engine {

// One sample of a request: its own sequence once it runs, its sampler and
// what it generated. The sample's full token list is request.base +
// generated; the KV holds all of it but `pending` (its suffix not fed yet:
// the prompt's rest during prefill, the last sampled token when decoding,
// everything after a preemption).
struct Scheduler::Sample {
  int index = 0;
  std::unique_ptr<Session> session;  // null: not running
  kv::RadixCache::NodeId locked = kv::RadixCache::kNoNode;
  std::unique_ptr<model::Sampler> sampler;
  std::vector<int32_t> generated;
  std::vector<int32_t> pending;
  std::vector<float> logits;
  bool finished = false;
  // Samples 1..n-1 start as copy-on-write forks of sample 0 once its
  // prompt is done; until then they have no history of their own.
  bool forked = false;
  double last_token_time = 0;
  // In-flight prefix sharing: full blocks of its KV known to be in the
  // prefix cache (its path locked by `locked` while it runs).
  int published_blocks = 0;
};

struct Scheduler::Request {
  RequestId id = 0;
  GenerationRequest req;
  EventCallback on_event;
  std::vector<int32_t> base;  // session tokens + session pending + prompt (set at first admission)
  bool started = false;       // admitted at least once
  bool waited_for_prefix = false;  // counted in prefix_waits
  std::vector<Sample> samples;
  int finished = 0;
  double submit_time = 0;
  RequestTiming timing;
  std::vector<int32_t> Full(const Sample& s) const {
    std::vector<int32_t> t = base;
    t.insert(t.end(), s.generated.begin(), s.generated.end());
    return t;
  }
};

struct Scheduler::Task {
  std::function<Status(Engine&)> fn;
  std::promise<Status> done;
};

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength: return "length";
    case FinishReason::kStop: return "stop";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "?";
}

Histogram Histogram::Latency() {
  Histogram h;
  h.bounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  h.counts.assign(h.bounds.size() + 1, 0);
  return h;
}

void Histogram::Add(double value) {
  const size_t i = std::lower_bound(bounds.begin(), bounds.end(), value) - bounds.begin();
  counts[i]++;
  sum += value;
  count++;
}

double Histogram::Quantile(double q) const {
  if (count == 0) return 0;
  const double want = q * static_cast<double>(count);
  double seen = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    seen += static_cast<double>(counts[i]);
    if (seen >= want && counts[i] > 0) return i < bounds.size() ? bounds[i] : bounds.back();
  }
  return bounds.back();
}

// ---------------------------------------------------------------------------
// Construction, the public thread-safe calls.

Result<std::unique_ptr<Scheduler>> Scheduler::Create(Engine& engine, SchedulerOptions options) {
  if (options.max_step_tokens < 1) return InvalidArgument("max_step_tokens must be at least 1");
  if (options.max_running < 1) return InvalidArgument("max_running must be at least 1");
  if (options.max_running > options.max_step_tokens) {
    return InvalidArgument("max_running (" + std::to_string(options.max_running) +
                           ") must not exceed max_step_tokens (" + std::to_string(options.max_step_tokens) +
                           "): every running sequence decodes a token per step");
  }
  if (options.max_queue < 1) return InvalidArgument("max_queue must be at least 1");
  if (options.max_sessions < 0) return InvalidArgument("max_sessions must be >= 0");
  if (!options.clock) {
    options.clock = [] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    };
  }
  std::unique_ptr<Scheduler> s(new Scheduler(engine, std::move(options)));
  s->thread_ = std::thread([p = s.get()] { p->Loop(); });
  return s;
}

Scheduler::Scheduler(Engine& engine, SchedulerOptions options) : engine_(engine), options_(std::move(options)) {
  n_vocab_ = engine_.model().config().n_vocab;
  const kv::ResolvedKVSpec& spec = engine_.kv_manager().spec();
  page_tokens_ = spec.layout.page_tokens;
  block_bytes_ = KvBytesFor(page_tokens_);
  compress_once_ = engine_.kv_manager().HasOncePolicy();
  if (options_.prefix_cache) cache_ = std::make_unique<kv::RadixCache>(&engine_.kv_manager());
  start_time_ = Now();
  work_.pool_budget_bytes = engine_.pool().budget_bytes();
  stats_ = work_;
}

Scheduler::~Scheduler() {
  Shutdown(ShutdownMode::kCancel);
  // Sequences before the cache's holders, sessions, then the cache.
  queue_.clear();
  running_.clear();
  for (auto& [name, e] : sessions_) engine_.kv_manager().ReleaseSequence(e.seq);
  sessions_.clear();
  cache_.reset();
}

uint64_t Scheduler::KvBytesFor(int64_t tokens) const {
  const kv::ResolvedKVSpec& spec = engine_.kv_manager().spec();
  return tokens <= 0 ? 0 : kv::BytesForContext(spec.layout, spec.spec.codec, tokens);
}

Result<RequestId> Scheduler::Submit(GenerationRequest request, EventCallback on_event) {
  if (request.prompt.empty() && request.resume_session.empty()) {
    return InvalidArgument("the prompt is empty: give at least one token (or resume a session)");
  }
  for (int32_t t : request.prompt) {
    if (t < 0 || t >= n_vocab_) {
      return InvalidArgument("prompt token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                             std::to_string(n_vocab_) + ")");
    }
  }
  if (request.max_tokens < 1) return InvalidArgument("max_tokens must be at least 1");
  KVX_RETURN_IF_ERROR(request.sampling.Validate());
  if (request.n < 1 || request.n > options_.max_running) {
    return InvalidArgument("n (samples) must be in [1, " + std::to_string(options_.max_running) + "], got " +
                           std::to_string(request.n));
  }
  if (static_cast<int64_t>(request.prompt.size()) > engine_.n_ctx()) {
    return InvalidArgument("the prompt has " + std::to_string(request.prompt.size()) +
                           " tokens, more than the context length " + std::to_string(engine_.n_ctx()) +
                           "; shorten it or raise the context length");
  }
  if (!on_event) return InvalidArgument("a request needs an event callback");
  auto r = std::make_unique<Request>();
  r->req = std::move(request);
  r->on_event = std::move(on_event);
  r->submit_time = Now();
  r->samples.resize(static_cast<size_t>(r->req.n));
  for (int i = 0; i < r->req.n; ++i) {
    r->samples[i].index = i;
    r->samples[i].forked = i == 0;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return InvalidArgument("the scheduler is shutting down; no new requests");
  if (static_cast<int>(live_.size()) >= options_.max_queue) {
    return ResourceExhausted("too many requests in flight (" + std::to_string(live_.size()) + "); retry later");
  }
  r->id = next_id_++;
  const RequestId id = r->id;
  live_[id] = true;
  inbox_.push_back(std::move(r));
  wake_.notify_one();
  return id;
}

bool Scheduler::Cancel(RequestId id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (live_.count(id) == 0) return false;
  cancels_.push_back(id);
  wake_.notify_one();
  return true;
}

SchedulerStats Scheduler::Stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

Status Scheduler::RunBetweenSteps(std::function<Status(Engine&)> task) {
  if (std::this_thread::get_id() == thread_id_.load()) return task(engine_);
  auto t = std::make_shared<Task>();
  t->fn = std::move(task);
  std::future<Status> done = t->done.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return InvalidArgument("the scheduler has stopped");
    tasks_.push_back(t);
    wake_.notify_one();
  }
  return done.get();
}

void Scheduler::Shutdown(ShutdownMode mode) {
  std::lock_guard<std::mutex> serial(shutdown_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_ || mode == ShutdownMode::kCancel) shutdown_mode_ = mode;
    stopping_ = true;
    wake_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

// ---------------------------------------------------------------------------
// Named sessions (scheduler thread).

Result<kv::SeqId> Scheduler::SessionSequence(const std::string& name) const {
  auto it = sessions_.find(name);
  if (it == sessions_.end()) return NotFound("no session named '" + name + "'");
  return it->second.seq;
}

Result<std::vector<int32_t>> Scheduler::SessionPendingTokens(const std::string& name) const {
  auto it = sessions_.find(name);
  if (it == sessions_.end()) return NotFound("no session named '" + name + "'");
  return it->second.pending;
}

Status Scheduler::AdoptSession(const std::string& name, kv::SeqId seq, uint64_t salt, std::vector<int32_t> pending) {
  if (!engine_.kv_manager().HasSequence(seq)) return InvalidArgument("no sequence " + std::to_string(seq) + " to adopt");
  for (const auto& [n, e] : sessions_) {
    if (e.seq == seq) return InvalidArgument("sequence " + std::to_string(seq) + " is already session '" + n + "'");
  }
  if (cache_ && cache_->IsHolder(seq)) return InvalidArgument("sequence " + std::to_string(seq) + " belongs to the prefix cache");
  for (int32_t t : pending) {
    if (t < 0 || t >= n_vocab_) return InvalidArgument("pending token id " + std::to_string(t) + " is outside the vocabulary");
  }
  auto it = sessions_.find(name);
  if (it != sessions_.end()) engine_.kv_manager().ReleaseSequence(it->second.seq);
  sessions_[name] = SessionEntry{seq, salt, std::move(pending), ++session_tick_};
  DropLruSessions();
  return Status::Ok();
}

Status Scheduler::DropSession(const std::string& name) {
  auto it = sessions_.find(name);
  if (it == sessions_.end()) return NotFound("no session named '" + name + "'");
  engine_.kv_manager().ReleaseSequence(it->second.seq);
  sessions_.erase(it);
  return Status::Ok();
}

std::vector<std::string> Scheduler::SessionNames() const {
  std::vector<std::string> names;
  for (const auto& [n, e] : sessions_) names.push_back(n);
  return names;
}

Status Scheduler::CheckInvariants() const {
  KVX_RETURN_IF_ERROR(engine_.kv_manager().CheckInvariants());
  if (!cache_) return Status::Ok();
  KVX_RETURN_IF_ERROR(cache_->CheckInvariants());
  for (const auto& r : running_) {
    for (const Sample& s : r->samples) {
      if (s.locked != kv::RadixCache::kNoNode && (s.session == nullptr || cache_->lock_count(s.locked) < 1)) {
        return Internal("request " + std::to_string(r->id) + " sample " + std::to_string(s.index) +
                        ": a cache lock without a running sequence or a lock count");
      }
    }
  }
  return Status::Ok();
}

void Scheduler::DropLruSessions() {
  while (static_cast<int>(sessions_.size()) > options_.max_sessions) {
    auto oldest = sessions_.begin();
    for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
      if (it->second.last_used < oldest->second.last_used) oldest = it;
    }
    engine_.kv_manager().ReleaseSequence(oldest->second.seq);
    sessions_.erase(oldest);
  }
}

// ---------------------------------------------------------------------------
// The loop.

void Scheduler::Loop() {
  thread_id_.store(std::this_thread::get_id());
  for (;;) {
    std::vector<std::unique_ptr<Request>> incoming;
    std::vector<RequestId> cancels;
    std::vector<std::shared_ptr<Task>> tasks;
    bool stopping;
    ShutdownMode mode;
    {
      std::unique_lock<std::mutex> lock(mu_);
      const bool idle = queue_.empty() && running_.empty();
      if (idle) {
        wake_.wait(lock, [&] { return !inbox_.empty() || !cancels_.empty() || !tasks_.empty() || stopping_; });
      }
      TakeInbox(&incoming, &cancels, &tasks);
      stopping = stopping_;
      mode = shutdown_mode_;
    }
    for (auto& r : incoming) {
      work_.requests_submitted++;
      Enqueue(std::move(r));
    }
    for (RequestId id : cancels) CancelId(id);
    for (auto& t : tasks) t->done.set_value(t->fn(engine_));
    if (stopping && mode == ShutdownMode::kCancel) {
      while (!running_.empty()) CancelId(running_.front()->id);
      while (!queue_.empty()) CancelId(queue_.front()->id);
    }
    if (stopping && queue_.empty() && running_.empty()) {
      std::unique_lock<std::mutex> lock(mu_);
      if (inbox_.empty() && tasks_.empty() && cancels_.empty()) {
        stopped_ = true;
        break;
      }
      continue;
    }
    const double t_work = Now(), busy_before = work_.busy_seconds;
    Admit();
    const bool stepped = !running_.empty() && RunStep();
    if (stepped) work_.host_seconds += (Now() - t_work) - (work_.busy_seconds - busy_before);
    PublishStats();
    if (!stepped && !queue_.empty()) {
      // Requests wait for room nothing running will free (cannot happen
      // with consistent bookkeeping): wait for news rather than spin.
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait_for(lock, std::chrono::milliseconds(10));
    }
  }
  PublishStats();
}

void Scheduler::TakeInbox(std::vector<std::unique_ptr<Request>>* incoming, std::vector<RequestId>* cancels,
                          std::vector<std::shared_ptr<Task>>* tasks) {
  incoming->swap(inbox_);
  cancels->swap(cancels_);
  tasks->swap(tasks_);
}

void Scheduler::Enqueue(std::unique_ptr<Request> r) {
  auto before = [](const std::unique_ptr<Request>& a, const std::unique_ptr<Request>& b) {
    return a->req.priority != b->req.priority ? a->req.priority > b->req.priority : a->id < b->id;
  };
  queue_.insert(std::upper_bound(queue_.begin(), queue_.end(), r, before), std::move(r));
}

int Scheduler::RunningSequences() const {
  int n = 0;
  for (const auto& r : running_) n += r->req.n - r->finished;
  return n;
}

// Admission, FIFO (by priority): the head is admitted while it fits, and
// nothing behind it overtakes it (a large request is never starved by small
// ones). "Fits": its sequences fit the running limit, and the KV its
// uncached tokens need (plus a page per table of growth for every running
// sequence) fits the pool's free bytes plus what the prefix cache could
// evict.
void Scheduler::Admit() {
  if (queue_.empty()) return;
  kv::KVManager& m = engine_.kv_manager();
  uint64_t growth = 0;
  for (const auto& r : running_) growth += block_bytes_ * static_cast<uint64_t>(r->req.n - r->finished);
  const uint64_t budget = m.pool().budget_bytes(), used = m.BytesInUse();
  uint64_t free_bytes = budget > used ? budget - used : 0;
  bool evictable_added = false;
  size_t i = 0;  // waiters for an in-flight prefix stay queued and are passed
  while (i < queue_.size()) {
    Request& r = *queue_[i];
    if (WaitsForPrefix(r)) {
      ++i;
      continue;
    }
    if (!running_.empty() && RunningSequences() + (r.req.n - r.finished) > options_.max_running) return;
    uint64_t available = free_bytes > growth ? free_bytes - growth : 0;
    bool admitted = false;
    Status s = TryAdmit(r, &available, &admitted);
    if (s.ok() && !admitted && !evictable_added && cache_) {
      free_bytes += cache_->EvictableBytes();  // cached pages give way to new work
      evictable_added = true;
      available = free_bytes > growth ? free_bytes - growth : 0;
      s = TryAdmit(r, &available, &admitted);
    }
    if (!s.ok()) {
      std::unique_ptr<Request> dead = std::move(queue_[i]);
      queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(i));
      running_.push_back(std::move(dead));  // FailRequest finishes running requests
      FailRequest(*running_.back(), FinishReason::kError, s);
      continue;
    }
    if (!admitted) {
      if (running_.empty()) {
        // Nothing runs and it still does not fit: it never will.
        std::unique_ptr<Request> dead = std::move(queue_[i]);
        queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(i));
        running_.push_back(std::move(dead));
        FailRequest(*running_.back(), FinishReason::kError,
                    ResourceExhausted("the request's KV does not fit the pool (budget " + std::to_string(budget) +
                                      " bytes, " + std::to_string(m.BytesInUse()) +
                                      " in use by sessions and the cache); shorten it, drop sessions, or raise "
                                      "budget= in --kv"));
        continue;
      }
      return;
    }
    free_bytes = available + growth;
    growth += block_bytes_ * static_cast<uint64_t>(r.req.n - r.finished);
    std::unique_ptr<Request> moved = std::move(queue_[i]);
    queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(i));
    auto pos = std::upper_bound(running_.begin(), running_.end(), moved,
                                [](const auto& a, const auto& b) { return a->id < b->id; });
    running_.insert(pos, std::move(moved));
  }
}

// In-flight prefix sharing. A new request whose prompt shares full blocks
// with a running sequence of the same tenant (its LEADER) starts from the
// leader's blocks rather than computing them too: the ones the leader has
// committed enter the cache now (PublishPrefix: pages shared, locked while
// the leader runs), so they are reachable before it finishes; while the
// leader is still prefilling shared blocks, the request waits (stays
// queued, passed by admission) and the next rounds publish what it
// committed meanwhile. A burst of requests with one long system prompt
// computes it once. Nobody sharing, nothing published: a leader's cache
// entries then come at its end, as for any request. A waiter never waits
// for a request that is not running (preempted, cancelled, finished): it is
// then admitted on its own, from whatever the leader left in the cache.
bool Scheduler::WaitsForPrefix(Request& r) {
  if (!cache_ || r.started || !r.req.resume_session.empty() || r.req.prompt.size() < 2) return false;
  // What the lookup at admission may match: all but the prompt's last token.
  const std::vector<int32_t>& want = r.req.prompt;
  const size_t limit = want.size() - 1;
  Sample* leader = nullptr;
  int leader_blocks = 0, leader_committed = 0;
  for (const auto& other : running_) {
    if (other->req.tenant_salt != r.req.tenant_salt || CompressesAtBase(*other)) continue;
    const std::vector<int32_t>& base = other->base;
    for (Sample& s : other->samples) {
      if (s.session == nullptr || s.finished || engine_.kv_manager().entries_removed(s.session->id())) continue;
      // Tokens in common with the sample's base + generated (what its KV holds once prefilled).
      const size_t n = std::min(limit, base.size() + s.generated.size());
      size_t same = 0;
      while (same < n && want[same] == (same < base.size() ? base[same] : s.generated[same - base.size()])) ++same;
      const int blocks = static_cast<int>(same) / page_tokens_;
      const int committed = std::min(blocks, s.session->n_past() / page_tokens_);
      if (blocks > leader_blocks || (blocks == leader_blocks && committed > leader_committed)) {
        leader = &s;
        leader_blocks = blocks;
        leader_committed = committed;
      }
    }
  }
  if (leader == nullptr) return false;
  PublishPrefix(*leader, leader_committed);
  if (leader_committed >= leader_blocks) return false;  // all committed: a plain hit
  const kv::RadixCache::Match m = cache_->Lookup(r.req.tenant_salt, want, static_cast<int>(limit));
  if (m.blocks >= leader_blocks) return false;  // cached already (e.g. by another request)
  if (!r.waited_for_prefix) {
    r.waited_for_prefix = true;
    work_.prefix_waits++;
  }
  return true;
}

// Puts the first `blocks` full blocks sample `s` has committed into the
// prefix cache and moves its lock to their deepest node (so they stay while
// it runs).
void Scheduler::PublishPrefix(Sample& s, int blocks) {
  if (blocks <= s.published_blocks) return;
  s.published_blocks = blocks;
  const kv::RadixCache::NodeId deepest = cache_->InsertPrefix(s.session->id(), blocks);
  if (deepest == kv::RadixCache::kNoNode || deepest == s.locked) return;
  cache_->Lock(deepest);
  if (s.locked != kv::RadixCache::kNoNode) cache_->Unlock(s.locked);
  s.locked = deepest;
}

Status Scheduler::TryAdmit(Request& r, uint64_t* available, bool* admitted) {
  *admitted = false;
  kv::KVManager& m = engine_.kv_manager();
  const SessionEntry* session = nullptr;
  if (!r.started) {
    // The request's tokens: the session's (kept and pending), then the prompt.
    r.base.clear();
    if (!r.req.resume_session.empty()) {
      auto it = sessions_.find(r.req.resume_session);
      if (it == sessions_.end()) return NotFound("no session named '" + r.req.resume_session + "' to resume");
      if (it->second.salt != r.req.tenant_salt) {
        return InvalidArgument("session '" + r.req.resume_session + "' belongs to another tenant");
      }
      session = &it->second;
      r.base = m.tokens(session->seq);
      r.base.insert(r.base.end(), session->pending.begin(), session->pending.end());
      if (session->pending.empty() && r.req.prompt.empty()) {
        return InvalidArgument("nothing to continue: session '" + r.req.resume_session +
                               "' has no pending tokens and the prompt is empty");
      }
    }
    r.base.insert(r.base.end(), r.req.prompt.begin(), r.req.prompt.end());
    if (static_cast<int64_t>(r.base.size()) > engine_.n_ctx()) {
      return InvalidArgument("session and prompt hold " + std::to_string(r.base.size()) +
                             " tokens, more than the context length " + std::to_string(engine_.n_ctx()));
    }
  }
  // What each sample needs: a sequence from the cache (or the session)
  // holding as much of its tokens as possible, the rest to compute.
  struct Plan {
    Sample* s;
    kv::RadixCache::Match match;
    bool from_session = false;
  };
  std::vector<Plan> plans;
  uint64_t need = 0;
  int cached = 0;
  for (Sample& s : r.samples) {
    if (s.finished) continue;
    if (!s.forked) {  // a copy of sample 0's last page, later
      need += block_bytes_;
      continue;
    }
    const std::vector<int32_t> full = r.Full(s);
    Plan p{&s, {}, false};
    const int n = static_cast<int>(full.size());
    if (session != nullptr && s.index == 0) {
      p.from_session = true;
      p.match.tokens = m.length(session->seq);
    } else if (cache_) {
      // With a compression moment at the base's end, at least the base's
      // last token is computed (cached prefixes are never compressed).
      const int limit = CompressesAtBase(r) ? std::min<int>(n, static_cast<int>(r.base.size())) - 1 : n - 1;
      p.match = cache_->Lookup(r.req.tenant_salt, full, limit);
    }
    if (s.index == 0) cached = p.match.tokens;
    need += KvBytesFor(n + 1) - KvBytesFor(p.match.tokens);
    plans.push_back(p);
  }
  if (need > *available) return Status::Ok();
  // Give each sample its sequence.
  for (size_t i = 0; i < plans.size(); ++i) {
    Plan& p = plans[i];
    Result<kv::SeqId> seq = p.from_session       ? m.ForkPrefix(session->seq, p.match.tokens)
                            : p.match.blocks > 0 ? cache_->ForkMatch(p.match)
                                                 : Result<kv::SeqId>(m.AddSequence(r.req.tenant_salt));
    if (!seq.ok()) {
      // Undo the samples given a sequence so far; wait for room.
      for (size_t j = 0; j < i; ++j) {
        Sample& s = *plans[j].s;
        if (s.locked != kv::RadixCache::kNoNode) cache_->Unlock(s.locked);
        s.locked = kv::RadixCache::kNoNode;
        s.session.reset();
      }
      if (seq.status().code() == StatusCode::kResourceExhausted) return Status::Ok();
      return seq.status();
    }
    Sample& s = *p.s;
    s.session = engine_.AdoptSequence(*seq);
    s.locked = !p.from_session && p.match.blocks > 0 ? p.match.deepest : kv::RadixCache::kNoNode;
    s.published_blocks = p.from_session ? 0 : p.match.blocks;
    const std::vector<int32_t> full = r.Full(s);
    s.pending.assign(full.begin() + p.match.tokens, full.end());
    if (cache_ && !p.from_session) {
      work_.prefix_lookups++;
      work_.prefix_lookup_tokens += full.size();
      work_.prefix_hit_tokens += static_cast<uint64_t>(p.match.tokens);
    }
  }
  *available -= need;
  *admitted = true;
  if (!r.started) {
    r.started = true;
    r.timing.queue_seconds = Now() - r.submit_time;
    r.timing.prompt_tokens = static_cast<int>(r.base.size());
    r.timing.cached_tokens = cached;
    work_.queue_time.Add(r.timing.queue_seconds);
    for (Sample& s : r.samples) {
      model::SamplerOptions o = r.req.sampling;
      o.seed += static_cast<uint64_t>(s.index);
      s.sampler = std::make_unique<model::Sampler>(o);
      for (int32_t t : r.base) s.sampler->Accept(t);
    }
    if (session != nullptr) sessions_[r.req.resume_session].last_used = ++session_tick_;
  }
  return Status::Ok();
}

Scheduler::Request* Scheduler::Youngest() { return running_.empty() ? nullptr : running_.back().get(); }

std::unique_ptr<Scheduler::Request> Scheduler::TakeRunning(Request* r) {
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if (it->get() == r) {
      std::unique_ptr<Request> out = std::move(*it);
      running_.erase(it);
      return out;
    }
  }
  return nullptr;
}

// Recompute preemption: the request's computed blocks go to the prefix cache
// (so readmission usually recomputes only the last partial page), its
// sequences are released, and it waits at the head of the queue (by id).
void Scheduler::Preempt(Request* r) {
  for (Sample& s : r->samples) {
    if (s.session == nullptr) continue;
    if (s.locked != kv::RadixCache::kNoNode) cache_->Unlock(s.locked);
    s.locked = kv::RadixCache::kNoNode;
    if (cache_) cache_->Insert(s.session->Detach());
    s.session.reset();
    s.pending.clear();
  }
  r->timing.preemptions++;
  work_.preemptions++;
  Enqueue(TakeRunning(r));
}

// One step: decode rows of every running sequence (oldest request first),
// then prefill chunks in the same order until max_step_tokens. When the
// pool cannot hold it: evict cached pages, else preempt the youngest
// request, and retry.
bool Scheduler::RunStep() {
  struct Row {
    Request* r;
    Sample* s;
    int n;
  };
  std::vector<Row> rows;
  int budget = options_.max_step_tokens;
  for (auto& r : running_) {
    for (Sample& s : r->samples) {
      if (s.session == nullptr || s.finished || s.pending.size() != 1 || s.generated.empty()) continue;
      if (budget == 0) break;
      rows.push_back({r.get(), &s, 1});
      --budget;
    }
  }
  for (auto& r : running_) {
    for (Sample& s : r->samples) {
      if (budget == 0) break;
      if (s.session == nullptr || s.finished || (s.pending.size() == 1 && !s.generated.empty())) continue;
      if (s.pending.empty()) continue;  // (cannot happen: a sequence with nothing pending sampled already)
      int n = std::min<int>(budget, static_cast<int>(s.pending.size()));
      const int to_base = static_cast<int>(r->base.size()) - s.session->n_past();
      if (CompressesAtBase(*r) && to_base > 0) n = std::min(n, to_base);  // stop at the compression moment
      rows.push_back({r.get(), &s, n});
      budget -= n;
    }
  }
  if (rows.empty()) return false;
  const double t0 = Now();
  for (;;) {
    std::vector<StepInput> inputs;
    for (const Row& row : rows) {
      StepInput in;
      in.session = row.s->session.get();
      in.tokens = std::span<const int32_t>(row.s->pending.data(), row.n);
      in.logits = row.n == static_cast<int>(row.s->pending.size()) ? &row.s->logits : nullptr;
      inputs.push_back(in);
    }
    const Status st = engine_.Step(inputs);
    if (st.ok()) break;
    if (st.code() != StatusCode::kResourceExhausted) {
      // Inputs are checked at admission, so this is a policy error after a
      // committed step or a bug: the requests in the step end with it.
      std::set<Request*> failed;
      for (const Row& row : rows) failed.insert(row.r);
      for (Request* r : failed) FailRequest(*r, FinishReason::kError, st);
      return true;
    }
    // Evict about what the step writes (its tokens plus a partial page per
    // row), so that a big prefill chunk does not retry block by block.
    int step_tokens = 0;
    for (const Row& row : rows) step_tokens += row.n;
    const uint64_t step_bytes = KvBytesFor(step_tokens) + block_bytes_ * rows.size();
    if (cache_ && cache_->Evict(step_bytes) > 0) continue;
    Request* victim = Youngest();
    if (running_.size() == 1) {
      FailRequest(*victim, FinishReason::kError,
                  ResourceExhausted("the KV pool (budget " + std::to_string(engine_.pool().budget_bytes()) +
                                    " bytes) cannot hold this request even alone: " + st.message()));
      return true;
    }
    Preempt(victim);
    rows.erase(std::remove_if(rows.begin(), rows.end(), [&](const Row& row) { return row.r == victim; }), rows.end());
    if (rows.empty()) return true;
  }
  const double t1 = Now();
  work_.steps++;
  work_.busy_seconds += t1 - t0;
  uint64_t prefill_tokens = 0;
  std::vector<Sample*> reached;  // sequences that now hold their request's whole base
  for (const Row& row : rows) {
    row.s->pending.erase(row.s->pending.begin(), row.s->pending.begin() + row.n);
    if (row.s->generated.empty() || row.n > 1) {
      prefill_tokens += static_cast<uint64_t>(row.n);
    } else {
      work_.decode_rows++;
    }
    const int base = static_cast<int>(row.r->base.size()), now = row.s->session->n_past();
    if (CompressesAtBase(*row.r) && now - row.n < base && now >= base) reached.push_back(row.s);
  }
  work_.prompt_tokens_computed += prefill_tokens;
  if (prefill_tokens == 0) {
    work_.decode_only_steps++;
    work_.decode_only_seconds += t1 - t0;
  }
  // Sample where the input is consumed (requests may leave running_ here).
  std::set<Request*> seen;
  std::vector<Request*> order;
  for (const Row& row : rows) {
    if (seen.insert(row.r).second) order.push_back(row.r);
  }
  for (Request* r : order) {
    if (!reached.empty() && !CompressAtBase(*r, reached)) continue;
    if (!r->samples[0].forked) continue;
    bool gone = false;
    // Samples waiting for sample 0's prompt fork first (they sample from
    // the same logits).
    const Sample& s0 = r->samples[0];
    if (s0.session != nullptr && s0.pending.empty() && s0.generated.empty() && !ForkSiblings(*r)) gone = true;
    if (gone) continue;
    std::vector<Sample*> ready;
    for (Sample& s : r->samples) {
      if (s.session != nullptr && !s.finished && s.pending.empty()) ready.push_back(&s);
    }
    for (Sample* s : ready) AfterStep(*r, *s);
  }
  work_.sample_seconds += Now() - t1;
  return true;
}

bool Scheduler::CompressesAtBase(const Request& r) const { return compress_once_ && r.req.compress; }

// Compresses each of r's samples in `reached` (KVManager::Compress). A
// policy may need pages (private copies of pages shared with the prefix
// cache, compaction): when the pool cannot give them, evict cached pages,
// else preempt the youngest request (maybe this one; a policy leaves a
// consistent sequence when it fails half-way), and retry. False when the
// request left the running set.
bool Scheduler::CompressAtBase(Request& r, const std::vector<Sample*>& reached) {
  for (Sample& s : r.samples) {
    if (std::find(reached.begin(), reached.end(), &s) == reached.end()) continue;
    if (s.session == nullptr) return false;  // preempted earlier in this step's aftermath
    for (;;) {
      const Status st = s.session->Compress();
      if (st.ok()) break;
      if (st.code() == StatusCode::kResourceExhausted) {
        if (cache_ && cache_->Evict(block_bytes_) > 0) continue;
        Request* victim = Youngest();
        if (victim != &r || running_.size() > 1) {
          Preempt(victim);
          if (victim == &r) return false;
          continue;
        }
      }
      FailRequest(r, FinishReason::kError, st.WithContext("compressing the KV after the prompt"));
      return false;
    }
  }
  return true;
}

// Forks samples 1..n-1 from sample 0 once its prompt is in the KV. When the
// partial page's copy does not fit: evict, else preempt the youngest (maybe
// this request). False when the request left the running set.
bool Scheduler::ForkSiblings(Request& r) {
  Sample& s0 = r.samples[0];
  for (Sample& s : r.samples) {
    if (s.forked || s.finished) continue;
    for (;;) {
      auto fork = engine_.ForkSession(*s0.session, s0.session->n_past());
      if (fork.ok()) {
        s.session = std::move(fork).value();
        s.forked = true;
        s.logits = s0.logits;
        break;
      }
      if (fork.status().code() != StatusCode::kResourceExhausted) {
        FailRequest(r, FinishReason::kError, fork.status());
        return false;
      }
      if (cache_ && cache_->Evict(block_bytes_) > 0) continue;
      Request* victim = Youngest();
      if (victim == &r && running_.size() == 1) {
        FailRequest(r, FinishReason::kError, fork.status());
        return false;
      }
      Preempt(victim);
      if (victim == &r) return false;
    }
  }
  return true;
}

void Scheduler::AfterStep(Request& r, Sample& s) {
  const double now = Now();
  const int32_t token = s.sampler->Sample(s.logits.data(), n_vocab_);
  s.generated.push_back(token);
  work_.tokens_generated++;
  r.timing.generated_tokens++;
  if (s.generated.size() == 1) {
    if (s.index == 0) {
      r.timing.ttft_seconds = now - r.submit_time;
      work_.ttft.Add(r.timing.ttft_seconds);
    }
  } else {
    work_.inter_token.Add(now - s.last_token_time);
  }
  s.last_token_time = now;
  RequestEvent e;
  e.kind = RequestEvent::Kind::kToken;
  e.request = r.id;
  e.sample = s.index;
  e.token = token;
  e.index = static_cast<int>(s.generated.size()) - 1;
  Emit(r, e);
  const bool stop = std::find(r.req.stop_tokens.begin(), r.req.stop_tokens.end(), token) != r.req.stop_tokens.end() ||
                    (r.req.stop_at_eog && engine_.model().tokenizer().IsEog(token));
  if (stop) {
    FinishSample(r, s, FinishReason::kStop, Status::Ok());
  } else if (static_cast<int>(s.generated.size()) >= r.req.max_tokens || s.session->n_past() >= engine_.n_ctx()) {
    FinishSample(r, s, FinishReason::kLength, Status::Ok());
  } else {
    s.pending.assign(1, token);
  }
}

void Scheduler::Emit(Request& r, const RequestEvent& e) { r.on_event(e); }

// Ends one sample: its sequence goes to the cache (or becomes the named
// session, or is released), then its finish event; the request ends with
// its last sample.
void Scheduler::FinishSample(Request& r, Sample& s, FinishReason reason, Status status) {
  if (s.finished) return;
  s.finished = true;
  r.finished++;
  if (s.session != nullptr) {
    if (s.locked != kv::RadixCache::kNoNode) cache_->Unlock(s.locked);
    s.locked = kv::RadixCache::kNoNode;
    const bool normal = reason == FinishReason::kLength || reason == FinishReason::kStop;
    if (normal && s.index == 0 && !r.req.save_session.empty()) {
      const std::string& name = r.req.save_session;
      auto it = sessions_.find(name);
      if (it != sessions_.end()) engine_.kv_manager().ReleaseSequence(it->second.seq);
      // Not yet in the KV: the last sampled token.
      sessions_[name] = SessionEntry{s.session->Detach(), r.req.tenant_salt, {s.generated.back()}, ++session_tick_};
      DropLruSessions();
    } else if (normal && cache_) {
      cache_->Insert(s.session->Detach());
    }
    s.session.reset();
  }
  s.pending.clear();
  RequestEvent e;
  e.kind = RequestEvent::Kind::kFinish;
  e.request = r.id;
  e.sample = s.index;
  e.reason = reason;
  e.status = std::move(status);
  e.tokens = s.generated;
  e.done = r.finished == r.req.n;
  if (e.done) {
    r.timing.total_seconds = Now() - r.submit_time;
    e.timing = r.timing;
    work_.requests_finished++;
    if (reason == FinishReason::kCancelled) work_.requests_cancelled++;
    if (reason == FinishReason::kError) work_.requests_failed++;
    std::unique_ptr<Request> keep = TakeRunning(&r);  // alive until the callback returns
    {
      std::lock_guard<std::mutex> lock(mu_);
      live_.erase(r.id);
    }
    Emit(r, e);
    return;
  }
  Emit(r, e);
}

// Ends every unfinished sample of a running request (the request object is
// gone afterwards).
void Scheduler::FailRequest(Request& r, FinishReason reason, Status status) {
  std::vector<Sample*> open;
  for (Sample& s : r.samples) {
    if (!s.finished) open.push_back(&s);
  }
  for (Sample* s : open) FinishSample(r, *s, reason, status);
}

void Scheduler::CancelId(RequestId id) {
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    if ((*it)->id == id) {
      std::unique_ptr<Request> r = std::move(*it);
      queue_.erase(it);
      running_.push_back(std::move(r));
      Request& back = *running_.back();
      FailRequest(back, FinishReason::kCancelled, Status::Ok());
      return;
    }
  }
  for (auto& r : running_) {
    if (r->id == id) {
      // Cancelled sequences are released, not cached: a client that went
      // away frees its pages at once.
      for (Sample& s : r->samples) {
        if (s.locked != kv::RadixCache::kNoNode) cache_->Unlock(s.locked);
        s.locked = kv::RadixCache::kNoNode;
        s.session.reset();
      }
      FailRequest(*r, FinishReason::kCancelled, Status::Ok());
      return;
    }
  }
}

void Scheduler::PublishStats() {
  const kv::KVManager& m = engine_.kv_manager();
  SchedulerStats s = work_;
  s.queued = static_cast<int>(queue_.size());
  s.running_requests = static_cast<int>(running_.size());
  s.running_sequences = 0;
  for (const auto& r : running_) {
    for (const Sample& x : r->samples) s.running_sequences += x.session != nullptr;
  }
  s.sessions = static_cast<int>(sessions_.size());
  s.pool_bytes_used = m.BytesInUse();
  s.pool_budget_bytes = m.pool().budget_bytes();
  const kv::BlockPool& pool = m.pool();
  for (int c = 0; c < pool.num_size_classes(); ++c) {
    PageClassStats pc;
    pc.page_bytes = pool.page_bytes(c);
    pc.pages_in_use = pool.pages_in_use(c);
    std::set<std::string> names;
    for (const kv::LayerCodec& lc : m.spec().layers) {
      auto round = [](size_t b) { return (b + 63) / 64 * 64; };
      if (round(lc.packed_page_bytes) == pc.page_bytes) names.insert(std::string(kv::CodecName(lc.id)));
      if ((lc.sealed || lc.sink_pages > 0) && round(lc.full_page_bytes) == pc.page_bytes) names.insert("f16 staging");
    }
    for (const std::string& n : names) pc.label += (pc.label.empty() ? "" : "+") + n;
    s.page_classes.push_back(pc);
  }
  if (cache_) {
    s.cache_blocks = cache_->num_blocks();
    s.cache_bytes = static_cast<uint64_t>(s.cache_blocks) * block_bytes_;
    s.cache_evicted_blocks = cache_->evicted_blocks();
  }
  s.uptime_seconds = Now() - start_time_;
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_ = std::move(s);
}

}  // namespace kvx::engine
