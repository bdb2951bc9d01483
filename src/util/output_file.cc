#include "util/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "util/mmap_file.h"
#include "util/printable.h"

namespace kvx {

namespace {

std::string OsError(const std::string& what, const std::string& path) {
  return what + " " + QuotePrintable(path) + ": " + std::strerror(errno);
}

std::string Refused(const std::string& path, const std::string& what) {
  return "cannot write " + QuotePrintable(path) + ": it is " + what +
         "; kvx writes output only to regular files or new paths (give a file name)";
}

// The file a write to `path` replaces, with the permission bits it keeps
// (-1: a new file), or the refusal. Symbolic links are resolved whole.
Status ResolveTarget(const std::string& path, std::string* target, int* keep_mode) {
  if (path.empty()) return InvalidArgument("the output file name is empty");
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) return IoError(OsError("cannot inspect", path));
    *target = path;  // a new file
    *keep_mode = -1;
    return Status::Ok();
  }
  *target = path;
  if (S_ISLNK(st.st_mode)) {
    char resolved[PATH_MAX];
    if (::realpath(path.c_str(), resolved) == nullptr) {
      if (errno == ENOENT) return InvalidArgument(Refused(path, "a symbolic link to a file that does not exist"));
      return IoError(OsError("cannot resolve the symbolic link", path));
    }
    *target = resolved;
    if (::stat(resolved, &st) != 0) return IoError(OsError("cannot inspect", *target));
    if (!S_ISREG(st.st_mode)) {
      return InvalidArgument(Refused(path, "a symbolic link to " + NotRegularWhat(st.st_mode) + " (" +
                                               QuotePrintable(*target) + ")"));
    }
  }
  if (!S_ISREG(st.st_mode)) return InvalidArgument(Refused(path, NotRegularWhat(st.st_mode)));
  *keep_mode = static_cast<int>(st.st_mode & 07777);
  return Status::Ok();
}

}  // namespace

std::string AtomicWriteTemporaryFor(const std::string& target) {
  static std::atomic<uint64_t> counter{0};
  const size_t slash = target.rfind('/');
  const std::string dir = slash == std::string::npos ? "" : target.substr(0, slash + 1);
  const std::string base = slash == std::string::npos ? target : target.substr(slash + 1);
  return dir + "." + base + ".kvx-tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
}

Result<OutputFile> OutputFile::Open(const std::string& path) {
  OutputFile f;
  f.path_ = path;
  int keep_mode = -1;
  KVX_RETURN_IF_ERROR(ResolveTarget(path, &f.target_, &keep_mode));
  f.temp_ = AtomicWriteTemporaryFor(f.target_);
  const int fd = ::open(f.temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) {
    const std::string reason = OsError("cannot create", f.temp_);  // before anything can change errno
    return IoError("cannot write " + QuotePrintable(path) + ": " + reason +
                   " (does the directory exist and is it writable?)");
  }
  if (keep_mode >= 0) (void)::fchmod(fd, static_cast<mode_t>(keep_mode));  // best effort: the bytes matter more
  f.stream_ = ::fdopen(fd, "wb");
  if (f.stream_ == nullptr) {
    const Status s = IoError(OsError("cannot open", f.temp_));
    ::close(fd);
    ::unlink(f.temp_.c_str());
    return s;
  }
  return f;
}

OutputFile::OutputFile(OutputFile&& other) noexcept { *this = std::move(other); }

OutputFile& OutputFile::operator=(OutputFile&& other) noexcept {
  if (this != &other) {
    Discard();
    path_ = std::move(other.path_);
    target_ = std::move(other.target_);
    temp_ = std::move(other.temp_);
    stream_ = other.stream_;
    other.stream_ = nullptr;
    other.temp_.clear();
  }
  return *this;
}

OutputFile::~OutputFile() { Discard(); }

void OutputFile::Discard() {
  if (stream_ != nullptr) std::fclose(stream_);
  stream_ = nullptr;
  if (!temp_.empty()) ::unlink(temp_.c_str());
  temp_.clear();
}

Status OutputFile::Write(std::string_view bytes) {
  if (stream_ == nullptr) return Internal("write to a committed output file " + QuotePrintable(path_));
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), stream_) != bytes.size()) {
    const std::string reason = OsError("cannot write", temp_);
    return IoError("cannot write " + QuotePrintable(path_) + ": " + reason + " (is the disk full?)");
  }
  return Status::Ok();
}

Status OutputFile::Commit() {
  if (stream_ == nullptr) return Internal("output file " + QuotePrintable(path_) + " committed twice");
  std::FILE* f = stream_;
  stream_ = nullptr;
  // Flushed and synced before the rename, so a crash cannot leave the
  // target renamed to a file whose bytes never reached the disk.
  const bool written = std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const int write_errno = errno;
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed) {
    if (!written) errno = write_errno;  // the flush's or sync's reason, not the close's
    const std::string reason = OsError("cannot write", temp_);
    return IoError("cannot write " + QuotePrintable(path_) + ": " + reason + " (is the disk full?)");
  }
  if (std::rename(temp_.c_str(), target_.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    return IoError("cannot rename " + QuotePrintable(temp_) + " to " + QuotePrintable(target_) + ": " + reason);
  }
  temp_.clear();  // it is the target now
  return Status::Ok();
}

Status CheckOutputFile(const std::string& path) {
  std::string target;
  int keep_mode = -1;
  return ResolveTarget(path, &target, &keep_mode);
}

Status WriteFileAtomically(const std::string& path, std::string_view bytes) {
  KVX_ASSIGN_OR_RETURN(OutputFile f, OutputFile::Open(path));
  KVX_RETURN_IF_ERROR(f.Write(bytes));
  return f.Commit();
}

bool IsAtomicWriteTemporary(std::string_view name) { return name.find(".kvx-tmp.") != std::string_view::npos; }

}  // namespace kvx
