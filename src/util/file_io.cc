#include "util/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace kvx {
namespace {
constexpr std::string_view kTmpMarker = ".tmp.";
}  // namespace

Status WriteFileAtomically(const std::string& path, std::string_view bytes) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = path + std::string(kTmpMarker) + std::to_string(getpid()) + "." + std::to_string(counter++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return IoError("cannot create " + tmp + ": " + std::strerror(errno) + " (does the directory exist and is it writable?)");
  }
  size_t done = 0;
  int err = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : EIO;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && std::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    return IoError("cannot write " + path + ": " + std::strerror(err));
  }
  return Status::Ok();
}

bool IsAtomicWriteTemporary(std::string_view name) { return name.find(kTmpMarker) != std::string_view::npos; }

}  // namespace kvx
