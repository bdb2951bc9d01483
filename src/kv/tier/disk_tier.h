// DiskTier: tier blocks in a local directory (`--cache-dir DIR`, wired by the
// next session), one file per block, `<dir>/<32 hex digits of the key>.kvxb`.
//
// Writes are atomic (util/output_file.h: temporary file + rename, synced): a reader, or
// the tier after a crash, sees a whole block or none; the block format's
// checksums catch what a power loss may still damage. The directory is the
// state: Open() indexes the blocks already there (leftover temporary files
// are removed), so a new process on the same directory hits what an earlier
// one wrote.
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
// Thread-safety: thread-safe (one mutex; file I/O happens under it).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

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
  bool stopped_ = false;
  std::chrono::steady_clock::time_point retry_at_;
};

}  // namespace kvx::kv::tier
