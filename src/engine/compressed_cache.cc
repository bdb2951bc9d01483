#include "engine/compressed_cache.h"

#include <algorithm>

namespace kvx::engine {

CompressedCache::CompressedCache(kv::KVManager* kv, int max_entries) : kv_(kv), max_entries_(std::max(max_entries, 1)) {}

CompressedCache::~CompressedCache() { Clear(); }

CompressedCache::Hit CompressedCache::Lookup(uint64_t salt, std::span<const int32_t> tokens, Kind kind, int moment) {
  Entry* best = nullptr;
  int best_len = 0;
  for (Entry& e : entries_) {
    if (e.kind != kind || kv_->salt(e.seq) != salt) continue;
    const std::vector<int32_t>& held = kv_->tokens(e.seq);
    const int len = static_cast<int>(held.size());
    if (len >= static_cast<int>(tokens.size()) || len <= best_len) continue;  // one token at least to compute
    if (kind == Kind::kAtMoment && len != moment) continue;
    if (!std::equal(held.begin(), held.end(), tokens.begin())) continue;
    best = &e;
    best_len = len;
  }
  if (best == nullptr) return {};
  best->tick = ++tick_;
  return Hit{best->seq, best_len};
}

bool CompressedCache::Holds(kv::SeqId seq, Kind kind) const {
  const std::vector<int32_t>& tokens = kv_->tokens(seq);
  const uint64_t salt = kv_->salt(seq);
  return std::any_of(entries_.begin(), entries_.end(), [&](const Entry& e) {
    return e.kind == kind && kv_->salt(e.seq) == salt && kv_->tokens(e.seq) == tokens;
  });
}

void CompressedCache::Add(kv::SeqId seq, Kind kind) {
  entries_.push_back(Entry{seq, kind, ++tick_});
  while (static_cast<int>(entries_.size()) > max_entries_) EvictOne();
}

Result<bool> CompressedCache::KeepFork(kv::SeqId seq, Kind kind) {
  if (Holds(seq, kind)) return false;
  KVX_ASSIGN_OR_RETURN(kv::SeqId fork, kv_->ForkPrefix(seq, kv_->length(seq)));
  Add(fork, kind);
  return true;
}

bool CompressedCache::Adopt(kv::SeqId seq, Kind kind) {
  if (Holds(seq, kind)) {
    kv_->ReleaseSequence(seq);
    return false;
  }
  Add(seq, kind);
  return true;
}

bool CompressedCache::EvictOne() {
  if (entries_.empty()) return false;
  auto oldest = std::min_element(entries_.begin(), entries_.end(),
                                 [](const Entry& a, const Entry& b) { return a.tick < b.tick; });
  kv_->ReleaseSequence(oldest->seq);
  entries_.erase(oldest);
  return true;
}

int CompressedCache::Clear() {
  const int n = size();
  for (const Entry& e : entries_) kv_->ReleaseSequence(e.seq);
  entries_.clear();
  return n;
}

}  // namespace kvx::engine
