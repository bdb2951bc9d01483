// kvx calibrate-storage: the storage transform of the KV tiers' `compact`
// level (kv/tier/storage_transform.h) for a model and --kv spec, written to
// a side file a server reads with --storage-transform, or by default into
// the tune cache where a server started with --cache-codec compact finds it
// (eval/storage_transform_cache.h).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "eval/storage_transform_cache.h"
#include "eval/tune_cache.h"
#include "kv/tier/storage_transform_file.h"
#include "model/fingerprint.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "util/clock.h"
#include "util/mmap_file.h"
#include "util/output_file.h"

namespace kvx::tools {
namespace {

struct CalibrateStorageFlags {
  EngineFlags runtime;
  std::string text_path;  // "": the bundled text
  std::string out;        // "": the tune cache
  kv::tier::CompactRates rates = kv::tier::DefaultCompactRates();
};

Status RunCalibrateStorage(CalibrateStorageFlags flags) {
  if (!flags.out.empty()) KVX_RETURN_IF_ERROR(CheckOutputFile(flags.out));
  std::string text(eval::BundledCalibrationText());
  if (!flags.text_path.empty()) {
    KVX_ASSIGN_OR_RETURN(text, ReadNonEmptyTextFile(flags.text_path));
  }
  KVX_ASSIGN_OR_RETURN(auto engine, LoadEngine(flags.runtime));
  if (!engine->kv_spec().policies.empty()) {
    return InvalidArgument("calibrate-storage calibrates the pool's pages: drop the policy from --kv");
  }
  const kv::ResolvedKVSpec& spec = engine->kv_manager().spec();
  KVX_ASSIGN_OR_RETURN(const kv::tier::BlockSpace space,
                       kv::tier::MakeBlockSpace(spec, model::ModelFingerprint(engine->model().file()),
                                                spec.layout.page_tokens));
  const kv::tier::TransformIdentity identity = kv::tier::IdentityOf(space);
  std::string out = flags.out;
  if (out.empty()) {
    const std::string dir = eval::TuneCacheDir();
    if (dir.empty()) return InvalidArgument("no cache directory (set KVX_TUNE_CACHE or HOME), so give -o FILE");
    out = dir + "/" + eval::StorageTransformCacheName(identity);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return InvalidArgument("cannot create the cache directory " + dir + ": " + ec.message() + " (give -o FILE)");
  }
  const double t0 = util::MonotonicSeconds();
  KVX_ASSIGN_OR_RETURN(auto transform, eval::CalibrateStorageOnText(*engine, std::move(text), flags.rates));
  const double seconds = util::MonotonicSeconds() - t0;
  KVX_RETURN_IF_ERROR(kv::tier::WriteTransformFile(out, *transform, identity));
  std::printf("calibrate-storage (%s, rates %s, %.1f s): %s, digest %016llx -> %s\n",
              flags.text_path.empty() ? "the bundled text" : flags.text_path.c_str(),
              kv::tier::FormatCompactRates(flags.rates).c_str(), seconds, identity.ToString().c_str(),
              static_cast<unsigned long long>(transform->digest()), out.c_str());
  return Status::Ok();
}

}  // namespace

void RegisterCalibrateStorage(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<CalibrateStorageFlags>();
  CLI::App* cmd = app.add_subcommand("calibrate-storage",
                                     "Calibrate the storage transform of --cache-codec compact (PCA per layer, kv "
                                     "head, K and V of the pool's KV) for a model and --kv spec");
  AddEngineFlags(cmd, &flags->runtime);
  cmd->add_option("-f,--file", flags->text_path,
                  "Calibration text (its first 8192 tokens, in chunks of 2048; default: the bundled first 60 KB "
                  "of the Jargon File, no eval task's text)")
      ->check(CLI::ExistingFile);
  cmd->add_option("-o,--output", flags->out,
                  "Transform file to write (default: the tune cache, where serve and batch find it for this model "
                  "and --kv)");
  AddCompactRatesOption(cmd, "--rates", &flags->rates);
  cmd->callback([flags, exit_code] { *exit_code = ReportStatus(RunCalibrateStorage(*flags)); });
}

}  // namespace kvx::tools
