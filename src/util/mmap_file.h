// MappedFile: a read-only memory mapping of a whole file. Model weights are
// read straight from the mapping (no copy); the OS pages them in on demand.
// Thread-safety: immutable after Open; safe to read from many threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "util/status.h"

namespace kvx {

class MappedFile {
 public:
  // Opens and maps `path`. Errors name the path and the OS reason.
  static Result<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Drops the resident pages of a read-only file mapping within [p, p + n)
// (the whole pages inside it) from this process's memory: for data copied
// elsewhere (repacked weights), so it no longer counts toward RSS. Reading
// it again pages it back in from the file. Best effort.
void DropMappedPages(const void* p, size_t n);

// "a directory", "a pipe", "a device", "a socket": what a path whose
// st_mode is `mode` is, when it is not a regular file (for messages).
std::string NotRegularWhat(unsigned mode);

// Reads a whole regular file into a string (prompts, evaluation texts).
// NotFound when it does not exist; InvalidArgument when it is a directory,
// device or pipe, or longer than `max_bytes` (default 1 GiB, the most the
// tokenizer encodes at once); IoError for other OS failures.
inline constexpr size_t kMaxTextFileBytes = size_t{1} << 30;
Result<std::string> ReadFileToString(const std::string& path, size_t max_bytes = kMaxTextFileBytes);
// ReadFileToString for a file that must hold some text (a prompt, an
// evaluation text): one that reads empty is InvalidArgument, not an empty
// prompt to generate from.
Result<std::string> ReadNonEmptyTextFile(const std::string& path);

}  // namespace kvx
