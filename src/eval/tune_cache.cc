// kvx tune's result cache (tune_cache.h).
#include "eval/tune_cache.h"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <vector>

#include "gguf/gguf_file.h"
#include "kv/kv_spec.h"
#include "model/fingerprint.h"
#include "util/byte_size.h"
#include "util/output_file.h"

namespace kvx::eval {
namespace {

namespace fs = std::filesystem;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string Hex(uint64_t fingerprint) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, fingerprint);
  return buf;
}

// The budget a cache file's name records (false: not one of ours).
bool ParseName(const std::string& name, const std::string& hex, TunedSpec* out) {
  unsigned long long mem = 0;
  int ctx = 0, sessions = 0, end = 0;
  const std::string prefix = hex + "-";
  if (name.rfind(prefix, 0) != 0) return false;
  const std::string rest = name.substr(prefix.size());
  if (std::sscanf(rest.c_str(), "mem%llu-ctx%d-s%d.json%n", &mem, &ctx, &sessions, &end) != 3 ||
      static_cast<size_t>(end) != rest.size()) {
    return false;
  }
  out->mem_bytes = mem;
  out->ctx = ctx;
  out->sessions = sessions;
  return true;
}

}  // namespace

std::string TuneCacheDir() {
  if (std::string d = Env("KVX_TUNE_CACHE"); !d.empty()) return d;
  if (std::string d = Env("XDG_CACHE_HOME"); !d.empty()) return d + "/kvx/tune";
  if (std::string d = Env("HOME"); !d.empty()) return d + "/.cache/kvx/tune";
  return "";
}

std::string TuneCacheName(uint64_t fingerprint, uint64_t mem_bytes, int ctx, int sessions) {
  return Hex(fingerprint) + "-mem" + std::to_string(mem_bytes) + "-ctx" + std::to_string(ctx) + "-s" +
         std::to_string(sessions) + ".json";
}

Result<std::string> StoreTuneResult(const std::string& dir, const std::string& name, const std::string& json) {
  if (dir.empty()) return InvalidArgument("no tune cache directory: set KVX_TUNE_CACHE, XDG_CACHE_HOME or HOME");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return InvalidArgument("cannot create the tune cache " + dir + ": " + ec.message());
  const std::string path = (fs::path(dir) / name).string();
  KVX_RETURN_IF_ERROR(WriteFileAtomically(path, json));
  return path;
}

bool IsAutoKV(std::string_view arg) { return arg == "auto" || arg.rfind("auto:", 0) == 0; }

Result<TunedSpec> FindTunedSpec(const std::string& dir, const std::string& model_path, std::string_view arg) {
  std::optional<uint64_t> mem;
  if (arg.size() > 5) {
    Result<uint64_t> m = ParseByteSize(std::string(arg.substr(5)));
    if (!m.ok()) return InvalidArgument("--kv " + std::string(arg) + ": " + m.status().message());
    mem = *m;
  }
  KVX_ASSIGN_OR_RETURN(auto file, gguf::GgufFile::Open(model_path));
  const std::string hex = Hex(model::ModelFingerprint(*file));
  const std::string tune = "kvx tune -m " + model_path + " --mem " + (mem ? std::to_string(*mem) : "SIZE") +
                           " --ctx TOKENS";
  std::vector<TunedSpec> found;
  std::error_code ec;
  for (fs::directory_iterator it(dir.empty() ? "." : dir, ec), end; !dir.empty() && !ec && it != end; it.increment(ec)) {
    TunedSpec t;
    if (!ParseName(it->path().filename().string(), hex, &t) || (mem && t.mem_bytes != *mem)) continue;
    t.path = it->path().string();
    found.push_back(std::move(t));
  }
  if (found.empty()) {
    return InvalidArgument("--kv " + std::string(arg) + ": no tuned spec for this model (fingerprint " + hex + ")" +
                           (mem ? " and --mem " + std::to_string(*mem) : "") + " in the tune cache " +
                           (dir.empty() ? "(none: set KVX_TUNE_CACHE)" : dir) + ": run `" + tune +
                           "` first (it stores its result there), or give --kv a spec or @FILE");
  }
  for (const TunedSpec& t : found) {
    if (t.mem_bytes == found[0].mem_bytes) continue;
    std::string budgets;
    for (const TunedSpec& u : found) budgets += (budgets.empty() ? "" : ", ") + std::to_string(u.mem_bytes);
    return InvalidArgument("--kv auto: the tune cache " + dir + " holds specs for several budgets of this model " +
                           "(--mem " + budgets + " bytes): say which with --kv auto:SIZE");
  }
  // Several contexts or session counts for one budget: the newest.
  auto newest = found.begin();
  for (auto it = found.begin(); it != found.end(); ++it) {
    if (fs::last_write_time(it->path, ec) > fs::last_write_time(newest->path, ec)) newest = it;
  }
  TunedSpec t = *newest;
  Result<std::string> spec = kv::ExpandKVSpecArg("@" + t.path);
  if (!spec.ok()) return InvalidArgument("--kv " + std::string(arg) + ": " + spec.status().message());
  t.spec = std::move(*spec);
  return t;
}

}  // namespace kvx::eval
