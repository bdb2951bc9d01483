#include "util/mmap_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "util/printable.h"

namespace kvx {

std::string NotRegularWhat(unsigned mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a pipe";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

Result<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    const std::string reason = std::strerror(err);
    if (err == ENOENT) return NotFound("cannot open " + QuotePrintable(path) + ": " + reason);
    return IoError("cannot open " + QuotePrintable(path) + ": " + reason);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const std::string reason = std::strerror(errno);
    ::close(fd);
    return IoError("cannot stat " + QuotePrintable(path) + ": " + reason);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument(QuotePrintable(path) + " is " + NotRegularWhat(st.st_mode) +
                           ", not a regular file");
  }
  std::unique_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const std::string reason = std::strerror(errno);
      ::close(fd);
      return IoError("cannot mmap " + QuotePrintable(path) + ": " + reason);
    }
    f->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return f;
}

void DropMappedPages(const void* p, size_t n) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
  if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

Result<std::string> ReadFileToString(const std::string& path, size_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    const std::string msg = "cannot open " + QuotePrintable(path) + ": " + std::strerror(err);
    return err == ENOENT ? NotFound(msg) : IoError(msg);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const std::string reason = std::strerror(errno);
    ::close(fd);
    return IoError("cannot stat " + QuotePrintable(path) + ": " + reason);
  }
  // Only regular files: a directory reads as an empty text (an empty prompt
  // or a zero-token perplexity text), a device such as /dev/zero never ends.
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument(QuotePrintable(path) + " is " + NotRegularWhat(st.st_mode) +
                           ", not a regular file; give a text file");
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    return InvalidArgument(QuotePrintable(path) + " has " + std::to_string(st.st_size) +
                           " bytes; kvx reads text files of at most " + std::to_string(max_bytes) + " bytes");
  }
  // Read to the end of the file, not to st_size: procfs and sysfs files
  // (/proc/cpuinfo) report size 0 and a file may grow while it is read.
  std::string out;
  out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string reason = std::strerror(errno);
      ::close(fd);
      return IoError("error reading " + QuotePrintable(path) + ": " + reason);
    }
    if (n == 0) break;
    if (out.size() + static_cast<size_t>(n) > max_bytes) {
      ::close(fd);
      return InvalidArgument(QuotePrintable(path) + " has more than " + std::to_string(max_bytes) +
                             " bytes; kvx reads text files of at most " + std::to_string(max_bytes) + " bytes");
    }
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

Result<std::string> ReadNonEmptyTextFile(const std::string& path) {
  KVX_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  if (text.empty()) {
    return InvalidArgument(QuotePrintable(path) + " is empty (0 bytes read); give a file with some text");
  }
  return text;
}

}  // namespace kvx
