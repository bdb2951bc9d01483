// kvx tune's result cache: every `kvx tune` stores its result (the JSON that
// --kv @FILE reads) under the model's fingerprint and the budget it was
// tuned for, and `--kv auto` in the commands that load a model finds it
// there, so a server can start with the spec tuned for its model without
// naming the file (docs/tune.md).
//
// The directory: $KVX_TUNE_CACHE, else $XDG_CACHE_HOME/kvx/tune, else
// $HOME/.cache/kvx/tune. A file is named
//   <fingerprint, 16 hex digits>-mem<bytes>-ctx<tokens>-s<sessions>.json
// (model/fingerprint.h: another model, fine-tune or quantization has
// another fingerprint, so its results are never picked).
//
//   --kv auto        the model's one cached result (several budgets: an
//                    error listing them, asking for auto:SIZE);
//   --kv auto:SIZE   the model's result tuned for --mem SIZE (the newest
//                    when several contexts or session counts were tuned).
//
// Thread-safety: functions of the file system, no state of their own.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "util/status.h"

namespace kvx::eval {

// The cache directory ("" when none of the variables is set).
std::string TuneCacheDir();

std::string TuneCacheName(uint64_t fingerprint, uint64_t mem_bytes, int ctx, int sessions);

// Writes `json` as `name` in `dir` (created if missing), atomically;
// returns the path.
Result<std::string> StoreTuneResult(const std::string& dir, const std::string& name, const std::string& json);

// "auto" or "auto:SIZE".
bool IsAutoKV(std::string_view arg);

struct TunedSpec {
  std::string path;  // the cached file
  std::string spec;  // its spec (kv::ExpandKVSpecArg of @path)
  uint64_t mem_bytes = 0;
  int ctx = 0, sessions = 0;
};

// The cached result `arg` (IsAutoKV) asks for, for the model file at
// `model_path`, in `dir`. InvalidArgument when there is none (naming the
// kvx tune command that makes one), when `auto` is ambiguous (listing the
// budgets), or for a bad SIZE; the model file's own errors as they are.
Result<TunedSpec> FindTunedSpec(const std::string& dir, const std::string& model_path, std::string_view arg);

}  // namespace kvx::eval
