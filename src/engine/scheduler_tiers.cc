// The scheduler's use of the KV tiers (kv/tier/tier_store.h): lookups while
// a request waits in the queue, the import of what they found into the pool
// and the prefix cache, and write-through of sequences leaving a request.
// No step waits on I/O: lookups run on the store's I/O thread, and a
// request waiting for one is passed by admission like a request waiting for
// an in-flight prefix.
#include <algorithm>

#include "engine/scheduler.h"
#include "engine/scheduler_request.h"

namespace kvx::engine {
namespace {

// Whether a request still waits for its lookup in flight (`load`); once it
// is done, `import` takes it and it is dropped.
template <class Import>
bool AwaitsLoad(std::shared_ptr<kv::tier::PendingLoad>& load, Import import) {
  if (!load) return false;
  if (!load->done()) return true;
  import();
  load.reset();
  return false;
}

}  // namespace

bool Scheduler::Caches(const Request& r) const {
  return cache_ != nullptr && r.req.cache != CacheMode::kNone && r.req.chunks == nullptr;
}

// What a lookup covers: the prompt, or for a preempted request (swap-in
// through the tiers its preemption wrote to) everything it holds.
std::vector<int32_t> Scheduler::LookupTokens(const Request& r) const {
  return r.started ? r.Full(r.samples[0]) : r.req.prompt;
}

bool Scheduler::WaitsForTiers(Request& r) {
  if (r.req.chunks != nullptr) return WaitsForChunks(r);
  if (!tiers_ || !Caches(r) || !r.req.resume_session.empty()) return false;
  // A request preempted by recompute looks its sequence up again (n = 1;
  // with samples it recomputes); one preempted by swap has it in host RAM.
  if (r.started && (r.req.n != 1 || r.samples[0].swapped)) return false;
  if (AwaitsLoad(r.tier_load, [&] { ImportTierLoad(r); })) return true;
  if (r.tiers_asked) return false;
  r.tiers_asked = true;
  // What admission's lookup may match: all but the last token.
  const std::vector<int32_t> tokens = LookupTokens(r);
  const int limit = static_cast<int>(tokens.size()) - 1, B = tiers_->block_tokens();
  if (limit / B == 0) return false;
  const kv::RadixCache::Match in_pool = cache_->Lookup(r.req.tenant_salt, tokens, limit);
  if (in_pool.tokens >= limit / B * B) return false;  // the pool holds every tier block already
  kv::tier::LookupRequest q;
  q.salt = r.req.tenant_salt;
  q.tokens.assign(tokens.begin(), tokens.begin() + limit);
  q.after_writes = r.started;  // behind the writes of its own preemption
  q.first_block = in_pool.tokens / B;  // what the pool holds is not read again
  q.max_blocks = limit / B;
  q.recompute_seconds_per_token = PrefillSecondsPerToken();
  r.tier_load = tiers_->Lookup(std::move(q));
  return true;
}

// Imports the blocks a lookup found beyond what the pool holds: one new
// sequence over the radix cache's holder of the blocks the lookup skipped
// (their pages shared, the loaded blocks' pages copied from the decoded
// blocks; ImportSequence with a SharedPrefix), which the prefix cache takes
// as the holder of the blocks it lacks. When the pool gave the skipped
// blocks up meanwhile, or cannot hold the new ones even after evicting
// cached pages, the request recomputes.
void Scheduler::ImportTierLoad(Request& r) {
  kv::tier::TierLoad& load = r.tier_load->result();
  if (load.blocks.empty()) return;
  const int B = tiers_->block_tokens();
  const int skipped = load.first_block * B, tokens = skipped + static_cast<int>(load.blocks.size()) * B;
  const std::vector<int32_t> want = LookupTokens(r);
  const kv::RadixCache::Match in_pool = cache_->Lookup(r.req.tenant_salt, want, tokens);
  if (in_pool.tokens >= tokens) return;  // another request brought them meanwhile
  if (in_pool.tokens < skipped) return;  // the blocks the load skipped left the pool
  Result<kv::KVManager::SequenceImage> image = kv::tier::LoadImage(load, want, tiers_->space(), r.req.tenant_salt);
  if (!image.ok()) return;
  kv::KVManager& m = engine_.kv_manager();
  // (The holder is asked again after an eviction, which may replace it.)
  auto import = [&] {
    return m.ImportSequence(*image, {skipped > 0 ? cache_->HolderOf(in_pool) : -1, skipped});
  };
  if (skipped > 0) cache_->Lock(in_pool.deepest);  // the shared prefix stays while room is made
  Result<kv::SeqId> seq = import();
  if (!seq.ok() && seq.status().code() == StatusCode::kResourceExhausted &&
      cache_->Evict(KvBytesFor(tokens) - KvBytesFor(skipped)) > 0) {
    seq = import();
  }
  if (skipped > 0) cache_->Unlock(in_pool.deepest);
  if (!seq.ok()) return;
  cache_->Insert(*seq);
  r.tier_tokens.assign(tiers_->num_tiers(), 0);
  for (size_t i = 0; i < load.blocks.size(); ++i) {
    const int b = load.first_block + static_cast<int>(i);
    const int from = std::max(b * B, in_pool.tokens), to = (b + 1) * B;
    if (to > from) r.tier_tokens[load.tier_of_block[i]] += to - from;
  }
  if (r.started) work_.swapped_in_tokens += static_cast<uint64_t>(tokens - in_pool.tokens);
}

bool Scheduler::WaitsForChunks(Request& r) {
  if (!tiers_ || chunker_ == nullptr || r.req.cache == CacheMode::kNone) return false;
  if (AwaitsLoad(r.tier_load, [&] { ImportChunkLoad(r); })) return true;
  if (r.tiers_asked) return false;
  r.tiers_asked = true;
  kv::tier::LookupRequest q;
  q.salt = r.req.tenant_salt;
  for (const std::vector<int32_t>& chunk : r.req.chunks->chunks) {
    if (chunk.empty() || chunk.size() > static_cast<size_t>(kv::tier::kMaxBlockTokens)) continue;
    if (!chunker_->cache().Holds(chunker_->Key(q.salt, chunk), chunk)) q.chunks.push_back(chunk);
  }
  if (q.chunks.empty()) return false;
  r.tier_load = tiers_->Lookup(std::move(q));
  return true;
}

// Each chunk found goes into the chunk cache as the image ImportSequence
// takes (LoadImage of block 0 of its ChunkSpace), which copies its pages.
void Scheduler::ImportChunkLoad(Request& r) {
  kv::tier::TierLoad& load = r.tier_load->result();
  const uint64_t salt = r.req.tenant_salt;
  for (std::optional<kv::tier::ParsedBlock>& chunk : load.chunks) {
    if (!chunk) continue;
    kv::tier::TierLoad one;
    one.blocks.push_back(std::move(*chunk));
    const std::vector<int32_t>& tokens = one.blocks[0].tokens;
    Result<kv::tier::BlockSpace> space = kv::tier::ChunkSpace(tiers_->space(), static_cast<int>(tokens.size()));
    if (!space.ok()) continue;
    Result<kv::KVManager::SequenceImage> image = kv::tier::LoadImage(one, tokens, *space, salt);
    if (image.ok()) chunker_->cache().Insert(chunker_->Key(salt, tokens), *image);
  }
}

void Scheduler::WriteThrough(const Request& r, kv::SeqId seq) {
  if (tiers_ && Caches(r) && !tiers_->write_back()) WriteBlocks(seq);
}

void Scheduler::WriteBlocks(kv::SeqId seq) {
  std::optional<kv::tier::BlockSnapshot> snapshot = tiers_->Snapshot(engine_.kv_manager(), seq);
  if (snapshot) tiers_->Write(std::move(*snapshot));
}

double Scheduler::PrefillSecondsPerToken() const {
  if (prefill_seconds_per_token_ > 0) return prefill_seconds_per_token_;
  return options_.prefill_tokens_per_second > 0 ? 1.0 / options_.prefill_tokens_per_second : 0;
}

}  // namespace kvx::engine
