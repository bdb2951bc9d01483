// kvx bench: prefill and decode speed at several depths with the roofline
// (memory bandwidth, peak FLOP/s) measured in the same run.
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "engine/runtime.h"
#include "eval/speed_bench.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "util/printable.h"

namespace kvx::tools {

namespace {

struct BenchFlags {
  engine::RuntimeOptions runtime;
  std::string depths = "0,1024,4096,8192";
  std::string json_path;
  eval::SpeedBenchOptions bench;
};

Result<std::vector<int>> ParseDepths(const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      const long long v = std::stoll(item, &used);
      if (used != item.size() || v < 0 || v > kMaxContext) throw std::invalid_argument(item);
      out.push_back(static_cast<int>(v));
    } catch (const std::exception&) {
      return InvalidArgument("--depths: " + QuotePrintable(item, 64) + " is not an integer in 0.." +
                             std::to_string(kMaxContext) + " (example: --depths 0,1024,4096)");
    }
  }
  if (out.empty()) return InvalidArgument("--depths is empty (example: --depths 0,1024,4096)");
  return out;
}

Status RunBench(BenchFlags flags) {
  KVX_ASSIGN_OR_RETURN(flags.bench.depths, ParseDepths(flags.depths));
  int max_depth = 0;
  for (int d : flags.bench.depths) max_depth = std::max(max_depth, d);
  if (flags.runtime.n_ctx == 0) {
    flags.runtime.n_ctx = std::max(max_depth + flags.bench.gen_tokens + 1, flags.bench.prompt_tokens);
  }
  flags.runtime.n_batch = flags.bench.prompt_tokens;
  KVX_ASSIGN_OR_RETURN(auto rt, engine::Runtime::Create(flags.runtime));
  std::fprintf(stderr, "bench: measuring bandwidth, peak FLOP/s, prefill and decode at %zu depths...\n",
               flags.bench.depths.size());
  KVX_ASSIGN_OR_RETURN(eval::SpeedBenchResult r, eval::RunSpeedBench(rt.get(), flags.bench));
  std::printf("%s", r.ToTable().c_str());
  if (!flags.json_path.empty()) {
    std::ofstream out(flags.json_path);
    out << r.ToJson().dump(1) << "\n";
    if (!out) return IoError("cannot write " + flags.json_path);
  }
  return Status::Ok();
}

}  // namespace

void RegisterBench(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<BenchFlags>();
  CLI::App* cmd = app.add_subcommand("bench", "Prefill/decode speed at several depths against the measured roofline");
  cmd->add_option("-m,--model", flags->runtime.model_path, "GGUF model file")->required();
  cmd->add_option("-t,--threads", flags->runtime.n_threads, "Threads (0: all cores)")->capture_default_str()
      ->check(Threads());
  cmd->add_option("--depths", flags->depths, "Context depths for decode, comma-separated")->capture_default_str();
  cmd->add_option("--kv", flags->runtime.kv_spec, "KV cache spec (see README)");
  cmd->add_option("-p,--prompt-tokens", flags->bench.prompt_tokens, "Prefill batch size")->capture_default_str()
      ->check(IntIn(1, kMaxBatch));
  cmd->add_option("-n,--gen-tokens", flags->bench.gen_tokens, "Decoded tokens per depth and repetition")
      ->capture_default_str()
      ->check(IntIn(1, kMaxBatch));
  cmd->add_option("-r,--reps", flags->bench.reps, "Repetitions (medians are reported)")->capture_default_str()
      ->check(IntIn(1, 1000));
  cmd->add_option("-c,--ctx-size", flags->runtime.n_ctx, "Context (0: just enough for the depths)")
      ->capture_default_str()
      ->check(IntIn(0, kMaxContext, "0: just enough for the depths"));
  cmd->add_option("--json", flags->json_path, "Also write the results as JSON");
  cmd->callback([flags, exit_code] { *exit_code = ReportStatus(RunBench(*flags)); });
}

}  // namespace kvx::tools
