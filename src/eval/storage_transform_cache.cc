#include "eval/storage_transform_cache.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "eval/storage_trip.h"
#include "util/clock.h"

namespace kvx::eval {
namespace {

std::string Hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

std::shared_ptr<const kv::tier::StorageTransform> Shared(kv::tier::StorageTransform t) {
  return std::make_shared<const kv::tier::StorageTransform>(std::move(t));
}

}  // namespace

std::string StorageTransformCacheName(const kv::tier::TransformIdentity& identity) {
  return Hex(identity.model_fingerprint) + "-storage-" + Hex(identity.spec_fingerprint) + ".kvxt";
}

Result<std::shared_ptr<const kv::tier::StorageTransform>> CalibrateStorageOnText(engine::Engine& engine, std::string text,
                                                                                 const kv::tier::CompactRates& rates) {
  KVX_ASSIGN_OR_RETURN(const std::vector<int32_t> tokens,
                       TokenizeCalibrationText(engine.model(), std::move(text), kStorageCalibTokens));
  return CalibrateStorage(engine, tokens, std::min(kStorageCalibChunk, engine.n_ctx()), rates);
}

Result<std::shared_ptr<const kv::tier::StorageTransform>> FindOrCalibrateStorageTransform(
    engine::Engine& engine, const kv::tier::TransformIdentity& identity, const std::string& file,
    const std::string& cache_dir, const std::function<void(const std::string&)>& log) {
  if (!file.empty()) {
    Result<kv::tier::StorageTransform> t = kv::tier::ReadTransformFile(file, identity);
    if (!t.ok()) return t.status().WithContext("--storage-transform");
    log("compact storage level: transform " + file);
    return Shared(std::move(t).value());
  }
  const std::string cached = cache_dir.empty() ? "" : cache_dir + "/" + StorageTransformCacheName(identity);
  std::error_code ec;
  if (!cached.empty() && std::filesystem::exists(cached, ec)) {
    Result<kv::tier::StorageTransform> t = kv::tier::ReadTransformFile(cached, identity);
    if (t.ok()) {
      log("compact storage level: transform " + cached + " (the cache's for this model and --kv)");
      return Shared(std::move(t).value());
    }
    log("compact storage level: the cached transform is unusable (" + t.status().message() + "): calibrating again");
  }
  const double t0 = util::MonotonicSeconds();
  KVX_ASSIGN_OR_RETURN(auto transform, CalibrateStorageOnText(engine, std::string(BundledCalibrationText())));
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.1f s", util::MonotonicSeconds() - t0);
  std::string where = "not stored: no cache directory (set KVX_TUNE_CACHE or HOME)";
  if (!cached.empty()) {
    std::filesystem::create_directories(cache_dir, ec);
    const Status st = kv::tier::WriteTransformFile(cached, *transform, identity);
    where = st.ok() ? "stored in " + cached : "not stored: " + st.message();
  }
  log("compact storage level: no transform for this model and --kv, calibrated one on the bundled text in " +
      std::string(seconds) + " (" + where + ")");
  return transform;
}

}  // namespace kvx::eval
