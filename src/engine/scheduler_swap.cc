// Swap preemption (engine/preemption.h): a preempted request's sequences are
// exported (KVManager::ExportSequence: pages, tokens, positions), their pages
// copied to host RAM, and the pool pages released; readmission imports them
// back (ImportSequence) byte for byte, so the request goes on exactly where
// it stopped, with nothing recomputed — for every sample of it (n > 1).
// Chosen against recompute by cost, with the copy bandwidth measured by the
// swaps themselves.
#include <algorithm>
#include <chrono>

#include "engine/scheduler.h"
#include "engine/scheduler_request.h"
#include "util/clock.h"

namespace kvx::engine {
namespace {

// The leading pages `image` shares with `anchor` (the same pool pages: a
// sample forked from its sibling's prompt), whole pages of both only.
int SharedPages(const kv::KVManager::SequenceImage& image, const kv::KVManager::SequenceImage& anchor, int page_tokens) {
  int n = static_cast<int>(std::min(image.tokens.size(), anchor.tokens.size())) / page_tokens;
  for (size_t t = 0; t < image.tables.size(); ++t) {
    int same = 0;
    while (same < n && image.tables[t].pages[same].data() == anchor.tables[t].pages[same].data()) ++same;
    n = same;
  }
  return n;
}

// `image` with its pages copied into memory of its own (the spans the export
// gave point into the pool, which the release reuses), but for its first
// `shared_pages` (left empty: ImportSequence shares them again).
std::unique_ptr<SwappedSequence> CopyOut(kv::KVManager::SequenceImage image, int shared_pages, int page_tokens) {
  auto out = std::make_unique<SwappedSequence>();
  out->shared_tokens = shared_pages * page_tokens;
  size_t pages = 0;
  for (const auto& t : image.tables) pages += t.pages.size();
  out->storage.reserve(pages);
  for (auto& t : image.tables) {
    for (size_t p = 0; p < t.pages.size(); ++p) {
      if (static_cast<int>(p) < shared_pages) {
        t.pages[p] = {};
        continue;
      }
      out->storage.emplace_back(t.pages[p].begin(), t.pages[p].end());
      t.pages[p] = out->storage.back();
      out->bytes += t.pages[p].size();
    }
  }
  out->image = std::move(image);
  return out;
}

// A moving average of the bandwidth the swaps see (their copies and the
// pool's bookkeeping), so that the cost follows this machine's load.
void Observe(double* bandwidth, uint64_t bytes, double seconds) {
  if (bytes == 0 || !(seconds > 0)) return;
  const double now = static_cast<double>(bytes) / seconds;
  *bandwidth = *bandwidth > 0 ? 0.7 * *bandwidth + 0.3 * now : now;
}

}  // namespace

uint64_t Scheduler::SwappedBytes() const {
  uint64_t n = 0;
  for (const auto& r : queue_) {
    for (const Sample& s : r->samples) n += s.swapped ? s.swapped->bytes : 0;
  }
  for (const auto& [key, e] : sessions_) n += e.swapped ? e.swapped->bytes : 0;
  return n;
}

uint64_t Scheduler::SwapSpace() const {
  return options_.swap_bytes > 0 ? options_.swap_bytes : engine_.pool().budget_bytes();
}

bool Scheduler::SwapOut(Request& r) {
  if (options_.preempt == PreemptMode::kRecompute) return false;
  kv::KVManager& m = engine_.kv_manager();
  if (!m.policies().empty()) return false;  // a policy's per-sequence state (scores, tables) is not in an image
  PreemptCost cost{.copy_bytes_per_second = copy_bytes_per_second_,
                   .prefill_seconds_per_token = PrefillSecondsPerToken()};
  for (const Sample& s : r.samples) {
    if (s.session == nullptr) continue;
    cost.tokens += s.session->n_past();
    cost.bytes += KvBytesFor(s.session->n_past());
  }
  if (cost.tokens == 0) return false;
  if (SwappedBytes() + cost.bytes > SwapSpace()) return false;
  if (options_.preempt == PreemptMode::kAuto && ChoosePreemption(cost) != PreemptKind::kSwap) return false;
  // Every sample's image first: one that cannot be exported (a codec an
  // image does not carry) leaves the request untouched, to recompute.
  const double t0 = util::MonotonicSeconds();
  std::vector<kv::KVManager::SequenceImage> images;
  for (const Sample& s : r.samples) {
    if (s.session == nullptr) continue;
    Result<kv::KVManager::SequenceImage> image = m.ExportSequence(s.session->id());
    if (!image.ok()) return false;
    images.push_back(std::move(image).value());
  }
  // Samples share their prompt's pages with the first: copied once.
  std::vector<int> shared(images.size(), 0);
  for (size_t i = 1; i < images.size(); ++i) shared[i] = SharedPages(images[i], images[0], page_tokens_);
  std::vector<std::unique_ptr<SwappedSequence>> out;
  uint64_t bytes = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    out.push_back(CopyOut(std::move(images[i]), shared[i], page_tokens_));
    bytes += out.back()->bytes;
  }
  Observe(&copy_bytes_per_second_, bytes, util::MonotonicSeconds() - t0);
  work_.swap_seconds += util::MonotonicSeconds() - t0;
  size_t i = 0;
  for (Sample& s : r.samples) {
    if (s.session != nullptr) s.swapped = std::move(out[i++]);
  }
  return true;
}

Result<kv::SeqId> Scheduler::SwapIn(const SwappedSequence& swapped, kv::SeqId anchor) {
  const double t0 = util::MonotonicSeconds();
  kv::KVManager& m = engine_.kv_manager();
  const kv::KVManager::SharedPrefix prefix{anchor, swapped.shared_tokens};
  Result<kv::SeqId> seq = m.ImportSequence(swapped.image, prefix);
  // Admission counted the cache's evictable pages as room: make it.
  if (!seq.ok() && seq.status().code() == StatusCode::kResourceExhausted && cache_ && cache_->Evict(swapped.bytes) > 0) {
    seq = m.ImportSequence(swapped.image, prefix);
  }
  if (seq.ok()) Observe(&copy_bytes_per_second_, swapped.bytes, util::MonotonicSeconds() - t0);
  work_.swap_seconds += util::MonotonicSeconds() - t0;
  return seq;
}

// Idle named sessions hold pool pages between turns; under pressure they go
// to host RAM (least recently used first) before any running request is
// preempted, and a session's next turn imports its copy (TryAdmit), byte
// for byte: the turn gives what it would have given from the pool.
bool Scheduler::SwapOutIdleSession(const SessionKey* keep) {
  kv::KVManager& m = engine_.kv_manager();
  if (!m.policies().empty()) return false;  // a policy's per-sequence state is not in an image
  auto oldest = sessions_.end();
  for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
    if (it->second.swapped || (keep != nullptr && it->first == *keep)) continue;
    if (oldest == sessions_.end() || it->second.last_used < oldest->second.last_used) oldest = it;
  }
  if (oldest == sessions_.end()) return false;
  SessionEntry& e = oldest->second;
  const double t0 = util::MonotonicSeconds();
  Result<kv::KVManager::SequenceImage> image = m.ExportSequence(e.seq);
  if (!image.ok() || SwappedBytes() + KvBytesFor(m.length(e.seq)) > SwapSpace()) return false;
  std::unique_ptr<SwappedSequence> out = CopyOut(std::move(image).value(), 0, page_tokens_);
  Observe(&copy_bytes_per_second_, out->bytes, util::MonotonicSeconds() - t0);
  work_.swap_seconds += util::MonotonicSeconds() - t0;
  m.ReleaseSequence(e.seq);
  e.seq = -1;
  e.swapped = std::move(out);
  work_.sessions_swapped_out++;
  return true;
}

const std::vector<int32_t>& Scheduler::SessionTokens(const SessionEntry& e) const {
  return e.swapped ? e.swapped->image.tokens : engine_.kv_manager().tokens(e.seq);
}

void Scheduler::ReleaseSession(const SessionEntry& e) {
  if (!e.swapped) engine_.kv_manager().ReleaseSequence(e.seq);
}

}  // namespace kvx::engine
