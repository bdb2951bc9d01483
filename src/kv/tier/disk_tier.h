// DiskTier: tier blocks in a local directory (`--cache-dir DIR`, wired by the
// next session), one file per block, `<dir>/<32 hex digits of the key>.kvxb`.
//
// Writes are atomic for readers (a temporary file renamed into place, the
// name util/output_file.h gives it): a reader in this or another process
// sees a whole block or none. Bytes at a 4 KiB-aligned address (the tier
// store's BlockEncoder) are written with O_DIRECT, past the page cache: a
// 6 MB block copied into freshly allocated cache pages cost 1-10 ms of CPU
// on the development VM, 0.4-0.7 ms this way (docs/tiers.md). Not synced,
// unlike other kvx output: a block is a cache, so a power loss may leave a
// file short or stale, which the block's checksums catch on the next read
// (dropped, recomputed, counted) — durability is not worth an fsync per
// block. The directory is the state: Open() indexes the blocks already there
// (leftover temporary files are removed), so a new process on the same
// directory hits what an earlier one wrote.
//
// Budget: at most `max_bytes` of blocks; a Put that would pass it first
// evicts the least recently used blocks. Recency is kept in memory and
// persisted as each file's modification time (a hit touches it), so the LRU
// order survives a restart: Open() sorts the files by it.
//
// Faults: a failed write (disk full, quota, I/O error, an unwritable
// directory) stops writing with one logged error and one counted error;
// further Puts are refused silently until `retry_seconds` have passed, then
// the next Put tries again (and logs "writing again" when it succeeds). A
// block larger than the whole budget is refused (counted, not logged). A read
// error is a miss; a file that vanished leaves the index.
//
// Thread-safety: thread-safe. One mutex guards the index; no file is read or
// written under it (a Put takes its budget and index entry under the lock,
// writes the temporary file without it, and renames it under the lock again
// unless an Erase, an eviction or a newer Put of the key came meanwhile; a
// Get misses while its key is being written).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "kv/tier/lru_index.h"
#include "kv/tier/tier.h"

namespace kvx::kv::tier {

struct DiskTierOptions {
  std::string dir;             // created (with its parents) if missing
  uint64_t max_bytes = 1ull << 30;  // the byte cap, >= 1
  int retry_seconds = 30;      // after a write error, Puts resume after this long
  TierLog log = StderrTierLog();
};

class DiskTier final : public Tier {
 public:
  // InvalidArgument for an empty path, a zero cap, or a path that is not a
  // directory; IoError when it cannot be created or listed.
  static Result<std::unique_ptr<DiskTier>> Open(DiskTierOptions options);

  std::string name() const override { return "disk " + options_.dir; }
  Status Put(const BlockKey& key, std::string_view bytes) override;
  std::optional<std::string> Get(const BlockKey& key) override;
  void Erase(const BlockKey& key) override;

  // The file a key's block lives in (tests, tools).
  std::string PathOf(const BlockKey& key) const;
  // Whether writes are stopped after an error (until retry_seconds pass).
  bool writes_stopped() const;

 private:
  explicit DiskTier(DiskTierOptions options) : options_(std::move(options)), index_(options_.max_bytes) {}
  // REQUIRES: mu_ held. Forgets `key` (and deletes its file when asked).
  void Remove(const BlockKey& key, bool delete_file);
  // REQUIRES: mu_ held. Evicts (deletes the files of) the least recently
  // used blocks until `incoming` more bytes fit the cap.
  void EvictFor(uint64_t incoming);
  // REQUIRES: mu_ held. The byte and block counts in stats_.
  void CountSize();

  const DiskTierOptions options_;
  mutable std::mutex mu_;
  LruIndex index_;
  // Keys whose Put is writing its file now, with the Put's ticket: an Erase
  // or eviction removes the entry, and the Put then drops its file.
  std::unordered_map<BlockKey, uint64_t, BlockKeyHash> writing_;
  uint64_t tickets_ = 0;
  bool stopped_ = false;
  std::chrono::steady_clock::time_point retry_at_;
};

}  // namespace kvx::kv::tier
