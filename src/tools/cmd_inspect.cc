// kvx inspect: a model's metadata, tensor table, config and KV bytes per token.
#include <cstdio>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "eval/cpu_report.h"
#include "gguf/gguf_file.h"
#include "kv/kv_manager.h"
#include "kv/kv_spec.h"
#include "kv/sequence_kv.h"
#include "model/config.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "util/printable.h"

namespace kvx::tools {

namespace {

struct InspectFlags {
  std::string model_path;
  bool all_tensors = false;
  std::vector<std::string> kv_specs;  // extra --kv specs to size
};

// The KV codecs `kvx inspect` always sizes (docs/kv-quantization.md explains them).
constexpr const char* kInspectSpecs[] = {
    "codec=f32",
    "codec=f16",
    "codec=int8",
    "codec=int4",
    "codec=int4,group=64,rotate=hadamard",
    "codec=int2",
    "codec=kivi4,page=128,group=64",
    "codec=kivi2,page=32",
    "codec=kivi2,page=128,group=64",
};

Status Inspect(const InspectFlags& flags) {
  KVX_ASSIGN_OR_RETURN(auto file, gguf::GgufFile::Open(flags.model_path));
  // Every string from the file goes through Printable() (util/printable.h):
  // a hostile file's keys and names may hold NULs or terminal escapes.
  std::printf("file: %s\nGGUF version %u, alignment %llu, %zu metadata keys, %zu tensors\n\n",
              Printable(flags.model_path, 4096).c_str(), file->version(),
              static_cast<unsigned long long>(file->alignment()), file->metadata().size(), file->tensors().size());
  std::printf("metadata:\n");
  for (const auto& [key, value] : file->metadata()) {
    std::printf("  %-44s %s\n", Printable(key).c_str(), gguf::GgufFile::ValueToString(value).c_str());
  }
  std::printf("\ntensors:\n  %-36s %-6s %-22s %12s\n", "name", "type", "shape", "bytes");
  uint64_t total = 0;
  size_t shown = 0;
  for (const auto& t : file->tensors()) {
    total += t.n_bytes;
    if (!flags.all_tensors && shown >= 40) continue;
    ++shown;
    std::string shape;
    for (size_t i = 0; i < t.dims.size(); ++i) shape += (i ? " x " : "") + std::to_string(t.dims[i]);
    std::printf("  %-36s %-6s %-22s %12llu\n", Printable(t.name).c_str(), gguf::TensorTypeName(t.type).c_str(),
                shape.c_str(), static_cast<unsigned long long>(t.n_bytes));
  }
  if (shown < file->tensors().size()) {
    std::printf("  ... %zu more (use --all)\n", file->tensors().size() - shown);
  }
  std::printf("  total tensor bytes: %llu (%.2f MiB)\n\n", static_cast<unsigned long long>(total),
              total / (1024.0 * 1024.0));

  auto config = model::ModelConfig::FromGguf(*file);
  if (!config.ok()) {
    std::printf("model: not runnable by kvx: %s\n", Printable(config.status().message(), 4096).c_str());
    return Status::Ok();
  }
  std::printf("model: %s\n\n", config->ToString().c_str());
  kv::KVLayout layout;
  layout.n_layers = config->n_layers;
  layout.n_kv_heads = config->n_kv_heads;
  layout.head_dim = config->head_dim;
  const int ctx = config->n_ctx_train;
  std::printf("KV cache bytes per token (all layers, K+V, positions included; asymptotic = once pages are packed,\n"
              "f16 residual/sink pages excluded; the last column counts them, for one sequence of %d tokens):\n",
              ctx);
  std::printf("  %-42s %12s %8s %14s\n", "--kv", "bytes/token", "vs f16", "MiB @ ctx");
  std::vector<std::string> specs(std::begin(kInspectSpecs), std::end(kInspectSpecs));
  specs.insert(specs.end(), flags.kv_specs.begin(), flags.kv_specs.end());
  const size_t f16 = kv::BytesPerToken(layout, kv::CodecConfig(kv::CodecId::kF16));
  Status user_spec_status = Status::Ok();
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string& spec_text = specs[i];
    KVX_ASSIGN_OR_RETURN(kv::KVSpec spec, kv::ParseKVSpec(spec_text));
    // The same resolution and checks as every command that runs the spec.
    const auto resolved = kv::ResolveKVSpec(spec, layout, std::max(ctx, 1), 1);
    if (!resolved.ok()) {
      const Status& valid = resolved.status();
      std::printf("  %-42s n/a: %s\n", Printable(spec_text).c_str(), Printable(valid.message(), 4096).c_str());
      // A built-in row may not apply to this model; a --kv the user asked
      // for that cannot apply is an error (exit 1), after the table.
      if (i >= std::size(kInspectSpecs) && user_spec_status.ok()) user_spec_status = valid;
      continue;
    }
    const kv::KVLayout& l = resolved->layout;
    const size_t per_token = kv::BytesPerToken(l, resolved->layers);
    std::printf("  %-42s %12zu %7.2fx %14.2f\n", Printable(spec_text).c_str(), per_token,
                static_cast<double>(f16) / per_token,
                kv::BytesForContext(l, resolved->layers, ctx) / (1024.0 * 1024.0));
  }
  // The machine this would run on: what kvx detected and the kernels it chose.
  std::printf("\n%s", eval::DescribeCpu().ToText().c_str());
  return user_spec_status;
}

}  // namespace

void RegisterInspect(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<InspectFlags>();
  CLI::App* cmd = app.add_subcommand("inspect", "Show a GGUF model's metadata, tensors and KV bytes per token");
  cmd->add_option("model", flags->model_path, "GGUF model file")->required();
  cmd->add_flag("--all", flags->all_tensors, "List every tensor");
  AddKVFlag(cmd, &flags->kv_specs, "also size this spec");
  cmd->callback([flags, exit_code] { *exit_code = ReportStatus(Inspect(*flags)); });
}

}  // namespace kvx::tools
