// One step and what follows it: decode rows and prefill chunks, the
// compression moment, forking samples, sampling, finishing and cancelling.
#include <algorithm>
#include <set>
#include <string>

#include "engine/scheduler.h"
#include "engine/scheduler_request.h"

namespace kvx::engine {

// One step: decode rows of every running sequence (oldest request first),
// then prefill chunks in the same order until max_step_tokens. When the
// pool cannot hold it: MakeRoom, and retry without a preempted request's
// rows.
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
      const int to_base = Moment(*r) - s.session->n_past();
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
    Request* victim = nullptr;
    if (!MakeRoom(step_bytes, &victim)) {
      FailRequest(*Youngest(), FinishReason::kError,
                  ResourceExhausted("the KV pool (budget " + std::to_string(engine_.pool().budget_bytes()) +
                                    " bytes) cannot hold this request even alone: " + st.message()));
      return true;
    }
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
    const int moment = Moment(*row.r), now = row.s->session->n_past();
    if (CompressesAtBase(*row.r) && now - row.n < moment && now >= moment) reached.push_back(row.s);
  }
  work_.prompt_tokens_computed += prefill_tokens;
  if (prefill_tokens > 0 && options_.measure_prefill) {  // the cost a tier load must beat (moving average; decode rows count as tokens)
    const double per_token = (t1 - t0) / static_cast<double>(prefill_tokens + rows.size());
    prefill_seconds_per_token_ =
        prefill_seconds_per_token_ > 0 ? 0.7 * prefill_seconds_per_token_ + 0.3 * per_token : per_token;
  }
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
  for (Request* r : order) SampleReady(*r, reached);
  work_.sample_seconds += Now() - t1;
  return true;
}

void Scheduler::SampleReady(Request& r, const std::vector<Sample*>& reached) {
  if (!reached.empty() && !CompressAtBase(r, reached)) return;
  if (!r.samples[0].forked) return;
  // Samples waiting for sample 0's prompt fork first (they sample from
  // the same logits).
  const Sample& s0 = r.samples[0];
  if (s0.session != nullptr && s0.pending.empty() && s0.generated.empty() && !ForkSiblings(r)) return;
  std::vector<Sample*> ready;
  for (Sample& s : r.samples) {
    if (s.session != nullptr && !s.finished && s.pending.empty()) ready.push_back(&s);
  }
  for (Sample* s : ready) AfterStep(r, *s);
}

bool Scheduler::CompressesAtBase(const Request& r) const { return compress_once_ && r.req.compress; }

// Compresses each of r's samples in `reached` (KVManager::Compress). A
// policy may need pages (private copies of pages shared with the prefix
// cache, compaction): when the pool cannot give them, MakeRoom (which may
// preempt this request; a policy leaves a consistent sequence when it fails
// half-way) and retry. False when the request left the running set.
bool Scheduler::CompressAtBase(Request& r, const std::vector<Sample*>& reached) {
  for (Sample& s : r.samples) {
    if (std::find(reached.begin(), reached.end(), &s) == reached.end()) continue;
    if (s.session == nullptr) return false;  // preempted earlier in this step's aftermath
    for (;;) {
      const Status st = s.session->Compress();
      if (st.ok()) {
        work_.compressions++;
        KeepCompressed(r, s);
        break;
      }
      Request* victim = nullptr;
      if (st.code() == StatusCode::kResourceExhausted && MakeRoom(block_bytes_, &victim)) {
        if (victim == &r) return false;
        continue;
      }
      FailRequest(r, FinishReason::kError, st.WithContext("compressing the KV after the prompt"));
      return false;
    }
  }
  return true;
}

// Forks samples 1..n-1 from sample 0 once its prompt is in the KV. When the
// partial page's copy does not fit: MakeRoom (maybe preempting this
// request) and retry. False when the request left the running set.
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
      Request* victim = nullptr;
      if (fork.status().code() != StatusCode::kResourceExhausted || !MakeRoom(block_bytes_, &victim)) {
        FailRequest(r, FinishReason::kError, fork.status());
        return false;
      }
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
    if (normal) WriteThrough(r, s.session->id());
    if (normal && s.index == 0 && !r.req.save_session.empty()) {
      // Not yet in the KV: the last sampled token.
      KeepSession({r.req.tenant_salt, r.req.save_session},
                  SessionEntry{s.session->Detach(), {s.generated.back()}, 0, nullptr});
    } else if (normal && Caches(r)) {
      CacheSequence(s.session->Detach());
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
      if ((*it)->tier_load) (*it)->tier_load->Cancel();  // the I/O thread stops at its next block
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

}  // namespace kvx::engine
