#include "kv/tier/disk_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "util/aligned_buffer.h"
#include "util/output_file.h"

namespace kvx::kv::tier {
namespace fs = std::filesystem;
namespace {
constexpr std::string_view kExtension = ".kvxb";
}  // namespace

Result<std::unique_ptr<DiskTier>> DiskTier::Open(DiskTierOptions options) {
  if (options.dir.empty()) return InvalidArgument("the disk tier needs a directory (--cache-dir DIR)");
  if (options.max_bytes == 0) return InvalidArgument("the disk tier's byte cap must be at least 1 byte");
  if (!options.log) options.log = StderrTierLog();
  std::error_code ec;
  if (fs::exists(options.dir, ec) && !fs::is_directory(options.dir, ec)) {
    return InvalidArgument("the cache directory " + options.dir + " exists but is not a directory");
  }
  fs::create_directories(options.dir, ec);
  if (!fs::is_directory(options.dir)) {
    return IoError("cannot create the cache directory " + options.dir + ": " + (ec ? ec.message() : "unknown error"));
  }
  std::unique_ptr<DiskTier> t(new DiskTier(std::move(options)));
  struct Found {
    BlockKey key;
    uint64_t bytes;
    fs::file_time_type mtime;
  };
  std::vector<Found> found;
  for (fs::directory_iterator it(t->options_.dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string file = it->path().filename().string();
    if (IsAtomicWriteTemporary(file)) {  // a crash between write and rename
      fs::remove(it->path(), ec);
      ec.clear();
      continue;
    }
    if (file.size() != 32 + kExtension.size() || !file.ends_with(kExtension) || !it->is_regular_file(ec)) continue;
    const std::optional<BlockKey> key = BlockKey::FromHex(std::string_view(file).substr(0, 32));
    if (!key) continue;
    const uint64_t bytes = it->file_size(ec);
    const fs::file_time_type mtime = it->last_write_time(ec);
    if (ec) continue;  // vanished while we listed: not ours to count
    found.push_back({*key, bytes, mtime});
  }
  if (ec) return IoError("cannot list the cache directory " + t->options_.dir + ": " + ec.message());
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.mtime < b.mtime; });
  std::lock_guard<std::mutex> lock(t->mu_);
  for (const Found& f : found) t->index_.Add(f.key, f.bytes);  // oldest first, so the newest ends most recent
  t->EvictFor(0);  // a smaller cap than last time
  t->CountSize();
  return t;
}

std::string DiskTier::PathOf(const BlockKey& key) const {
  return options_.dir + "/" + key.Hex() + std::string(kExtension);
}

bool DiskTier::writes_stopped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stopped_;
}

void DiskTier::Remove(const BlockKey& key, bool delete_file) {
  writing_.erase(key);  // a write in flight finds itself superseded and drops its file
  if (!index_.Remove(key)) return;
  if (delete_file) {
    std::error_code ec;
    fs::remove(PathOf(key), ec);
  }
  CountSize();
}

void DiskTier::EvictFor(uint64_t incoming) {
  for (const BlockKey& victim : index_.EvictFor(incoming)) {
    writing_.erase(victim);
    std::error_code ec;
    fs::remove(PathOf(victim), ec);
    Count([](TierStats& s) { ++s.evictions; });
    Dropped(victim);
  }
  CountSize();
}

void DiskTier::CountSize() { SetSize(index_.used_bytes(), index_.size()); }

namespace {

std::string OsError(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

// Writes all of bytes[done, upto) at their offsets; false with errno set
// when the file system refuses.
bool WriteRange(int fd, std::string_view bytes, size_t upto, size_t* done) {
  while (*done < upto) {
    const ssize_t n = ::pwrite(fd, bytes.data() + *done, upto - *done, static_cast<off_t>(*done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = ENOSPC;
      return false;
    }
    *done += static_cast<size_t>(n);
  }
  return true;
}

// Writes `bytes` to the new file `path`. Bytes at an aligned address (a
// BlockEncoder's) go to the device with O_DIRECT, all but the last partial
// 4 KiB: no copy into the page cache, whose fresh pages cost more CPU than
// the rest of a block's write (docs/tiers.md); the tail, and everything on a
// file system without O_DIRECT (tmpfs), is an ordinary write. Not synced: see
// disk_tier.h.
Status WriteNewFile(const std::string& path, std::string_view bytes) {
  constexpr size_t kAlign = AlignedBuffer::kAlignment;
  const int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
  const size_t direct = reinterpret_cast<uintptr_t>(bytes.data()) % kAlign == 0 ? bytes.size() / kAlign * kAlign : 0;
  int fd = direct > 0 ? ::open(path.c_str(), flags | O_DIRECT, 0666) : -1;
  const bool is_direct = fd >= 0;
  if (!is_direct) {
    if (direct > 0) ::unlink(path.c_str());  // some kernels create the file before refusing O_DIRECT
    fd = ::open(path.c_str(), flags, 0666);
  }
  if (fd < 0) return IoError(OsError("cannot create", path));
  size_t done = 0;
  bool ok = true;
  if (is_direct) {
    ok = WriteRange(fd, bytes, direct, &done) || errno == EINVAL;  // EINVAL: this alignment is refused; write it plainly
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_DIRECT);
  }
  ok = ok && WriteRange(fd, bytes, bytes.size(), &done);
  Status s = ok ? Status::Ok() : IoError(OsError("cannot write", path) + " (is the disk full?)");
  if (::close(fd) != 0 && s.ok()) s = IoError(OsError("cannot write", path) + " (is the disk full?)");
  if (!s.ok()) ::unlink(path.c_str());
  return s;
}

}  // namespace

Status DiskTier::Put(const BlockKey& key, std::string_view bytes) {
  const std::string path = PathOf(key);
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes.size() > options_.max_bytes) {
      Count([](TierStats& s) { ++s.errors; });
      return ResourceExhausted("a block of " + std::to_string(bytes.size()) +
                               " bytes is larger than the disk tier's cap of " + std::to_string(options_.max_bytes));
    }
    if (stopped_ && std::chrono::steady_clock::now() < retry_at_) {
      return IoError("the disk tier " + options_.dir + " stopped writing after an error");
    }
    Remove(key, /*delete_file=*/false);  // replaced by the rename below
    EvictFor(bytes.size());
    index_.Add(key, bytes.size());  // the budget counts it from now; a Get misses until it is renamed
    ticket = ++tickets_;
    writing_[key] = ticket;
    CountSize();
  }
  // The bytes go out with the lock released: Gets, Erases and other Puts go on.
  const std::string temp = AtomicWriteTemporaryFor(path);
  Status written = WriteNewFile(temp, bytes);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = writing_.find(key);
  const bool current = it != writing_.end() && it->second == ticket;  // not erased, evicted or replaced meanwhile
  if (current) writing_.erase(it);
  if (written.ok() && !current) {
    ::unlink(temp.c_str());
    return index_.Bytes(key) ? Status::Ok() : NotFound("the block was erased while it was being written");
  }
  if (written.ok() && ::rename(temp.c_str(), path.c_str()) != 0) {
    written = IoError(OsError("cannot rename " + temp + " to", path));
    ::unlink(temp.c_str());
  }
  if (!written.ok()) {
    if (current) Remove(key, /*delete_file=*/true);  // an older value of this key is no longer indexed
    if (!stopped_) {
      options_.log("disk tier " + options_.dir + ": stopped writing: " + written.message() + " (retrying in " +
                   std::to_string(options_.retry_seconds) + " s; reads go on)");
      Count([](TierStats& s) { ++s.errors; });
    }
    stopped_ = true;
    retry_at_ = std::chrono::steady_clock::now() + std::chrono::seconds(options_.retry_seconds);
    return written;
  }
  if (stopped_) {
    stopped_ = false;
    options_.log("disk tier " + options_.dir + ": writing again");
  }
  Count([](TierStats& s) { ++s.puts; });
  return Status::Ok();
}

std::optional<std::string> DiskTier::Get(const BlockKey& key) {
  const std::string path = PathOf(key);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!index_.Bytes(key) || writing_.count(key) != 0) {
      Count([](TierStats& s) { ++s.misses; });
      return std::nullopt;
    }
    index_.Touch(key);
  }
  // Read with the lock released. The file is whole or absent (renamed into
  // place); whatever else it holds, the block's checksums catch.
  std::optional<std::string> bytes;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st {};
  if (fd >= 0 && ::fstat(fd, &st) == 0) {
    std::string b(static_cast<size_t>(st.st_size), '\0');
    size_t done = 0;
    while (done < b.size()) {
      const ssize_t n = ::read(fd, b.data() + done, b.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    if (done == b.size()) bytes = std::move(b);
    ::futimens(fd, nullptr);  // the recency a restart sorts by
  }
  if (fd >= 0) ::close(fd);
  if (!bytes) {
    // Gone (another process on this directory evicted it) or unreadable:
    // forget it, unless a Put is writing it anew.
    std::lock_guard<std::mutex> lock(mu_);
    if (writing_.count(key) == 0) Remove(key, /*delete_file=*/fd >= 0);
    Count([&](TierStats& s) {
      ++s.misses;
      if (fd >= 0) ++s.errors;
    });
    return std::nullopt;
  }
  Count([](TierStats& s) { ++s.hits; });
  return bytes;
}

void DiskTier::Erase(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  Remove(key, /*delete_file=*/true);
}

}  // namespace kvx::kv::tier
