// kvx gen-model: write a GGUF with random weights and a real model's shape.
#include <cstdio>
#include <memory>
#include <string>

#include "model/synthetic_model.h"
#include "tools/commands.h"
#include "tools/flags.h"

namespace kvx::tools {

namespace {

struct GenModelFlags {
  std::string shape;
  std::string type = "q8_0";
  std::string output;
  uint64_t seed = 1;
  float init_std = 0.02f;
  bool list = false;
};

Status GenModel(const GenModelFlags& flags) {
  if (flags.list || flags.shape.empty()) {
    std::printf("%-14s %-6s %8s %6s %7s %6s %4s %6s %7s  %s\n", "shape", "arch", "vocab", "embd", "layers", "heads",
                "kv", "ffn", "ctx", "mirrors");
    for (const auto& s : model::ModelShapes()) {
      std::printf("%-14s %-6s %8d %6d %7d %6d %4d %6d %7d  %s\n", s.name.c_str(), s.arch.c_str(), s.n_vocab,
                  s.n_embd, s.n_layers, s.n_heads, s.n_kv_heads, s.n_ff, s.n_ctx, s.description.c_str());
    }
    if (!flags.list) return InvalidArgument("give --shape NAME (one of the shapes above)");
    return Status::Ok();
  }
  if (flags.output.empty()) return InvalidArgument("give the output file with -o FILE");
  model::SyntheticModelOptions o;
  o.shape = flags.shape;
  o.seed = flags.seed;
  o.init_std = flags.init_std;
  if (!(o.init_std > 0 && o.init_std < 100)) return InvalidArgument("--init-std must be in (0, 100)");
  if (!gguf::ParseTensorType(flags.type, &o.type)) {
    return InvalidArgument("unknown weight type '" + flags.type + "'; use one of " +
                           gguf::SupportedWeightTypesList());
  }
  KVX_RETURN_IF_ERROR(model::WriteSyntheticModel(o, flags.output));
  std::fprintf(stderr, "wrote %s (shape %s, %s weights, seed %llu)\n", flags.output.c_str(), flags.shape.c_str(),
               flags.type.c_str(), static_cast<unsigned long long>(flags.seed));
  return Status::Ok();
}

}  // namespace

void RegisterGenModel(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<GenModelFlags>();
  CLI::App* cmd = app.add_subcommand("gen-model", "Write a GGUF with random weights and a real model's shape");
  cmd->add_option("--shape", flags->shape, "Model shape (see --list)");
  cmd->add_option("--type", flags->type, "Weight type: f32, f16, bf16, q8_0, q4_0, q4_K, q5_K, q6_K")
      ->capture_default_str();
  cmd->add_option("-o,--output", flags->output, "Output GGUF file");
  cmd->add_option("--seed", flags->seed, "Random seed")->capture_default_str();
  cmd->add_option("--init-std", flags->init_std,
                  "Standard deviation of the random weights (larger: peakier next-token distributions)")
      ->capture_default_str()
      ->check(NumberIn(0, 100, true, true));
  cmd->add_flag("--list", flags->list, "List the known shapes");
  cmd->callback([flags, exit_code] { *exit_code = ReportStatus(GenModel(*flags)); });
}

}  // namespace kvx::tools
