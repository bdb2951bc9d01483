#include "kv/tier/disk_tier.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

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
  if (!index_.Remove(key)) return;
  if (delete_file) {
    std::error_code ec;
    fs::remove(PathOf(key), ec);
  }
  CountSize();
}

void DiskTier::EvictFor(uint64_t incoming) {
  for (const BlockKey& victim : index_.EvictFor(incoming)) {
    std::error_code ec;
    fs::remove(PathOf(victim), ec);
    Count([](TierStats& s) { ++s.evictions; });
    Dropped(victim);
  }
  CountSize();
}

void DiskTier::CountSize() { SetSize(index_.used_bytes(), index_.size()); }

Status DiskTier::Put(const BlockKey& key, std::string_view bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes.size() > options_.max_bytes) {
    Count([](TierStats& s) { ++s.errors; });
    return ResourceExhausted("a block of " + std::to_string(bytes.size()) + " bytes is larger than the disk tier's cap of " +
                             std::to_string(options_.max_bytes));
  }
  const auto now = std::chrono::steady_clock::now();
  if (stopped_ && now < retry_at_) return IoError("the disk tier " + options_.dir + " stopped writing after an error");
  Remove(key, /*delete_file=*/false);  // replaced by the rename below
  EvictFor(bytes.size());
  Status written = WriteFileAtomically(PathOf(key), bytes);
  if (!written.ok()) {
    std::error_code ec;
    fs::remove(PathOf(key), ec);  // an older value of this key is no longer indexed
    if (!stopped_) {
      options_.log("disk tier " + options_.dir + ": stopped writing: " + written.message() + " (retrying in " +
                   std::to_string(options_.retry_seconds) + " s; reads go on)");
      Count([](TierStats& s) { ++s.errors; });
    }
    stopped_ = true;
    retry_at_ = now + std::chrono::seconds(options_.retry_seconds);
    return written;
  }
  if (stopped_) {
    stopped_ = false;
    options_.log("disk tier " + options_.dir + ": writing again");
  }
  index_.Add(key, bytes.size());
  CountSize();
  Count([](TierStats& s) { ++s.puts; });
  return Status::Ok();
}

std::optional<std::string> DiskTier::Get(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::optional<uint64_t> size = index_.Bytes(key);
  if (!size) {
    Count([](TierStats& s) { ++s.misses; });
    return std::nullopt;
  }
  const std::string path = PathOf(key);
  std::ifstream f(path, std::ios::binary);
  std::string bytes(*size, '\0');
  if (!f || !f.read(bytes.data(), static_cast<std::streamsize>(bytes.size())) || f.peek() != EOF) {
    // Gone (another process on this directory evicted it) or changed size
    // behind our back: forget it, and delete a file that is not what we wrote.
    const bool vanished = !f.is_open();
    Remove(key, /*delete_file=*/!vanished);
    Count([&](TierStats& s) {
      ++s.misses;
      if (!vanished) ++s.errors;
    });
    return std::nullopt;
  }
  index_.Touch(key);
  ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // the recency a restart sorts by
  Count([](TierStats& s) { ++s.hits; });
  return bytes;
}

void DiskTier::Erase(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  Remove(key, /*delete_file=*/true);
}

}  // namespace kvx::kv::tier
