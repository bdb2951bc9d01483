// Byte sizes as users write them: `--kv budget=512M`, `kvx plan --mem 16G`.
// One grammar for every size kvx reads, so a size means the same everywhere.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string_view>

#include "util/status.h"

namespace kvx {

// A whole decimal number of bytes with an optional suffix K, M, G (binary:
// 2^10, 2^20, 2^30; also KiB, MiB, GiB; case-insensitive; B = bytes),
// spaces allowed before the suffix: "0", "1000B", "3K", "2 MiB", "5g".
// InvalidArgument "'TEXT' is not a size: ..." for anything else, and
// "'TEXT' is too large: ..." past 2^64 - 1 bytes, both saying what a size
// looks like; TEXT is quoted printably (util/printable.h), so callers prefix
// only what the size is for ("--mem ", "budget ").
Result<uint64_t> ParseByteSize(std::string_view text);

}  // namespace kvx
