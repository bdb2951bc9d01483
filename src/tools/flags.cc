#include "tools/flags.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "eval/storage_transform_cache.h"
#include "eval/tune_cache.h"
#include "gguf/gguf_file.h"
#include "kv/kv_spec.h"
#include "kv/tier/disk_tier.h"
#include "kv/tier/ram_tier.h"
#include "kv/tier/redis_tier.h"
#include "model/config.h"
#include "model/fingerprint.h"
#include "util/byte_size.h"
#include "util/printable.h"

namespace kvx::tools {

namespace {

std::string WithHint(std::string message, const std::string& hint) {
  return hint.empty() ? message : message + " (" + hint + ")";
}

std::string FormatNumber(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

// Strict parses: the whole text, no leading/trailing junk, no overflow.
bool ParseInt(const std::string& text, int64_t* out) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size()) return false;
  *out = v;
  return true;
}

bool ParseDouble(const std::string& text, double* out) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size()) return false;
  *out = v;
  return true;
}

}  // namespace

CLI::Validator IntIn(int64_t lo, int64_t hi, const std::string& hint) {
  const std::string range = std::to_string(lo) + ".." + std::to_string(hi);
  return CLI::Validator(
      [lo, hi, range, hint](std::string& text) -> std::string {
        int64_t v = 0;
        if (!ParseInt(text, &v) || v < lo || v > hi) {
          return WithHint(QuotePrintable(text, 64) + " is not an integer in " + range, hint);
        }
        return "";
      },
      "INT in " + range);
}

CLI::Option* AddCompactRatesOption(CLI::App* cmd, const std::string& name, kv::tier::CompactRates* rates) {
  const CLI::Validator valid(
      [](std::string& text) -> std::string {
        const Result<kv::tier::CompactRates> r = kv::tier::ParseCompactRates(text);
        return r.ok() ? "" : r.status().message();
      },
      "K_EARLY,V_EARLY,K_LATE,V_LATE");
  return cmd
      ->add_option_function<std::string>(
          name, [rates](const std::string& text) { *rates = *kv::tier::ParseCompactRates(text); },
          "The compact level's average bits a value: keys and values of the first third of the layers, then of "
          "the rest (default " +
              kv::tier::FormatCompactRates(kv::tier::DefaultCompactRates()) +
              "); the transform's digest covers the bits they give")
      ->check(valid);
}

CLI::Validator AllOrAtLeastOne() {
  const std::string range = "1.." + std::to_string(kMaxCount);
  return CLI::Validator(
      [range](std::string& text) -> std::string {
        int64_t v = 0;
        if (!ParseInt(text, &v) || !(v == -1 || (v >= 1 && v <= kMaxCount))) {
          return QuotePrintable(text, 64) + " is neither -1 (all) nor an integer in " + range;
        }
        return "";
      },
      "INT: -1 (all) or " + range);
}

CLI::Validator Threads() { return IntIn(0, kMaxThreads, "0: all cores"); }

CLI::Validator NumberIn(double lo, double hi, bool lo_open, bool hi_open, const std::string& hint) {
  const std::string range = std::string(lo_open ? "(" : "[") + FormatNumber(lo) + ", " + FormatNumber(hi) +
                            (hi_open ? ")" : "]");
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double v = 0;
        const bool ok = ParseDouble(text, &v) && std::isfinite(v) && (lo_open ? v > lo : v >= lo) &&
                        (hi_open ? v < hi : v <= hi);
        if (!ok) return WithHint(QuotePrintable(text, 64) + " is not a number in " + range, hint);
        return "";
      },
      "NUMBER in " + range);
}

CLI::Validator Probability(const std::string& hint) { return NumberIn(0, 1, true, false, hint); }

CLI::Validator Finite(const std::string& hint) {
  return CLI::Validator(
      [hint](std::string& text) -> std::string {
        double v = 0;
        if (!ParseDouble(text, &v) || !std::isfinite(v)) {
          return WithHint(QuotePrintable(text, 64) + " is not a finite number", hint);
        }
        return "";
      },
      "NUMBER");
}

namespace {

constexpr const char* kKVHelp =
    "KV cache spec: codec, page size, budget and policies, e.g. 'codec=kivi4,page=32;budget=1G' "
    "(grammar: README, --kv), or @FILE, the JSON file kvx tune -o wrote, or auto[:SIZE], the spec kvx tune "
    "cached for this model (and budget)";

}  // namespace

// --kv @FILE (kvx tune's output) becomes the file's spec as the flag is
// read, so every command that takes --kv takes a tuned spec alike.
CLI::Validator SpecFile() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        Result<std::string> spec = kv::ExpandKVSpecArg(text);
        if (!spec.ok()) return spec.status().message();
        text = std::move(*spec);
        return "";
      },
      "SPEC or @FILE");
}

CLI::Option* AddKVFlag(CLI::App* cmd, std::string* text) {
  return cmd->add_option("--kv", *text, kKVHelp)->transform(SpecFile());
}

CLI::Option* AddKVFlag(CLI::App* cmd, std::vector<std::string>* texts, const std::string& what) {
  return cmd->add_option("--kv", *texts, std::string(kKVHelp) + "; " + what + " (repeat the flag for several)")
      ->allow_extra_args(false)
      ->transform(SpecFile());
}

void AddEngineFlags(CLI::App* cmd, EngineFlags* flags, const ContextFlag& ctx, std::vector<std::string>* kv_list,
                    const std::string& what) {
  engine::EngineOptions& o = flags->options;
  cmd->add_option("-m,--model", o.model_path, "GGUF model file")->required();
  cmd->add_option("-c,--ctx-size", o.n_ctx, ctx.help)->capture_default_str()->check(IntIn(ctx.min, ctx.max, ctx.hint));
  cmd->add_option("-t,--threads", o.n_threads, "Threads (0: all cores)")->capture_default_str()->check(Threads());
  if (kv_list) {
    AddKVFlag(cmd, kv_list, what);
  } else {
    AddKVFlag(cmd, &flags->kv);
  }
}

void AddForceFlag(CLI::App* cmd, bool* force) {
  cmd->add_flag("--force", *force, "Run even when the work passes the model's trained context");
}

Status CheckTrainedContext(int64_t tokens, int trained, bool force, const std::string& what) {
  if (force || trained <= 0 || tokens <= trained) return Status::Ok();
  return InvalidArgument(what + " has " + std::to_string(tokens) + " tokens, beyond the model's trained context of " +
                         std::to_string(trained) + ": shorten it, or pass --force to run there");
}

Status CheckTrainedContext(const std::string& model_path, int64_t tokens, bool force, const std::string& what) {
  auto file = gguf::GgufFile::Open(model_path);
  if (!file.ok()) return Status::Ok();
  auto config = model::ModelConfig::FromGguf(**file);
  if (!config.ok()) return Status::Ok();
  return CheckTrainedContext(tokens, config->n_ctx_train, force, what);
}

Result<std::string> ResolveAutoKV(const std::string& kv, const std::string& model_path) {
  if (!eval::IsAutoKV(kv)) return kv;
  KVX_ASSIGN_OR_RETURN(eval::TunedSpec t, eval::FindTunedSpec(eval::TuneCacheDir(), model_path, kv));
  std::fprintf(stderr, "kvx: --kv %s: %s (tuned for --mem %llu, --ctx %d, --sessions %d): --kv '%s'\n", kv.c_str(),
               t.path.c_str(), static_cast<unsigned long long>(t.mem_bytes), t.ctx, t.sessions, t.spec.c_str());
  return t.spec;
}

Result<std::unique_ptr<engine::Engine>> LoadEngine(const EngineFlags& flags) {
  engine::EngineOptions options = flags.options;
  KVX_ASSIGN_OR_RETURN(const std::string kv, ResolveAutoKV(flags.kv, options.model_path));
  KVX_ASSIGN_OR_RETURN(options.kv_spec, kv::ParseKVSpec(kv));
  return engine::Engine::Load(options);
}

CLI::Validator ByteSizeIn(uint64_t lo, uint64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) {
        Result<uint64_t> v = ParseByteSize(text);
        if (!v.ok()) return v.status().message();
        if (*v < lo || *v > hi) {
          return "'" + Printable(text) + "' is not a size in " + std::to_string(lo) + ".." + std::to_string(hi) +
                 " bytes";
        }
        text = std::to_string(*v);  // the option's integer target reads plain bytes
        return std::string();
      },
      "SIZE");
}

void AddChunkFlags(CLI::App* cmd, ChunkFlags* flags) {
  cmd->add_option("--chunk-cache-bytes", flags->cache_bytes,
                  "Chunk cache (requests' \"chunks\": their KV reused at any position) in RAM, e.g. 512M (0: "
                  "requests with chunks are refused)")
      ->capture_default_str()
      ->transform(ByteSizeIn());
  cmd->add_option("--chunk-repair", flags->repair,
                  "Repair of reused chunks when a request names none: none, full, epic[,k=N], "
                  "blend[,r=X][,layer=L][,k=N][,dev=kv|k|v]")
      ->capture_default_str()
      ->check([](const std::string& text) {
        Result<engine::ChunkRepair> r = engine::ParseChunkRepair(text);
        return r.ok() ? std::string() : r.status().message();
      });
}

engine::ChunkRepair ApplyChunkFlags(const ChunkFlags& flags, engine::SchedulerOptions* options) {
  options->chunk_cache_bytes = flags.cache_bytes;
  return engine::ParseChunkRepair(flags.repair).value();  // checked by the flag
}

void AddCacheFlags(CLI::App* cmd, CacheFlags* flags) {
  cmd->add_option("--cache-ram-bytes", flags->ram_bytes,
                  "Host-RAM KV tier: blocks kept in this process's memory in the storage format (0: none), e.g. 2G")
      ->capture_default_str()
      ->transform(ByteSizeIn());
  cmd->add_option("--cache-dir", flags->dir,
                  "Disk KV tier: blocks of KV kept in this directory across restarts (shared by processes)");
  cmd->add_option("--cache-dir-bytes", flags->dir_bytes, "Byte cap of --cache-dir (least recently used evicted)")
      ->capture_default_str()
      ->transform(ByteSizeIn());
  cmd->add_option("--cache-redis", flags->redis,
                  "Redis KV tier shared by several servers: redis://HOST:PORT[/db] (run Redis with maxmemory and "
                  "maxmemory-policy allkeys-lru)")
      ->check([](const std::string& url) {
        Result<kv::tier::RedisAddress> a = kv::tier::ParseRedisUrl(url);
        return a.ok() ? std::string() : a.status().message();
      });
  cmd->add_option("--cache-write", flags->write,
                  "When blocks go to the KV tiers: through (when a request finishes or is preempted) or back (when "
                  "the prefix cache evicts them, and at shutdown)")
      ->capture_default_str()
      ->check(CLI::IsMember({"through", "back"}));
  cmd->add_option("--cache-codec", flags->codec,
                  "Storage codec of the KV tiers: lossless (the pool's pages byte for byte), high, medium or low "
                  "(CacheGen-style, for f16/f32 pools), compact (a calibrated PCA per layer and kv head: "
                  "--storage-transform), for every tier or per tier: disk=high,redis=medium")
      ->capture_default_str()
      ->check([](const std::string& text) {
        Result<kv::tier::StorageLevels> l = kv::tier::ParseStorageLevels(text);
        return l.ok() ? std::string() : l.status().message();
      });
  cmd->add_option("--storage-transform", flags->storage_transform,
                  "--cache-codec compact: the storage transform file (kvx calibrate-storage -o); without it, the one "
                  "cached for this model and --kv, else one calibrated at start-up on a bundled text and cached")
      ->check(CLI::ExistingFile);
  cmd->add_option("--cache-block", flags->block_tokens,
                  "Tokens per KV tier block (a multiple of the KV page size, at most 4096)")
      ->capture_default_str()
      ->check(IntIn(1, kv::tier::kMaxBlockTokens));
  cmd->add_option("--preempt", flags->preempt,
                  "How a request is preempted when the KV pool runs out: swap (its pages to host RAM and back), "
                  "recompute, or auto (the cheaper at the measured copy bandwidth and prefill speed)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "swap", "recompute"}));
  cmd->add_option("--swap-bytes", flags->swap_bytes,
                  "Host RAM for sequences swapped out of the pool (0: as much as the pool's budget), e.g. 4G")
      ->capture_default_str()
      ->transform(ByteSizeIn());
}

Status ApplyCacheFlags(const CacheFlags& flags, engine::Engine& engine, engine::SchedulerOptions* options) {
  KVX_ASSIGN_OR_RETURN(options->tiers, OpenTiers(flags, engine));
  KVX_ASSIGN_OR_RETURN(options->preempt, engine::ParsePreemptMode(flags.preempt));
  KVX_ASSIGN_OR_RETURN(options->swap_bytes, ParseByteSize(flags.swap_bytes));
  return Status::Ok();
}

namespace {

// The compact level's transform (eval/storage_transform_cache.h), for a pool
// of float pages (quantized pages stay byte for byte at every level).
Result<std::shared_ptr<const kv::tier::StorageTransform>> CompactTransform(const CacheFlags& flags, engine::Engine& engine,
                                                                           const kv::tier::BlockSpace& space) {
  for (const kv::LayerCodec& lc : space.layers) {
    if (!kv::tier::HoldsFloatPages(lc)) {
      return InvalidArgument("--cache-codec compact codes f16 and f32 pools; --kv '" + engine.kv_spec().ToString() +
                             "' quantizes its pages (use lossless, or codec=f16,prerope=1: compact's measured pool)");
    }
  }
  return eval::FindOrCalibrateStorageTransform(engine, kv::tier::IdentityOf(space), flags.storage_transform,
                                               eval::TuneCacheDir(), [](const std::string& line) {
                                                 std::fprintf(stderr, "kvx: %s\n", line.c_str());
                                               });
}

}  // namespace

Result<std::shared_ptr<kv::tier::TierStore>> OpenTiers(const CacheFlags& flags, engine::Engine& engine) {
  using namespace kv::tier;
  std::vector<std::unique_ptr<Tier>> tiers;
  KVX_ASSIGN_OR_RETURN(const uint64_t ram_bytes, ParseByteSize(flags.ram_bytes));
  if (ram_bytes > 0) {
    KVX_ASSIGN_OR_RETURN(auto ram, RamTier::Open(ram_bytes));
    tiers.push_back(std::move(ram));
  }
  if (!flags.dir.empty()) {
    KVX_ASSIGN_OR_RETURN(const uint64_t cap, ParseByteSize(flags.dir_bytes));
    Result<std::unique_ptr<DiskTier>> disk = DiskTier::Open({.dir = flags.dir, .max_bytes = cap});
    if (!disk.ok()) return disk.status().WithContext("--cache-dir");
    tiers.push_back(std::move(disk).value());
  }
  if (!flags.redis.empty()) {
    KVX_ASSIGN_OR_RETURN(auto redis, RedisTier::Open({.url = flags.redis}));
    tiers.push_back(std::move(redis));
  }
  if (tiers.empty()) return std::shared_ptr<TierStore>();
  const kv::ResolvedKVSpec& spec = engine.kv_manager().spec();
  Result<BlockSpace> space = MakeBlockSpace(spec, model::ModelFingerprint(engine.model().file()), flags.block_tokens);
  if (!space.ok()) return space.status().WithContext("--cache-block");
  TierStoreOptions options;
  options.write_back = flags.write == "back";
  KVX_ASSIGN_OR_RETURN(const StorageLevels levels, ParseStorageLevels(flags.codec));
  for (const auto& t : tiers) options.tier_levels.push_back(levels.For(t->name().substr(0, t->name().find(' '))));
  const bool compact = std::find(options.tier_levels.begin(), options.tier_levels.end(), StorageLevel::kCompact) !=
                       options.tier_levels.end();
  if (compact) {
    KVX_ASSIGN_OR_RETURN(space->transform, CompactTransform(flags, engine, *space));
  } else if (!flags.storage_transform.empty()) {
    return InvalidArgument("--storage-transform is for --cache-codec compact; no tier here is compact");
  }
  KVX_ASSIGN_OR_RETURN(auto store, TierStore::Create(std::move(space).value(), std::move(tiers), options));
  return std::shared_ptr<TierStore>(std::move(store));
}

}  // namespace kvx::tools
