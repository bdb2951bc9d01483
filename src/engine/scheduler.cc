#include "engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <set>

#include "engine/compressed_cache.h"
#include "engine/scheduler_request.h"
#include "engine/session.h"
#include "kv/sequence_kv.h"
#include "util/clock.h"

namespace kvx::engine {

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

namespace {
// Compressed contexts kept at most (LRU beyond; the pool's needs evict them
// sooner): a server's few shared documents, an eval's current context.
constexpr int kCompressedEntries = 64;
}  // namespace

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
  if (!(options.prefill_tokens_per_second >= 0)) return InvalidArgument("prefill_tokens_per_second must be >= 0");
  if (options.tiers && options.tiers->space().spec_fingerprint != kv::tier::SpecFingerprint(engine.kv_manager().spec())) {
    return InvalidArgument("the KV tiers were made for another KV spec than the engine's");
  }
  if (options.max_chunks < 1) return InvalidArgument("max_chunks must be at least 1");
  if (options.max_sessions_total < 0) return InvalidArgument("max_sessions_total must be >= 0");
  if (!options.clock) {
    options.clock = util::MonotonicSeconds;
  }
  if (!(options.copy_bytes_per_second >= 0)) return InvalidArgument("copy_bytes_per_second must be >= 0");
  if (options.preempt != PreemptMode::kRecompute && options.copy_bytes_per_second == 0) {
    options.copy_bytes_per_second = MeasureCopyBandwidth();
  }
  if (options.tiers && options.prefill_tokens_per_second == 0) {
    options.prefill_tokens_per_second = MeasurePrefill(engine);
  }
  std::unique_ptr<Scheduler> s(new Scheduler(engine, std::move(options)));
  s->thread_ = std::thread([p = s.get()] { p->Loop(); });
  return s;
}

// Tokens per second of one prefill of up to 128 tokens on a sequence of its
// own (released after): what a tier load must beat before the steps have
// measured the real thing. 0 (no deadline) when it cannot run.
double Scheduler::MeasurePrefill(Engine& engine) {
  const int n = std::min(128, engine.n_ctx() - 1);
  std::vector<int32_t> tokens(static_cast<size_t>(std::max(n, 1)));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i % engine.model().config().n_vocab);
  Result<std::unique_ptr<Session>> session = engine.NewSession();
  if (!session.ok()) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  if (!(*session)->Feed(tokens).ok()) return 0;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(tokens.size()) / std::max(seconds, 1e-6);
}

Scheduler::Scheduler(Engine& engine, SchedulerOptions options) : engine_(engine), options_(std::move(options)) {
  n_vocab_ = engine_.model().config().n_vocab;
  const kv::ResolvedKVSpec& spec = engine_.kv_manager().spec();
  page_tokens_ = spec.layout.page_tokens;
  block_bytes_ = KvBytesFor(page_tokens_);
  compress_once_ = engine_.kv_manager().HasOncePolicy();
  copy_bytes_per_second_ = options_.copy_bytes_per_second;
  if (options_.prefix_cache) {
    cache_ = std::make_unique<kv::RadixCache>(&engine_.kv_manager());
    compressed_ = std::make_unique<CompressedCache>(&engine_.kv_manager(), kCompressedEntries);
  }
  if (cache_ && options_.tiers) {  // the tiers load into the prefix cache: nothing to load into without it
    tiers_ = options_.tiers;
    tiers_->SetOnLoad([this] {
      std::lock_guard<std::mutex> lock(mu_);
      wake_.notify_one();
    });
    // Write-back: blocks go to the tiers when they leave the pool.
    if (tiers_->write_back()) cache_->SetEvictionObserver([this](kv::SeqId holder) { WriteBlocks(holder); });
  }
  if (options_.chunk_cache_bytes > 0) {
    Result<std::unique_ptr<ChunkAssembler>> chunker = ChunkAssembler::Create(&engine_, options_.chunk_cache_bytes);
    if (chunker.ok()) chunker_ = std::move(chunker).value();
    chunker_status_ = chunker.status();
    // Chunks computed alone go to the tiers too (not for "cache": "none"
    // requests: AssembleSample says which request is assembling).
    if (chunker_ && tiers_) {
      chunker_->SetOnComputed([this](uint64_t salt, const kv::KVManager::SequenceImage& image) {
        if (chunks_to_tiers_) tiers_->WriteChunk(salt, image);
      });
    }
  } else {
    chunker_status_ = InvalidArgument("chunk reuse is off (a chunk cache of 0 bytes): start the server with "
                                      "--chunk-cache-bytes above 0, or send one prompt");
  }
  start_time_ = Now();
  work_.pool_budget_bytes = engine_.pool().budget_bytes();
  stats_ = work_;
}

Scheduler::~Scheduler() {
  Shutdown(ShutdownMode::kCancel);
  if (tiers_) {
    tiers_->SetOnLoad({});
    if (tiers_->write_back()) {  // what the cache still holds leaves the pool now
      for (kv::SeqId holder : cache_->Holders()) WriteBlocks(holder);
    }
  }
  // Sequences before the cache's holders, sessions, then the cache.
  queue_.clear();
  running_.clear();
  for (auto& [name, e] : sessions_) ReleaseSession(e);
  sessions_.clear();
  compressed_.reset();
  cache_.reset();
}

uint64_t Scheduler::KvBytesFor(int64_t tokens) const {
  const kv::ResolvedKVSpec& spec = engine_.kv_manager().spec();
  return tokens <= 0 ? 0 : kv::BytesForContext(spec.layout, spec.layers, tokens);
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

namespace {

Status NoSession(const std::string& name) { return NotFound("no session named '" + name + "'"); }

}  // namespace

Result<kv::SeqId> Scheduler::SessionSequence(uint64_t salt, const std::string& name) {
  auto it = sessions_.find({salt, name});
  if (it == sessions_.end()) return NoSession(name);
  SessionEntry& e = it->second;
  if (e.swapped) {  // back from host RAM (to be read, e.g. saved to a file)
    KVX_ASSIGN_OR_RETURN(e.seq, SwapIn(*e.swapped, -1));
    e.swapped.reset();
  }
  return e.seq;
}

Result<std::vector<int32_t>> Scheduler::SessionPendingTokens(uint64_t salt, const std::string& name) const {
  auto it = sessions_.find({salt, name});
  if (it == sessions_.end()) return NoSession(name);
  return it->second.pending;
}

Status Scheduler::AdoptSession(const std::string& name, kv::SeqId seq, uint64_t salt, std::vector<int32_t> pending) {
  if (!engine_.kv_manager().HasSequence(seq)) return InvalidArgument("no sequence " + std::to_string(seq) + " to adopt");
  for (const auto& [key, e] : sessions_) {
    if (e.seq == seq) return InvalidArgument("sequence " + std::to_string(seq) + " is already a session");
  }
  if (cache_ && cache_->IsHolder(seq)) return InvalidArgument("sequence " + std::to_string(seq) + " belongs to the prefix cache");
  for (int32_t t : pending) {
    if (t < 0 || t >= n_vocab_) return InvalidArgument("pending token id " + std::to_string(t) + " is outside the vocabulary");
  }
  KeepSession({salt, name}, SessionEntry{seq, std::move(pending), 0, nullptr});
  return Status::Ok();
}

Status Scheduler::DropSession(uint64_t salt, const std::string& name) {
  auto it = sessions_.find({salt, name});
  if (it == sessions_.end()) return NoSession(name);
  ReleaseSession(it->second);
  sessions_.erase(it);
  IndexSessions();
  return Status::Ok();
}

std::vector<std::string> Scheduler::SessionNames(uint64_t salt) const {
  std::vector<std::string> names;
  for (auto it = sessions_.lower_bound({salt, std::string()}); it != sessions_.end() && it->first.first == salt; ++it) {
    names.push_back(it->first.second);
  }
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

void Scheduler::KeepSession(const SessionKey& key, SessionEntry entry) {
  auto it = sessions_.find(key);
  if (it != sessions_.end()) ReleaseSession(it->second);
  entry.last_used = ++session_tick_;
  sessions_[key] = std::move(entry);
  DropLruSessions(key.first);
}

// The quotas: tenant `salt`'s own least recently used sessions beyond
// max_sessions, then anyone's beyond max_sessions_total.
void Scheduler::DropLruSessions(uint64_t salt) {
  auto drop_oldest = [this](bool of_tenant, uint64_t tenant) {
    auto oldest = sessions_.end();
    for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
      if (of_tenant && it->first.first != tenant) continue;
      if (oldest == sessions_.end() || it->second.last_used < oldest->second.last_used) oldest = it;
    }
    ReleaseSession(oldest->second);
    sessions_.erase(oldest);
  };
  auto tenant_count = [&] {
    return std::count_if(sessions_.begin(), sessions_.end(), [&](const auto& kv) { return kv.first.first == salt; });
  };
  while (tenant_count() > options_.max_sessions) drop_oldest(true, salt);
  while (static_cast<int>(sessions_.size()) > options_.max_sessions_total) drop_oldest(false, 0);
  IndexSessions();  // every change of sessions_ ends here or in DropSession
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
      // A pin is set as the request arrives, before its blocks exist (outside
      // mu_: the store's I/O thread takes mu_ to wake this loop).
      const CacheMode c = r->req.cache;
      if (c == CacheMode::kPin || c == CacheMode::kUnpin) {
        tiers_->Pin(r->req.tenant_salt, r->req.prompt, c == CacheMode::kPin);
      }
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
    const bool assembled = AssembleChunks();
    const bool stepped = (!running_.empty() && RunStep()) || assembled;
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

void Scheduler::PublishStats() {
  const kv::KVManager& m = engine_.kv_manager();
  SchedulerStats s = work_;
  s.queued = static_cast<int>(queue_.size());
  s.swapped_bytes = SwappedBytes();
  s.copy_bytes_per_second = copy_bytes_per_second_;
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
    s.compressed_entries = compressed_->size();
  }
  if (tiers_) {
    s.tiers = tiers_->Metrics();
    s.tier_counters = tiers_->counters();
  }
  s.uptime_seconds = Now() - start_time_;
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_ = std::move(s);
}

}  // namespace kvx::engine
