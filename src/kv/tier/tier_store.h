// TierStore: the tiers below the KV pool chained in order — host RAM, local
// disk, Redis (any of them may be absent) — and the one I/O thread that
// reads and writes them, so that no scheduler step ever waits on I/O.
//
// Lookup (asynchronous): the I/O thread walks a prompt's full blocks from
// the first the pool lacks (blocks before it are not read), takes each from the first tier that has it (checked by
// DecodeBlock: a damaged value is dropped from its tier and the next tier
// is asked; a value of another model, spec, tenant or prompt is a miss),
// and stops at the first block no tier has. Blocks found in a lower tier are
// copied up (promotion) after the load. A load that falls behind
// recomputing — the blocks loaded so far took longer than the caller's
// measured prefill speed would have needed for them — stops there
// (`abandoned`): the caller recomputes the rest, so a tier never makes time
// to first token worse than a miss by more than the block in flight.
//
// Write-through (asynchronous): Snapshot copies the pages of the full,
// final blocks of a sequence that no tier is known to hold (the copy is the
// only work on the caller's thread); the I/O thread encodes them and puts
// them in every tier. Writes wait behind loads — a lookup queued while a
// snapshot is being written is served at the next block, not after the
// snapshot's last (a long sequence is many blocks) —, and a queue already holding
// `max_pending_write_bytes` drops the snapshot (counted): memory stays
// bounded and the caller never waits.
//
// Thread-safety: every method may be called from any thread. The tiers are
// used by the I/O thread only (and their stats() from anywhere).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kv/chunk_cache.h"
#include "kv/kv_manager.h"
#include "kv/tier/block_format.h"
#include "kv/tier/block_key.h"
#include "kv/tier/tier.h"

namespace kvx::kv::tier {

struct TierStoreOptions {
  BlockEncodeOptions encode;
  // The storage level of each tier (lookup order; docs/tiers.md#the-storage-codec):
  // what it writes, and the least faithful level it serves (a lossier block
  // found in it is a miss). Empty: encode.level for every tier.
  std::vector<StorageLevel> tier_levels;
  // Snapshots waiting to be written hold at most this many page bytes; a
  // snapshot beyond is dropped (counted in writes_dropped).
  uint64_t max_pending_write_bytes = 256ull << 20;
  // Keys remembered as stored, with the tiers that hold each (so a block is
  // written once): a key leaves when every tier that held it gave it up
  // (evicted, dropped as corrupt). Redis evicts without telling, so as a
  // backstop the record is cleared when it grows past this many.
  size_t max_known_keys = 1u << 20;
  // When blocks are written: through (every full, final block of a sequence
  // that finishes or is preempted) or back (when the prefix cache evicts
  // them, and what it still holds when it shuts down). Read by the user
  // (the scheduler); the store writes what it is given either way.
  bool write_back = false;
};

// What a lookup found: blocks first_block..first_block+n-1 of the prompt.
struct TierLoad {
  int first_block = 0;  // LookupRequest::first_block
  std::vector<ParsedBlock> blocks;
  std::vector<int> tier_of_block;  // per block: the index of the tier it came from
  bool abandoned = false;          // stopped because loading fell behind recomputing
  double seconds = 0;              // the load's wall time
  // A chunk lookup's (LookupRequest::chunks): per chunk asked, its block
  // (block 0 of its ChunkSpace, checked by DecodeBlock) or nothing, and the
  // tier it came from (-1: none).
  std::vector<std::optional<ParsedBlock>> chunks;
  std::vector<int> tier_of_chunk;
};

// A lookup in flight, shared by the I/O thread and the caller.
class PendingLoad {
 public:
  bool done() const { return done_.load(std::memory_order_acquire); }
  // The caller no longer wants it: the I/O thread stops at the next block.
  void Cancel() { cancelled_.store(true, std::memory_order_relaxed); }
  // REQUIRES: done().
  TierLoad& result() { return result_; }

 private:
  friend class TierStore;
  std::atomic<bool> done_{false}, cancelled_{false};
  TierLoad result_;
};

struct LookupRequest {
  uint64_t salt = 0;
  std::vector<int32_t> tokens;  // the prompt (blocks are looked up within it)
  // Blocks first_block..max_blocks-1 are loaded: the caller's pool holds
  // the blocks before first_block (they are not read).
  int first_block = 0;
  int max_blocks = 0;
  // The caller's measured prefill cost; the load is abandoned once it is
  // slower than recomputing what it loaded. 0: no deadline.
  double recompute_seconds_per_token = 0;
  // Served in order with the writes queued before it (a preempted
  // request's lookup of the blocks its preemption just wrote), not ahead
  // of them.
  bool after_writes = false;
  // A chunk lookup instead (chunk reuse, kv/chunk_cache.h): each of these
  // chunks (1..kMaxBlockTokens tokens) from the first tier that holds it;
  // `tokens` and the block fields are not used.
  std::vector<std::vector<int32_t>> chunks;
};

// The pages of the blocks of one sequence to write (Snapshot): a sequence
// image truncated to the last of them, holding copies of their pages only.
struct BlockSnapshot {
  uint64_t salt = 0;
  KVManager::SequenceImage image;
  std::vector<std::vector<uint8_t>> storage;  // owns the pages `image` points to
  std::vector<int> blocks;                    // block indices to write
  std::vector<BlockKey> keys;                 // their keys
  uint64_t bytes = 0;                         // page bytes copied
};

// One tier's counters as the store saw them.
struct TierMetrics {
  std::string name;          // Tier::name()
  TierStats stats;           // the tier's own
  uint64_t hit_blocks = 0;   // blocks lookups took from it
  std::vector<double> load_bounds;     // load latency buckets (seconds, Prometheus style)
  std::vector<uint64_t> load_counts;   // load_bounds.size() + 1, not cumulative
  double load_seconds = 0;
  uint64_t loads = 0;
};

struct TierStoreCounters {
  uint64_t lookups = 0, abandoned = 0, corrupt_blocks = 0;
  uint64_t blocks_written = 0, writes_dropped = 0, write_errors = 0;
  // The I/O thread's CPU time so far (encoding, checksums, file and socket
  // calls): what the tiers take from decode on a machine with few cores,
  // a figure load on other cores does not inflate as it does wall time.
  double io_cpu_seconds = 0;
};

// The image ImportSequence takes for a load (tokens 0..end of its last
// block), over a prefix the pool holds: the load's blocks give their pages
// and positions, the first `load.first_block` blocks are left empty — the
// import shares them from the pool's sequence holding them
// (KVManager::SharedPrefix, which reads nothing of the image there).
// `tokens`: the prompt the lookup asked for. The one block-level import:
// tools that decoded blocks 0..n-1 themselves pass them as a load from
// block 0. InvalidArgument when the blocks are not consecutive blocks from
// first_block of these tokens (each block's own tokens are compared), of
// this space's model and spec, for this tenant, or `tokens` is shorter.
Result<KVManager::SequenceImage> LoadImage(const TierLoad& load, std::span<const int32_t> tokens,
                                           const BlockSpace& space, uint64_t salt);

class TierStore {
 public:
  // `tiers` in lookup order (fastest first). InvalidArgument when there is
  // none or one is null.
  static Result<std::unique_ptr<TierStore>> Create(BlockSpace space, std::vector<std::unique_ptr<Tier>> tiers,
                                                   TierStoreOptions options = {});
  // Finishes the queued writes (a process that exits keeps what it
  // computed), drops queued lookups, stops the thread.
  ~TierStore();
  TierStore(const TierStore&) = delete;
  TierStore& operator=(const TierStore&) = delete;

  const BlockSpace& space() const { return space_; }
  int block_tokens() const { return space_.block_tokens; }
  size_t num_tiers() const { return tiers_.size(); }
  // The short kind of tier i ("ram", "disk", "redis"): metric labels, usage.
  const std::string& tier_kind(size_t i) const { return kinds_[i]; }
  bool write_back() const { return options_.write_back; }

  // Starts a lookup on the I/O thread.
  std::shared_ptr<PendingLoad> Lookup(LookupRequest request);
  // Called on the I/O thread after each lookup completes (e.g. to wake the
  // scheduler). Set it before the first Lookup, or to {} before the callee
  // goes away.
  void SetOnLoad(std::function<void()> on_load);

  // The full, final blocks of sequence `seq` of `m` that no tier is known to
  // hold, with their pages copied; nullopt when there is none (or the
  // sequence cannot be stored: entries removed, a codec the block format
  // does not carry). REQUIRES: the caller owns `m` now (no step running).
  std::optional<BlockSnapshot> Snapshot(const KVManager& m, SeqId seq);
  // Queues a snapshot for encoding and writing to every tier.
  void Write(BlockSnapshot snapshot);
  // Queues chunk `image` (a chunk's KV computed alone: KVManager's export of
  // it, its pages copied here) for tenant `salt`, written to every tier as
  // block 0 of its ChunkSpace at the lossless level (a chunk's last page is
  // partial, which the storage codec does not code). No-op for a chunk
  // beyond kMaxBlockTokens tokens.
  void WriteChunk(uint64_t salt, const KVManager::SequenceImage& image);
  // Pins (on) or unpins the full blocks of `tokens` for tenant `salt` in the
  // host-RAM tier ("cache": "pin" / "unpin"), on the I/O thread after the
  // writes queued before it; a pinned block the RAM tier lacks is copied up
  // from the first lower tier that has it. A key names the tenant, so one
  // tenant's pins are never another's. No-op without a host-RAM tier.
  void Pin(uint64_t salt, std::vector<int32_t> tokens, bool on);
  // The host-RAM tier's byte budget, the most a pin can hold (0: none).
  uint64_t pin_capacity() const;
  // Whether some tier is known to hold (or is writing) `key` (tests).
  bool Known(const BlockKey& key) const;
  // Blocks until every queued lookup and write is done (tests, tools).
  void Flush();

  std::vector<TierMetrics> Metrics() const;
  TierStoreCounters counters() const;

 private:
  struct WriteJob {
    std::optional<BlockSnapshot> snapshot;  // encode, then put in every tier
    std::vector<EncodedBlock> encoded;      // promotions: encoded[i] is put in the tiers of bit mask put_in[i]
    std::vector<uint32_t> put_in;
    uint64_t bytes = 0;
    std::shared_ptr<PendingLoad> load;      // or a lookup behind the writes (`lookup`)
    LookupRequest lookup;
    std::optional<bool> pin;                // or a pin (true) / unpin of `lookup`'s tokens
    std::optional<OwnedSequenceImage> chunk;  // or a chunk (WriteChunk) of tenant `lookup.salt`
  };
  TierStore(BlockSpace space, std::vector<std::unique_ptr<Tier>> tiers, TierStoreOptions options);
  void Loop();
  void RunLookup(const LookupRequest& request, PendingLoad& load);
  void RunChunkLookup(const LookupRequest& request, PendingLoad& load);
  // Block `request` from tier t, checked (DecodeBlock); a damaged value is
  // dropped from the tier and counted, another block or version is a miss
  // left in place. The stored bytes go to *bytes when found.
  std::optional<ParsedBlock> GetBlock(size_t t, const BlockRequest& request, std::string* bytes);
  // REQUIRES: mu_ held (unlocked while the lookup runs).
  void ServeLookup(const LookupRequest& request, const std::shared_ptr<PendingLoad>& load,
                   std::unique_lock<std::mutex>& lock);
  void RunWrite(WriteJob& job);
  void RunChunkWrite(const WriteJob& job);
  // A write of `key` is over: the tiers of bit mask `held` took it.
  void Stored(const BlockKey& key, uint32_t held);
  // Serves the lookups queued now (between the blocks of a write).
  void ServeQueuedLookups();
  void RunPin(const LookupRequest& what, bool on);
  // The record of which tiers hold a key: bit t for tier t, kWriting while
  // a write of it is queued; a key with no bit left is forgotten.
  static constexpr uint32_t kWriting = 1u << 31;
  void Mark(const BlockKey& key, uint32_t set, uint32_t clear);
  void RecordLoad(size_t tier, double seconds, bool hit);
  StorageLevel level(size_t tier) const { return levels_[tier]; }

  const BlockSpace space_;
  std::vector<std::unique_ptr<Tier>> tiers_;
  std::vector<std::string> kinds_;
  const TierStoreOptions options_;
  std::vector<StorageLevel> levels_;  // per tier
  BlockEncoder encoder_;              // the I/O thread's: its memory is reused block after block

  mutable std::mutex mu_;  // the queues, the counters, the metrics
  std::condition_variable wake_, idle_;
  std::deque<std::pair<LookupRequest, std::shared_ptr<PendingLoad>>> lookups_;
  std::deque<WriteJob> writes_;
  uint64_t pending_write_bytes_ = 0;
  bool busy_ = false, stopping_ = false;
  std::function<void()> on_load_;
  TierStoreCounters counters_;
  std::vector<TierMetrics> metrics_;  // stats filled at Metrics()

  mutable std::mutex known_mu_;
  std::unordered_map<BlockKey, uint32_t, BlockKeyHash> known_;

  std::thread thread_;
};

}  // namespace kvx::kv::tier
