// Admission (FIFO by priority, KV budget, in-flight prefix sharing) and
// preemption (by recompute here, by swap in scheduler_swap.cc).
#include <algorithm>
#include <string>

#include "engine/compressed_cache.h"
#include "engine/scheduler.h"
#include "engine/scheduler_request.h"

namespace kvx::engine {

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
    if (WaitsForTiers(r) || WaitsForPrefix(r)) {
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
      // Kept compressed contexts give way too, then idle named sessions
      // (to host RAM; not the one this request resumes).
      const SessionKey resumed{r.req.tenant_salt, r.req.resume_session};
      if ((compressed_ && compressed_->EvictOne()) || SwapOutIdleSession(r.req.resume_session.empty() ? nullptr : &resumed)) {
        const uint64_t in_use = m.BytesInUse();
        free_bytes = (budget > in_use ? budget - in_use : 0) + (evictable_added ? cache_->EvictableBytes() : 0);
        continue;
      }
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
  if (!Caches(r) || r.started || !r.req.resume_session.empty() || r.req.prompt.size() < 2) return false;
  // What the lookup at admission may match: all but the prompt's last token.
  const std::vector<int32_t>& want = r.req.prompt;
  const size_t limit = want.size() - 1;
  Sample* leader = nullptr;
  int leader_blocks = 0, leader_committed = 0;
  for (const auto& other : running_) {
    if (other->req.tenant_salt != r.req.tenant_salt || CompressesAtBase(*other) || !Caches(*other)) continue;
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
      KVX_RETURN_IF_ERROR(CheckResumeAtAdmission(r.req, &session));
      r.base = SessionTokens(*session);
      r.base.insert(r.base.end(), session->pending.begin(), session->pending.end());
    }
    r.base.insert(r.base.end(), r.req.prompt.begin(), r.req.prompt.end());
  }
  // What each sample needs: a sequence from the cache (or the session)
  // holding as much of its tokens as possible, the rest to compute.
  struct Plan {
    Sample* s;
    kv::RadixCache::Match match;
    bool from_session = false;
    kv::SeqId compressed = -1;  // a compressed cache entry holding match.tokens
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
    Plan p{&s, {}, false, -1};
    const int n = static_cast<int>(full.size());
    if (s.swapped) {  // its whole sequence comes back from host RAM
      p.match.tokens = static_cast<int>(s.swapped->image.tokens.size());
    } else if (session != nullptr && s.index == 0) {
      p.from_session = true;
      p.match.tokens = session->swapped ? static_cast<int>(session->swapped->image.tokens.size()) : m.length(session->seq);
    } else if (Caches(r)) {
      // With a compression moment at the base's end, at least the base's
      // last token is computed (cached prefixes are never compressed).
      const int limit = CompressesAtBase(r) ? std::min<int>(n, Moment(r)) - 1 : n - 1;
      p.match = cache_->Lookup(r.req.tenant_salt, full, limit);
      const auto [seq, tokens] = LookupCompressed(r, full);
      if (tokens > p.match.tokens) {
        p.compressed = seq;
        p.match = kv::RadixCache::Match{0, tokens, kv::RadixCache::kNoNode};
      }
    }
    if (s.index == 0) cached = p.match.tokens;
    // (A swapped sample brings its own pages but those it shares; a swapped
    // session all of its own.)
    const int shared = s.swapped ? s.swapped->shared_tokens : p.from_session && session->swapped ? 0 : p.match.tokens;
    need += KvBytesFor(n + 1) - KvBytesFor(shared);
    plans.push_back(p);
  }
  if (need > *available) return Status::Ok();
  // Give each sample its sequence.
  kv::SeqId swap_anchor = -1;  // the first sample swapped in: the others share its prompt's pages
  for (size_t i = 0; i < plans.size(); ++i) {
    Plan& p = plans[i];
    Result<kv::SeqId> seq = p.s->swapped         ? SwapIn(*p.s->swapped, swap_anchor)
                            : p.from_session     ? (session->swapped ? SwapIn(*session->swapped, -1)
                                                                     : m.ForkPrefix(session->seq, p.match.tokens))
                            : p.compressed >= 0  ? m.ForkPrefix(p.compressed, p.match.tokens)
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
    if (s.swapped && swap_anchor < 0) swap_anchor = *seq;
    s.session = engine_.AdoptSequence(*seq);
    s.locked = !p.from_session && p.match.blocks > 0 ? p.match.deepest : kv::RadixCache::kNoNode;
    s.published_blocks = p.from_session ? 0 : p.match.blocks;
    const std::vector<int32_t> full = r.Full(s);
    s.pending.assign(full.begin() + p.match.tokens, full.end());
    if (Caches(r) && !p.from_session && !s.swapped) {
      work_.prefix_lookups++;
      work_.prefix_lookup_tokens += full.size();
      if (p.compressed >= 0) {
        work_.compressed_hits++;
        work_.compressed_hit_tokens += static_cast<uint64_t>(p.match.tokens);
      } else {
        work_.prefix_hit_tokens += static_cast<uint64_t>(p.match.tokens);
      }
    }
  }
  *available -= need;
  *admitted = true;
  for (Sample& s : r.samples) s.swapped.reset();  // back in the pool: the host copies go
  if (!r.started) {
    r.started = true;
    r.timing.queue_seconds = Now() - r.submit_time;
    r.timing.prompt_tokens = static_cast<int>(r.base.size());
    r.timing.cached_tokens = cached;
    for (size_t t = 0; t < r.tier_tokens.size(); ++t) {
      const int from_tier = std::min(r.tier_tokens[t], cached);  // (the lookup may have matched less since)
      if (from_tier > 0) r.timing.cached_by_tier.emplace_back(tiers_->tier_kind(t), from_tier);
      work_.tier_hit_tokens += static_cast<uint64_t>(std::max(from_tier, 0));
    }
    work_.queue_time.Add(r.timing.queue_seconds);
    for (Sample& s : r.samples) {
      model::SamplerOptions o = r.req.sampling;
      o.seed += static_cast<uint64_t>(s.index);
      s.sampler = std::make_unique<model::Sampler>(o);
      for (int32_t t : r.base) s.sampler->Accept(t);
    }
    if (session != nullptr) sessions_[{r.req.tenant_salt, r.req.resume_session}].last_used = ++session_tick_;
  }
  return Status::Ok();
}

bool Scheduler::MakeRoom(uint64_t bytes, Request** preempted) {
  *preempted = nullptr;
  if (cache_ && cache_->Evict(bytes) > 0) return true;
  if (compressed_ && compressed_->EvictOne()) return true;  // (its pages may live on in forks: retried)
  if (SwapOutIdleSession(nullptr)) return true;  // idle sessions before running requests
  if (running_.size() <= 1) return false;  // the one request left is the one that needs the room
  *preempted = Youngest();
  Preempt(*preempted);
  return true;
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

// Preemption: by swap when SwapOut takes the request (its pages to host
// RAM), else by recompute: the request's computed blocks go to the prefix
// cache (so readmission recomputes only what the cache gave up meanwhile)
// and the tiers, and its sequences are released. Either way it waits at the
// head of the queue (by id).
void Scheduler::Preempt(Request* r) {
  const bool swapped = SwapOut(*r);
  for (Sample& s : r->samples) {
    if (s.session == nullptr) continue;
    if (s.locked != kv::RadixCache::kNoNode) cache_->Unlock(s.locked);
    s.locked = kv::RadixCache::kNoNode;
    if (!swapped) {
      WriteThrough(*r, s.session->id());
      if (Caches(*r)) CacheSequence(s.session->Detach());
    }
    s.session.reset();  // (a swapped sequence is released: its pages are in host RAM)
    s.pending.clear();
  }
  r->timing.preemptions++;
  r->tiers_asked = false;  // a recomputed request looks up what its preemption wrote (swap-in through the tiers)
  work_.preemptions++;
  (swapped ? work_.preempt_swaps : work_.preempt_recomputes)++;
  Enqueue(TakeRunning(r));
}

}  // namespace kvx::engine
