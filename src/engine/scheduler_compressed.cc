// The scheduler's compressed cache (engine/compressed_cache.h; scheduler.h
// says when it is used): where a request compresses, the entry it may start
// from, and the sequences it keeps.
#include <algorithm>

#include "engine/compressed_cache.h"
#include "engine/scheduler.h"
#include "engine/scheduler_request.h"

namespace kvx::engine {

int Scheduler::Moment(const Request& r) const {
  const int prompt = static_cast<int>(r.req.prompt.size());
  const int before = static_cast<int>(r.base.size()) - prompt;  // the session's tokens
  // (A resumed prompt may have lost its BOS since compress_at was checked.)
  return before + (r.req.compress_at > 0 ? std::min(r.req.compress_at, prompt) : prompt);
}

// A compress-once request hits only an entry compressed at its own moment
// holding exactly its tokens up to there; with continuous policies, the
// longest entry its tokens extend. A request that keeps its whole prompt
// under a compress-once spec (compress = false) wants uncompressed pages:
// the radix cache's, never these.
std::pair<kv::SeqId, int> Scheduler::LookupCompressed(const Request& r, const std::vector<int32_t>& tokens) {
  if (!compressed_ || !Caches(r)) return {-1, 0};
  CompressedCache::Hit hit;
  if (CompressesAtBase(r)) {
    hit = compressed_->Lookup(r.req.tenant_salt, tokens, CompressedCache::Kind::kAtMoment, Moment(r));
  } else if (!compress_once_) {
    hit = compressed_->Lookup(r.req.tenant_salt, tokens, CompressedCache::Kind::kContinuous);
  }
  return {hit.seq, hit.tokens};
}

// Only a request that named its moment leaves its compressed context: one
// compressed after its whole prompt is kept by no one's key but its own,
// which a request with the same prompt cannot use (it needs a token to
// compute). A fork that does not fit is simply not kept.
void Scheduler::KeepCompressed(const Request& r, const Sample& s) {
  if (!compressed_ || !Caches(r) || r.req.compress_at <= 0) return;
  (void)compressed_->KeepFork(s.session->id(), CompressedCache::Kind::kAtMoment);
}

// A sequence leaving a request (finished or preempted) whose tokens others
// may reuse: a continuous policy's, whose entries were removed, to the
// compressed cache; any other to the radix cache (which releases a
// compress-once policy's: its compressed context, if wanted, was kept at
// its moment).
void Scheduler::CacheSequence(kv::SeqId seq) {
  if (compressed_ && !compress_once_ && engine_.kv_manager().entries_removed(seq)) {
    compressed_->Adopt(seq, CompressedCache::Kind::kContinuous);
    return;
  }
  cache_->Insert(seq);
}

}  // namespace kvx::engine
