// kvx calibrate-heads: the head table of policy=duo / policy=razor
// (eval/head_calibration.h, kv/policy/head_typing.h).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "eval/head_calibration.h"
#include "model/model.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "util/mmap_file.h"
#include "util/output_file.h"
#include "util/thread_pool.h"

namespace kvx::tools {
namespace {

struct CalibrateFlags {
  EngineFlags runtime;
  eval::HeadCalibrationOptions options;
  std::string out;
  std::string text_path = "../shared/data/prose/jargon-4.4.7.txt";
  bool force = false;
};

Status RunCalibrate(CalibrateFlags flags) {
  KVX_RETURN_IF_ERROR(CheckOutputFile(flags.out));
  engine::EngineOptions options = flags.runtime.options;
  KVX_ASSIGN_OR_RETURN(options.kv_spec, kv::ParseKVSpec(flags.runtime.kv));
  // Each method's own prompts: razor's repeated span, duo's lengths.
  int longest = flags.options.method == "razor" ? flags.options.span * flags.options.repeats + 1 : 0;
  if (flags.options.method == "duo") {
    for (int n : flags.options.lengths) longest = std::max(longest, n);
  }
  if (options.n_ctx == 0) options.n_ctx = longest;
  KVX_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> model, model::Model::Load(options.model_path));
  // Prompts longer than the model was trained on measure heads at positions
  // it never saw, at a cost that grows without bound (--lengths allows 2^20).
  KVX_RETURN_IF_ERROR(CheckTrainedContext(longest, model->config().n_ctx_train, flags.force,
                                          "the longest calibration prompt (--lengths, or --span x --repeats)"));
  const bool copy = flags.options.method == "duo" && flags.options.calib == "copy";
  if (copy) {
    KVX_ASSIGN_OR_RETURN(flags.options.text, ReadNonEmptyTextFile(flags.text_path));
  }
  ThreadPool threads(options.n_threads);
  KVX_ASSIGN_OR_RETURN(auto engine, engine::Engine::Create(model.get(), &threads, options));
  if (!engine->kv_spec().policies.empty()) {
    return InvalidArgument("calibrate-heads measures the full cache: drop the policy from --kv");
  }
  KVX_ASSIGN_OR_RETURN(kv::HeadTable table, eval::CalibrateHeads(*engine, flags.options));
  table.model = flags.runtime.options.model_path;
  if (copy) table.calib += ": " + flags.text_path;
  KVX_RETURN_IF_ERROR(table.Save(flags.out));
  std::printf("calibrate-heads (%s, %s): %d layers x %d kv heads -> %s\n", table.method.c_str(),
              table.calib.c_str(), table.n_layers, table.n_kv_heads, flags.out.c_str());
  for (int l = 0; l < table.n_layers; ++l) {
    std::printf("  layer %2d:", l);
    for (int h = 0; h < table.n_kv_heads; ++h) std::printf(" %.4f", table.scores[static_cast<size_t>(l) * table.n_kv_heads + h]);
    std::printf("\n");
  }
  return Status::Ok();
}

}  // namespace

void RegisterCalibrateHeads(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<CalibrateFlags>();
  CLI::App* cmd = app.add_subcommand("calibrate-heads", "Score each (layer, kv head) as retrieval or streaming "
                                                        "(the head table of --kv policy=duo / policy=razor)");
  AddEngineFlags(cmd, &flags->runtime,
                 ContextFlag{.help = "Context (0: the longest prompt)", .max = 1 << 20, .hint = ""});
  cmd->add_option("-o,--output", flags->out, "Head table file to write (JSON)")->required();
  cmd->add_option("--method", flags->options.method,
                  "duo (attention mass a streaming head would drop) | razor (echo/induction on repeated random tokens)")
      ->capture_default_str()->check(CLI::IsMember({"duo", "razor"}));
  cmd->add_option("--calib", flags->options.calib,
                  "duo's data: copy (a span of --text repeated past the window; no eval task uses it) | passkey "
                  "(llama.cpp's passkey prompts: the family kvx eval scores, a leak)")
      ->capture_default_str()->check(CLI::IsMember({"copy", "passkey"}));
  cmd->add_option("--text", flags->text_path, "duo copy: natural text the spans come from")->capture_default_str();
  cmd->add_option("--copy-span", flags->options.copy_span, "duo copy: tokens repeated")->capture_default_str()
      ->check(IntIn(2, 512));
  cmd->add_option("--sinks", flags->options.sinks, "duo: sinks a streaming head keeps")->capture_default_str()
      ->check(IntIn(0, 1 << 20));
  cmd->add_option("--window", flags->options.window, "duo: recent entries a streaming head keeps")
      ->capture_default_str()->check(IntIn(1, 1 << 20));
  cmd->add_option("--lengths", flags->options.lengths, "duo: passkey prompt lengths in tokens")
      ->delimiter(',')->capture_default_str()->check(IntIn(64, 1 << 20));
  cmd->add_option("--depths", flags->options.depths, "duo: depths in [0, 1] of the key (passkey) or of the span's original (copy)")->delimiter(',')
      ->capture_default_str()->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--trials", flags->options.trials, "duo: prompts per (length, depth)")->capture_default_str()
      ->check(IntIn(1, 1000));
  cmd->add_option("--span", flags->options.span, "razor: random tokens per copy")->capture_default_str()
      ->check(IntIn(2, 512));
  cmd->add_option("--repeats", flags->options.repeats, "razor: copies of the span")->capture_default_str()
      ->check(IntIn(2, 64));
  cmd->add_option("--seed", flags->options.seed, "Prompt seed")->capture_default_str();
  AddForceFlag(cmd, &flags->force);
  cmd->callback([flags, exit_code] { *exit_code = ReportStatus(RunCalibrate(*flags)); });
}

}  // namespace kvx::tools
