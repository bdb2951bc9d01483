// OutputFile: the one rule every kvx command follows when it writes a file
// (gen-model -o, run --save-session, eval --json/--report, bench --json,
// batch -o, calibrate-heads -o, the server's --session-dir files):
//
//   * a path that does not exist yet, or names a regular file: the bytes go
//     to a new temporary file in the same directory, which replaces the path
//     by rename() only once it is complete (readers see the old file or the
//     new one, never half of one; a failed write leaves the old file alone);
//   * a symbolic link is followed (through every link in the chain) to the
//     regular file it names, and that file is replaced as above; the link
//     stays. A link to a missing file or to anything but a regular file is
//     refused;
//   * a directory, device (/dev/null, /dev/full), FIFO or socket is refused
//     with an error naming what it is: kvx neither writes through it nor
//     replaces it with a regular file (as root, rename() would otherwise
//     turn /dev/full into a plain file).
//
// A file that is replaced keeps its permission bits; a new one gets 0666
// minus the umask, as with fopen().
//
// Thread-safety: an OutputFile is used by one thread; distinct OutputFiles
// (even for the same path) may be written concurrently: each has its own
// temporary name, and the last Commit wins.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

#include "util/status.h"

namespace kvx {

class OutputFile {
 public:
  // Checks `path` against the rule above and creates the temporary file.
  // InvalidArgument for a target the rule refuses, IoError for OS failures
  // (a missing or read-only directory).
  static Result<OutputFile> Open(const std::string& path);
  OutputFile(OutputFile&& other) noexcept;
  OutputFile& operator=(OutputFile&& other) noexcept;
  OutputFile(const OutputFile&) = delete;
  ~OutputFile();  // removes the temporary file unless committed

  // The temporary file, open for writing (binary).
  std::FILE* stream() const { return stream_; }
  Status Write(std::string_view bytes);
  // Flushes, syncs and closes the temporary file, then renames it over the
  // target. Errors (a full disk included) leave the target untouched.
  Status Commit();

  const std::string& path() const { return path_; }

 private:
  OutputFile() = default;
  void Discard();  // closes and removes the temporary file, if any
  std::string path_;    // as the user gave it (for messages)
  std::string target_;  // the file that is replaced (path_ with links resolved)
  std::string temp_;
  std::FILE* stream_ = nullptr;
};

// The checks of OutputFile::Open without creating anything: commands call
// it before long work (a benchmark, a calibration, a generation), so that a
// target the rule refuses fails in a second, not after the work.
Status CheckOutputFile(const std::string& path);

// OutputFile::Open, Write, Commit in one call.
Status WriteFileAtomically(const std::string& path, std::string_view bytes);

// The temporary file a write of `target` goes to before it is renamed over
// it: "dir/.name.kvx-tmp.<pid>.<n>", hidden, in the target's directory
// (rename() is atomic only within one file system), unique per process and
// call. For writers of their own (the disk tier's blocks).
std::string AtomicWriteTemporaryFor(const std::string& target);

// Whether `name` (a file name, not a path) is a temporary file an OutputFile
// left behind (a crash between write and rename): directories kvx owns (the
// disk tier's) remove them when they are opened.
bool IsAtomicWriteTemporary(std::string_view name);

}  // namespace kvx
