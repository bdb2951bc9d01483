// Range checks for the numeric flags of every kvx command, so that one flag
// means one range everywhere: a thread count, a context length or a
// probability is checked the same way in run, perplexity, bench, plan and
// eval, before anything is loaded, and a value outside the range is an error
// naming the flag and the range (never silently "off" or clamped).
//
// Each function returns a CLI11 validator for Option::check(); CLI11 runs it
// on the flag's text (each element of a list flag) before converting it, so
// the validator parses the text itself and rejects what the conversion would
// wrap or truncate.
//
// The flags of every command that loads an engine (-m, -c, -t, --kv) are
// declared once, by AddEngineFlags, so they read and mean the same in each.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "engine/engine.h"
#include "engine/scheduler.h"
#include "kv/tier/storage_transform.h"
#include "kv/tier/tier_store.h"
#include "util/status.h"

namespace kvx::tools {

// Limits well past any sensible use, small enough that no size computed from
// them overflows or asks for absurd memory before a clearer check can run.
inline constexpr int64_t kMaxThreads = 1024;
inline constexpr int64_t kMaxContext = int64_t{1} << 24;  // tokens (16M)
inline constexpr int64_t kMaxBatch = int64_t{1} << 16;    // tokens per forward pass
inline constexpr int64_t kMaxCount = int64_t{1} << 30;    // trials, repetitions, generated tokens

// An integer in [lo, hi]; `hint` (e.g. "0: all cores") ends the message.
CLI::Validator IntIn(int64_t lo, int64_t hi, const std::string& hint = "");
// A limit on chunks, trials...: -1 (no limit) or 1..kMaxCount. Zero is an
// error: a perplexity over zero chunks has no value to print (it was -nan).
CLI::Validator AllOrAtLeastOne();
// -t/--threads: 0 (all cores) .. kMaxThreads.
CLI::Validator Threads();
// A finite number in [lo, hi] (lo_open / hi_open: the bound itself excluded).
CLI::Validator NumberIn(double lo, double hi, bool lo_open, bool hi_open, const std::string& hint = "");
// A probability in (0, 1].
CLI::Validator Probability(const std::string& hint = "");
// Any finite number (rejects nan and inf).
CLI::Validator Finite(const std::string& hint = "");
// A byte size as ParseByteSize reads it ("8M", "2 GiB", "1000") in
// [lo, hi]; a transform: it rewrites the text to plain bytes, so an integer
// option takes sizes with suffixes too.
CLI::Validator ByteSizeIn(uint64_t lo = 0, uint64_t hi = UINT64_MAX);

// The compact level's rates, K_EARLY,V_EARLY,K_LATE,V_LATE
// (kv/tier/storage_transform.h), as `name` (calibrate-storage's --rates,
// eval's --storage-rates); a bad value is refused before a model loads.
CLI::Option* AddCompactRatesOption(CLI::App* cmd, const std::string& name, kv::tier::CompactRates* rates);

// --kv, with the one help text; the list form (repeatable) is for commands
// that size or compare several specs, `what` saying what is done with each.
CLI::Option* AddKVFlag(CLI::App* cmd, std::string* text);
CLI::Option* AddKVFlag(CLI::App* cmd, std::vector<std::string>* texts, const std::string& what);

// What -c/--ctx-size means for a command: its help and its range.
struct ContextFlag {
  std::string help = "Context length per sequence (0: the model's trained context)";
  int64_t min = 0, max = kMaxContext;
  std::string hint = "0: the model's trained context";
};

// The engine flags' values: EngineOptions as -m, -c and -t set them, and
// the --kv text, parsed into options.kv_spec by LoadEngine (its one parse).
struct EngineFlags {
  engine::EngineOptions options;
  std::string kv;
};

// Work sized beyond the model's trained context (positions it never saw:
// numbers that mean little, at a cost that grows without bound) is refused
// unless --force: the one rule of calibrate-heads, bench and perplexity.
void AddForceFlag(CLI::App* cmd, bool* force);
// InvalidArgument when `tokens` (what `what` sizes, e.g. "the chunk (-c)")
// pass `trained` tokens (0: unknown, never refused) and not `force`.
Status CheckTrainedContext(int64_t tokens, int trained, bool force, const std::string& what);
// The same against the model file's trained context, read from its
// metadata; a file that cannot be read passes (LoadEngine then says what is
// wrong with it).
Status CheckTrainedContext(const std::string& model_path, int64_t tokens, bool force, const std::string& what);

// --kv auto or auto:SIZE (eval/tune_cache.h): the spec kvx tune cached for
// the model at `model_path`, with the file and spec logged on stderr; any
// other text as it is. InvalidArgument naming the kvx tune command to run
// when nothing is cached.
Result<std::string> ResolveAutoKV(const std::string& kv, const std::string& model_path);

// Declares -m/--model (required), -c/--ctx-size, -t/--threads and --kv
// (with `kv_list`, the repeatable form into it instead of flags->kv, `what`
// saying what is done with several).
void AddEngineFlags(CLI::App* cmd, EngineFlags* flags, const ContextFlag& ctx = {},
                    std::vector<std::string>* kv_list = nullptr, const std::string& what = "");
// Parses --kv (InvalidArgument naming the bad item), then Engine::Load.
Result<std::unique_ptr<engine::Engine>> LoadEngine(const EngineFlags& flags);

// The KV tier flags of the commands that run a scheduler (serve, batch):
// --cache-ram-bytes (host-RAM tier), --cache-dir and --cache-dir-bytes
// (disk tier), --cache-redis (Redis tier), --cache-block (tokens a block);
// and how the scheduler preempts: --preempt, --swap-bytes.
struct CacheFlags {
  std::string preempt = "auto";     // or "swap", "recompute"
  std::string swap_bytes = "0";     // host RAM for swapped-out sequences (0: the pool's budget)
  std::string ram_bytes = "0";  // 0: no host-RAM tier
  std::string dir;              // "": no disk tier
  std::string dir_bytes = "10G";
  std::string redis;            // "": no Redis tier
  int block_tokens = 256;
  std::string write = "through";  // or "back"
  std::string codec = "lossless";  // storage level(s): kv::tier::ParseStorageLevels
  std::string storage_transform;   // compact: the transform file ("": cached or calibrated, eval/storage_transform_cache.h)
};
void AddCacheFlags(CLI::App* cmd, CacheFlags* flags);
// The tier store the flags ask for, host RAM -> disk -> Redis, for
// `engine`'s model and KV spec; null when they ask for no tier. A tier at
// the compact level gets the storage transform from --storage-transform,
// the cache or a calibration on `engine` (eval/storage_transform_cache.h).
// InvalidArgument naming the flag at fault.
Result<std::shared_ptr<kv::tier::TierStore>> OpenTiers(const CacheFlags& flags, engine::Engine& engine);
// The scheduler options the flags set: the tiers (OpenTiers), the preemption.
Status ApplyCacheFlags(const CacheFlags& flags, engine::Engine& engine, engine::SchedulerOptions* options);

// Chunk reuse (docs/kv-reuse.md): --chunk-cache-bytes and --chunk-repair
// (kvx serve, kvx batch).
struct ChunkFlags {
  uint64_t cache_bytes = uint64_t{256} << 20;  // 0: requests with chunks are refused
  std::string repair = engine::ChunkRepair().ToString();  // epic,k=16
};
void AddChunkFlags(CLI::App* cmd, ChunkFlags* flags);
// The scheduler's chunk cache from the flags, and the default repair.
engine::ChunkRepair ApplyChunkFlags(const ChunkFlags& flags, engine::SchedulerOptions* options);

}  // namespace kvx::tools
