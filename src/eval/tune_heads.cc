#include "eval/tune_heads.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "engine/engine.h"

namespace kvx::eval {

std::string TuneHeadTableName(uint64_t fingerprint, const HeadCalibrationOptions& options) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(fingerprint));
  const std::string data = options.method == "duo" ? "-" + options.calib : "";
  return std::string(hex) + "-heads-" + options.method + data + ".json";
}

Result<std::string> EnsureHeadTable(const model::Model& model, ThreadPool* threads, const std::string& path,
                                    HeadCalibrationOptions options, bool* calibrated) {
  *calibrated = false;
  if (path.find_first_of(",;") != std::string::npos) {
    return InvalidArgument("head table path '" + path + "' holds ',' or ';', which a --kv spec cannot name: " +
                           "choose another path");
  }
  const kv::KVLayout layout = model.KVLayoutFor(16);
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) {
    KVX_ASSIGN_OR_RETURN(kv::HeadTable table, kv::HeadTable::Load(path));
    if (table.n_layers != layout.n_layers || table.n_kv_heads != layout.n_kv_heads) {
      return InvalidArgument("head table " + path + " is for " + std::to_string(table.n_layers) + " layers x " +
                             std::to_string(table.n_kv_heads) + " kv heads, the model has " +
                             std::to_string(layout.n_layers) + " x " + std::to_string(layout.n_kv_heads) +
                             ": delete it (tune calibrates a new one) or name another file");
    }
    return path;
  }
  // Prompts the model was trained for: the lengths past its context are
  // dropped (none left: its trained context itself).
  const int trained = model.config().n_ctx_train;
  if (trained > 0) {
    std::erase_if(options.lengths, [&](int n) { return n > trained; });
    if (options.lengths.empty()) options.lengths = {trained};
  }
  engine::EngineOptions eo;
  eo.n_ctx = options.method == "razor" ? options.span * options.repeats + 1
                                       : *std::max_element(options.lengths.begin(), options.lengths.end());
  KVX_ASSIGN_OR_RETURN(auto engine, engine::Engine::Create(&model, threads, eo));
  KVX_ASSIGN_OR_RETURN(kv::HeadTable table, CalibrateHeads(*engine, options));
  table.model = model.config().name;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  KVX_RETURN_IF_ERROR(table.Save(path));
  *calibrated = true;
  return path;
}

}  // namespace kvx::eval
