// RadixCache: a prefix cache over FULL token blocks (page_tokens tokens, one
// page per (layer, kv head) each) of a KVManager's sequences, keyed by the
// manager's chained block hashes (hash_b = XXH3(tokens of block b, seed =
// hash_{b-1}), hash_{-1} = the tenant's salt: equal hash = equal token
// prefix of the same tenant; tenants never share an entry).
//
// The tree. Node = one block; its parent is the block before it; the root's
// children are first blocks. Since a chained hash names the whole prefix, the
// nodes live in one hash map (hash -> node) and a lookup walks it block by
// block (checking the parent and the block's tokens too, so a 64-bit hash
// collision can never hand out wrong pages). The tree is SGLang's radix
// cache with edges of exactly one page (vLLM's block-hash map), so a match
// is always whole pages that can be shared by refcount.
//
// Who holds the pages. The cache keeps HOLDER sequences in the manager: when
// a finished (or preempted) sequence is inserted, its blocks not yet cached
// become nodes owned by that sequence, truncated to its full blocks; the
// blocks it shares with the tree were forked from it and are the same pages
// (refcount). A sequence still running can share its committed blocks
// (InsertPrefix): a fork of it at that block boundary becomes their holder. A holder owns a contiguous run of depths [start, end) on its
// path. Reusing a prefix is KVManager::ForkPrefix(holder of the deepest
// matched node, depth * page_tokens): pages shared, nothing copied.
//
// Lock refs: a running sequence forked from the cache locks its matched path
// (every node root..deepest, lock += 1); locked nodes are never evicted.
//
// Eviction (LRU, leaves only): lookups and inserts touch every node of their
// path; Evict() removes the unlocked LEAF touched least recently, so a
// suffix always goes before its prefix. Removing a leaf truncates its
// holder by one block (the leaf is always its holder's last block) and
// releases the holder when it owns nothing more; pages shared with running
// sequences stay until those end. The scheduler evicts before it preempts:
// cached-but-unused pages are what the pool gives up first.
//
// Sequences whose entries a policy removed are not inserted (their pages no
// longer hold the token prefix their hashes name): Insert() just releases
// them.
//
// Thread-safety: not thread-safe; the manager's thread (the scheduler's)
// calls it.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kv/kv_manager.h"
#include "util/status.h"

namespace kvx::kv {

class RadixCache {
 public:
  using NodeId = int32_t;
  static constexpr NodeId kNoNode = -1;

  // REQUIRES: `kv` outlives the cache; no step in progress during any call.
  explicit RadixCache(KVManager* kv);
  // Releases every holder sequence.
  ~RadixCache();
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;

  // The longest cached prefix of `tokens` for tenant `salt`, in whole
  // blocks, of at most max_tokens tokens. `deepest` = kNoNode when nothing
  // matched. Touches the matched path (LRU).
  struct Match {
    int blocks = 0;
    int tokens = 0;  // blocks * page_tokens
    NodeId deepest = kNoNode;
  };
  Match Lookup(uint64_t salt, std::span<const int32_t> tokens, int max_tokens);

  // A new manager sequence holding the match's tokens (pages shared with
  // the cache), its path locked; release with Unlock(match.deepest) when
  // the sequence ends. REQUIRES: match.blocks > 0, from a Lookup with no
  // Evict in between. ResourceExhausted/FailedPrecondition from
  // KVManager::ForkPrefix (nothing changed).
  Result<SeqId> ForkMatch(const Match& match);
  // The holder sequence of the match's deepest block: it holds the match's
  // tokens (and maybe more), owned by the cache — to share from
  // (KVManager::SharedPrefix), not to change; valid until the next Evict,
  // which may replace it by a shorter fork even when the node is locked.
  // REQUIRES: as ForkMatch.
  SeqId HolderOf(const Match& match) const;
  // Lock refs on root..node (a running sequence uses these pages).
  void Lock(NodeId node);
  void Unlock(NodeId node);

  // Takes ownership of sequence `seq`: caches its full blocks not yet in the
  // tree (the sequence, truncated to them, becomes their holder) and
  // releases it when it adds nothing (or a policy removed its entries).
  // Returns the number of new blocks. REQUIRES: seq is not used afterwards.
  int Insert(SeqId seq);

  // In-flight sharing: caches the first `blocks` full blocks of sequence
  // `seq`, which stays the caller's and may keep growing (a prompt still
  // prefilling, so that identical prompts waiting for it can start from its
  // blocks before it finishes). The blocks the tree lacks get a holder of
  // their own, forked from seq at that block boundary (pages shared, nothing
  // allocated). Returns the deepest node of seq's cached path, or kNoNode
  // (none, or a policy removed seq's entries); the caller locks it while
  // seq runs, so those blocks are not evicted under it.
  NodeId InsertPrefix(SeqId seq, int blocks);

  // Evicts unlocked leaves, least recently used first, until the pool's
  // bytes in use fell by `bytes` or no unlocked leaf is left. Returns the
  // bytes the pool freed (0 when the evicted pages are still held by other
  // sequences).
  uint64_t Evict(uint64_t bytes);
  // Evicts one unlocked leaf (LRU); false when there is none.
  bool EvictOne();
  // Evicts everything unlocked.
  void Clear();

  // Called with the holder sequence of every block about to be evicted,
  // while it still holds the block (write-back to the KV tiers). Not
  // called by the destructor.
  void SetEvictionObserver(std::function<void(SeqId holder)> observer) { on_evict_ = std::move(observer); }
  // The holder sequences (each holds the token prefix of its deepest block).
  std::vector<SeqId> Holders() const;

  // Bytes the pool would free if every unlocked node were evicted: the
  // pages only the cache's holders reference. O(cached pages).
  uint64_t EvictableBytes() const;

  int64_t num_blocks() const { return static_cast<int64_t>(nodes_.size()) - static_cast<int64_t>(free_nodes_.size()); }
  int num_holders() const;
  uint64_t evicted_blocks() const { return evicted_blocks_; }
  // Lock count of a node (tests).
  int lock_count(NodeId node) const { return nodes_[node].lock; }
  // Whether `seq` is one of the cache's holders.
  bool IsHolder(SeqId seq) const;

  // Tree invariants: parents and child counts consistent, holders cover
  // their nodes' tokens and hashes, locks non-negative and a locked node's
  // parent locked at least as often, the leaf set equals the unlocked
  // childless nodes. Internal error naming the first broken one.
  Status CheckInvariants() const;

 private:
  struct Node {
    uint64_t hash = 0;
    NodeId parent = kNoNode;
    int depth = 0;        // block index
    int children = 0;
    int lock = 0;
    int holder = -1;      // index into holders_
    uint64_t tick = 0;    // last touched (LRU)
    bool live = false;
  };
  struct Holder {
    SeqId seq = -1;
    int start = 0, end = 0;  // depths [start, end) of its path it owns
    bool live = false;
  };

  NodeId NewNode();
  int NewHolder();
  void Touch(NodeId node);
  void UpdateLeaf(NodeId node);
  void RemoveLeaf(NodeId node);
  bool WalkCached(SeqId seq, int n_blocks, std::vector<NodeId>* path);
  NodeId AddRun(SeqId holder_seq, int first, int end, NodeId parent);
  // Tokens of block `depth` of node's path (from its holder).
  std::span<const int32_t> BlockTokens(const Node& n) const;

  KVManager* kv_;
  int page_tokens_;
  std::vector<Node> nodes_;
  std::vector<NodeId> free_nodes_;
  std::vector<Holder> holders_;
  std::vector<int> free_holders_;
  std::unordered_map<uint64_t, NodeId> by_hash_;
  std::set<std::pair<uint64_t, NodeId>> leaves_;  // unlocked childless nodes by tick
  uint64_t tick_ = 0;
  uint64_t evicted_blocks_ = 0;
  std::function<void(SeqId)> on_evict_;
};

}  // namespace kvx::kv
