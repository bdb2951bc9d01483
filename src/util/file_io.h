// Whole-file writes that never leave half a file under the final name, for
// kvx's binary formats (session files, disk tier blocks).
//
// Thread-safety: safe to call from several threads (temporary names are
// unique per process and call).
#pragma once

#include <string>
#include <string_view>

#include "util/status.h"

namespace kvx {

// Writes `bytes` to a temporary file beside `path` (path + ".tmp.<pid>.<n>"),
// then renames it onto `path`: a reader sees the old file or the whole new
// one, never a torn one (no fsync: after a power loss the file may be
// missing or damaged, which the formats' checksums catch). IoError naming
// the file and the OS's reason (strerror: "No space left on device", "File
// too large", ...); the temporary file is removed on error.
Status WriteFileAtomically(const std::string& path, std::string_view bytes);

// Whether `name` (a file name, not a path) is a temporary file
// WriteFileAtomically left behind (a crash between write and rename).
bool IsAtomicWriteTemporary(std::string_view name);

}  // namespace kvx
