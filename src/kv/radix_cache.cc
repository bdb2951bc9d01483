#include "kv/radix_cache.h"

#include <algorithm>
#include <string>

#include "util/check.h"

namespace kvx::kv {

RadixCache::RadixCache(KVManager* kv) : kv_(kv), page_tokens_(kv->spec().layout.page_tokens) {}

RadixCache::~RadixCache() {
  for (const Holder& h : holders_) {
    if (h.live) kv_->ReleaseSequence(h.seq);
  }
}

RadixCache::NodeId RadixCache::NewNode() {
  if (!free_nodes_.empty()) {
    const NodeId id = free_nodes_.back();
    free_nodes_.pop_back();
    nodes_[id] = Node();
    nodes_[id].live = true;
    return id;
  }
  nodes_.emplace_back();
  nodes_.back().live = true;
  return static_cast<NodeId>(nodes_.size() - 1);
}

int RadixCache::NewHolder() {
  if (!free_holders_.empty()) {
    const int id = free_holders_.back();
    free_holders_.pop_back();
    holders_[id] = Holder();
    holders_[id].live = true;
    return id;
  }
  holders_.emplace_back();
  holders_.back().live = true;
  return static_cast<int>(holders_.size() - 1);
}

int RadixCache::num_holders() const {
  return static_cast<int>(holders_.size() - free_holders_.size());
}

bool RadixCache::IsHolder(SeqId seq) const {
  for (const Holder& h : holders_) {
    if (h.live && h.seq == seq) return true;
  }
  return false;
}

std::span<const int32_t> RadixCache::BlockTokens(const Node& n) const {
  const std::vector<int32_t>& t = kv_->tokens(holders_[n.holder].seq);
  return std::span<const int32_t>(t.data() + static_cast<size_t>(n.depth) * page_tokens_, page_tokens_);
}

// A node is an eviction candidate (listed in leaves_, keyed by its tick)
// exactly when it is unlocked and childless.
void RadixCache::UpdateLeaf(NodeId id) {
  const Node& n = nodes_[id];
  // Remove under any tick it may be listed with: callers erase before
  // changing the tick (Touch), so the current tick is the listed one.
  leaves_.erase({n.tick, id});
  if (n.live && n.lock == 0 && n.children == 0) leaves_.insert({n.tick, id});
}

void RadixCache::Touch(NodeId id) {
  Node& n = nodes_[id];
  leaves_.erase({n.tick, id});
  n.tick = ++tick_;
  UpdateLeaf(id);
}

RadixCache::Match RadixCache::Lookup(uint64_t salt, std::span<const int32_t> tokens, int max_tokens) {
  Match m;
  const int max_blocks = std::min<int>(static_cast<int>(tokens.size()), max_tokens) / page_tokens_;
  uint64_t hash = salt;
  NodeId parent = kNoNode;
  std::vector<NodeId> path;
  for (int b = 0; b < max_blocks; ++b) {
    const auto block = tokens.subspan(static_cast<size_t>(b) * page_tokens_, page_tokens_);
    hash = BlockHash(hash, block);
    auto it = by_hash_.find(hash);
    if (it == by_hash_.end()) break;
    const Node& n = nodes_[it->second];
    const auto cached = BlockTokens(n);
    if (n.parent != parent || !std::equal(block.begin(), block.end(), cached.begin())) break;  // a hash collision
    parent = it->second;
    path.push_back(parent);
  }
  // Touch root-first so that a prefix is never younger than its suffix.
  for (NodeId id : path) Touch(id);
  m.blocks = static_cast<int>(path.size());
  m.tokens = m.blocks * page_tokens_;
  m.deepest = path.empty() ? kNoNode : path.back();
  return m;
}

Result<SeqId> RadixCache::ForkMatch(const Match& match) {
  KVX_CHECK(match.blocks > 0 && match.deepest != kNoNode && nodes_[match.deepest].live);
  const Node& n = nodes_[match.deepest];
  KVX_CHECK(n.depth + 1 == match.blocks);
  KVX_ASSIGN_OR_RETURN(SeqId seq, kv_->ForkPrefix(holders_[n.holder].seq, match.tokens));
  Lock(match.deepest);
  return seq;
}

SeqId RadixCache::HolderOf(const Match& match) const {
  KVX_CHECK(match.blocks > 0 && match.deepest != kNoNode && nodes_[match.deepest].live);
  return holders_[nodes_[match.deepest].holder].seq;
}

void RadixCache::Lock(NodeId node) {
  for (NodeId id = node; id != kNoNode; id = nodes_[id].parent) {
    Node& n = nodes_[id];
    n.lock++;
    UpdateLeaf(id);
  }
}

void RadixCache::Unlock(NodeId node) {
  for (NodeId id = node; id != kNoNode; id = nodes_[id].parent) {
    Node& n = nodes_[id];
    KVX_CHECK_MSG(n.lock > 0, "radix cache: unlock without a lock");
    n.lock--;
    UpdateLeaf(id);
  }
}

// Walks seq's first n_blocks blocks down the tree: the matched nodes go to
// *path (touched root-first). False when a block's hash names another
// prefix (a 64-bit collision): the path then stops before it and nothing
// more of seq may be cached.
bool RadixCache::WalkCached(SeqId seq, int n_blocks, std::vector<NodeId>* path) {
  const std::vector<uint64_t>& hashes = kv_->block_hashes(seq);
  const std::vector<int32_t>& tokens = kv_->tokens(seq);
  NodeId parent = kNoNode;
  bool ok = true;
  for (int b = 0; b < n_blocks; ++b) {
    auto it = by_hash_.find(hashes[b]);
    if (it == by_hash_.end()) break;
    const Node& n = nodes_[it->second];
    const auto cached = BlockTokens(n);
    if (n.parent != parent ||
        !std::equal(cached.begin(), cached.end(), tokens.begin() + static_cast<size_t>(b) * page_tokens_)) {
      ok = false;
      break;
    }
    parent = it->second;
    path->push_back(parent);
  }
  for (NodeId id : *path) Touch(id);
  return ok;
}

// Makes blocks [first, end) nodes owned by a new holder `holder_seq` (which
// holds exactly `end` full blocks), below `parent`. Returns the deepest.
RadixCache::NodeId RadixCache::AddRun(SeqId holder_seq, int first, int end, NodeId parent) {
  const std::vector<uint64_t>& hashes = kv_->block_hashes(holder_seq);
  const int h = NewHolder();
  holders_[h].seq = holder_seq;
  holders_[h].start = first;
  holders_[h].end = end;
  for (int b = first; b < end; ++b) {
    const NodeId id = NewNode();
    Node& n = nodes_[id];
    n.hash = hashes[b];
    n.parent = parent;
    n.depth = b;
    n.holder = h;
    by_hash_[n.hash] = id;
    if (parent != kNoNode) {
      nodes_[parent].children++;
      UpdateLeaf(parent);
    }
    Touch(id);
    parent = id;
  }
  return parent;
}

int RadixCache::Insert(SeqId seq) {
  if (kv_->entries_removed(seq)) {  // its pages no longer hold its tokens
    kv_->ReleaseSequence(seq);
    return 0;
  }
  const int n_blocks = static_cast<int>(kv_->block_hashes(seq).size());
  std::vector<NodeId> path;
  const int b = WalkCached(seq, n_blocks, &path) ? static_cast<int>(path.size()) : n_blocks;
  if (b == n_blocks) {  // nothing new (or a collision: cache nothing more)
    kv_->ReleaseSequence(seq);
    return 0;
  }
  // Keep only the full blocks (at a page boundary ForkPrefix copies nothing).
  SeqId holder_seq = seq;
  if (kv_->length(seq) != n_blocks * page_tokens_) {
    Result<SeqId> cut = kv_->ForkPrefix(seq, n_blocks * page_tokens_);
    kv_->ReleaseSequence(seq);
    if (!cut.ok()) return 0;  // cannot happen at a page boundary; caching is optional anyway
    holder_seq = *cut;
  }
  AddRun(holder_seq, b, n_blocks, path.empty() ? kNoNode : path.back());
  return n_blocks - b;
}

RadixCache::NodeId RadixCache::InsertPrefix(SeqId seq, int blocks) {
  if (kv_->entries_removed(seq)) return kNoNode;  // its pages no longer hold its tokens
  const int n_blocks = std::min<int>(blocks, static_cast<int>(kv_->block_hashes(seq).size()));
  std::vector<NodeId> path;
  const bool ok = WalkCached(seq, n_blocks, &path);
  const NodeId cached = path.empty() ? kNoNode : path.back();
  const int b = static_cast<int>(path.size());
  if (!ok || b == n_blocks) return cached;
  // A holder of its own: seq keeps growing (and is released by its owner).
  Result<SeqId> cut = kv_->ForkPrefix(seq, n_blocks * page_tokens_);
  if (!cut.ok()) return cached;  // cannot happen at a page boundary; caching is optional anyway
  return AddRun(*cut, b, n_blocks, cached);
}

void RadixCache::RemoveLeaf(NodeId id) {
  Node& n = nodes_[id];
  KVX_CHECK(n.live && n.children == 0 && n.lock == 0);
  leaves_.erase({n.tick, id});
  by_hash_.erase(n.hash);
  Holder& h = holders_[n.holder];
  KVX_CHECK(h.end == n.depth + 1);  // a leaf is its holder's last block
  if (on_evict_) on_evict_(h.seq);
  h.end--;
  if (h.end == h.start) {
    kv_->ReleaseSequence(h.seq);
    h.live = false;
    free_holders_.push_back(n.holder);
  } else {
    Result<SeqId> cut = kv_->ForkPrefix(h.seq, h.end * page_tokens_);
    KVX_CHECK_MSG(cut.ok(), "a prefix fork at a page boundary allocates nothing");
    kv_->ReleaseSequence(h.seq);
    h.seq = *cut;
  }
  if (n.parent != kNoNode) {
    nodes_[n.parent].children--;
    UpdateLeaf(n.parent);
  }
  n.live = false;
  free_nodes_.push_back(id);
  ++evicted_blocks_;
}

std::vector<SeqId> RadixCache::Holders() const {
  std::vector<SeqId> out;
  for (const Holder& h : holders_) {
    if (h.live) out.push_back(h.seq);
  }
  return out;
}

bool RadixCache::EvictOne() {
  if (leaves_.empty()) return false;
  RemoveLeaf(leaves_.begin()->second);
  return true;
}

uint64_t RadixCache::Evict(uint64_t bytes) {
  const uint64_t before = kv_->BytesInUse();
  while (before - std::min(before, kv_->BytesInUse()) < bytes && EvictOne()) {
  }
  const uint64_t after = kv_->BytesInUse();
  return before > after ? before - after : 0;
}

void RadixCache::Clear() {
  while (EvictOne()) {
  }
}

uint64_t RadixCache::EvictableBytes() const {
  // Pages whose every reference is a holder's (a locked node's pages are
  // also referenced by the running sequence that locked it).
  std::unordered_map<PageId, int32_t> refs;
  for (const Holder& h : holders_) {
    if (h.live) kv_->kv(h.seq).ForEachPage([&](PageId p) { ++refs[p]; });
  }
  uint64_t bytes = 0;
  for (const auto& [p, n] : refs) {
    if (kv_->pool().RefCount(p) == n) bytes += kv_->pool().PageBytesOf(p);
  }
  return bytes;
}

Status RadixCache::CheckInvariants() const {
  std::vector<int> children(nodes_.size(), 0);
  size_t listed = 0;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    if (!n.live) continue;
    const std::string name = "radix node " + std::to_string(i);
    if (n.lock < 0) return Internal(name + ": negative lock count");
    if (n.parent != kNoNode) {
      const Node& p = nodes_[n.parent];
      if (!p.live) return Internal(name + ": parent is not live");
      if (p.depth + 1 != n.depth) return Internal(name + ": depth is not its parent's + 1");
      if (p.lock < n.lock) return Internal(name + ": locked more often than its parent");
      children[n.parent]++;
    } else if (n.depth != 0) {
      return Internal(name + ": root child at depth " + std::to_string(n.depth));
    }
    if (n.holder < 0 || n.holder >= static_cast<int>(holders_.size()) || !holders_[n.holder].live) {
      return Internal(name + ": no live holder");
    }
    const Holder& h = holders_[n.holder];
    if (n.depth < h.start || n.depth >= h.end) return Internal(name + ": outside its holder's run");
    if (!kv_->HasSequence(h.seq)) return Internal(name + ": holder sequence is gone");
    const auto& hashes = kv_->block_hashes(h.seq);
    if (static_cast<int>(hashes.size()) < h.end || hashes[n.depth] != n.hash) {
      return Internal(name + ": holder's block hash differs");
    }
    auto it = by_hash_.find(n.hash);
    if (it == by_hash_.end() || it->second != static_cast<NodeId>(i)) return Internal(name + ": not indexed by its hash");
    const bool leaf = n.lock == 0 && n.children == 0;
    if (leaf != (leaves_.count({n.tick, static_cast<NodeId>(i)}) == 1)) {
      return Internal(name + ": eviction list disagrees with lock/children");
    }
    listed += leaf;
  }
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].live && nodes_[i].children != children[i]) {
      return Internal("radix node " + std::to_string(i) + ": child count " + std::to_string(nodes_[i].children) +
                      ", has " + std::to_string(children[i]));
    }
  }
  if (listed != leaves_.size()) return Internal("eviction list holds nodes that are not unlocked leaves");
  if (by_hash_.size() != static_cast<size_t>(num_blocks())) return Internal("hash index size differs from nodes");
  for (const Holder& h : holders_) {
    if (!h.live) continue;
    if (kv_->length(h.seq) != h.end * page_tokens_) return Internal("holder sequence is longer than its blocks");
    if (h.start >= h.end) return Internal("holder owns no block");
  }
  return Status::Ok();
}

}  // namespace kvx::kv
