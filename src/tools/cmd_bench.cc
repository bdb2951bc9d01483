// kvx bench: prefill and decode speed at several depths with the roofline
// (memory bandwidth, peak FLOP/s) measured in the same run.
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>

#include "engine/session.h"
#include "eval/decode_compare.h"
#include "eval/speed_bench.h"
#include "model/model.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "util/output_file.h"
#include "util/printable.h"

namespace kvx::tools {

namespace {

struct BenchFlags {
  EngineFlags runtime;
  std::vector<std::string> kvs;  // several: the decode comparison (eval/decode_compare.h)
  std::string depths = "0,1024,4096,8192";
  std::string seqs;
  std::string seq_depths = "0,4096";
  std::string json_path;
  eval::SpeedBenchOptions bench;
  bool force = false;
};

Result<std::vector<int>> ParseList(const std::string& text, const std::string& flag) {
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
      return InvalidArgument(flag + ": " + QuotePrintable(item, 64) + " is not an integer in 0.." +
                             std::to_string(kMaxContext) + " (example: " + flag + " 0,1024,4096)");
    }
  }
  if (out.empty()) return InvalidArgument(flag + " is empty (example: " + flag + " 0,1024,4096)");
  return out;
}

// Several --kv: decode of each at --depths in interleaved rounds, one
// process, so the ratios between specs are ratios inside one run.
Status RunDecodeComparison(const BenchFlags& flags) {
  if (!flags.seqs.empty() || flags.bench.profile) {
    return InvalidArgument("--seqs and --profile take one --kv; several --kv compare decode speed at --depths only");
  }
  const engine::EngineOptions& eo = flags.runtime.options;
  eval::DecodeCompareOptions o;
  o.depths = flags.bench.depths;
  o.gen_tokens = flags.bench.gen_tokens;
  o.rounds = flags.bench.reps;
  o.seed = flags.bench.seed;
  std::vector<kv::KVSpec> specs;
  for (const std::string& text : flags.kvs) {
    KVX_ASSIGN_OR_RETURN(const std::string kv, ResolveAutoKV(text, eo.model_path));
    KVX_ASSIGN_OR_RETURN(kv::KVSpec spec, kv::ParseKVSpec(kv));
    specs.push_back(std::move(spec));
  }
  KVX_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> model, model::Model::Load(eo.model_path));
  ThreadPool threads(eo.n_threads);
  std::fprintf(stderr, "bench: decode of %zu specs at %zu depths, %d interleaved rounds...\n", specs.size(),
               o.depths.size(), o.rounds);
  KVX_ASSIGN_OR_RETURN(eval::DecodeCompareResult r, eval::RunDecodeCompare(*model, &threads, specs, o));
  std::printf("%s", r.ToTable().c_str());
  if (!flags.json_path.empty()) {
    KVX_RETURN_IF_ERROR(WriteFileAtomically(flags.json_path, r.ToJson().dump(1) + "\n"));
  }
  return Status::Ok();
}

Status RunBench(BenchFlags flags) {
  if (!flags.json_path.empty()) KVX_RETURN_IF_ERROR(CheckOutputFile(flags.json_path));
  KVX_ASSIGN_OR_RETURN(flags.bench.depths, ParseList(flags.depths, "--depths"));
  if (flags.kvs.size() > 1) {
    int deepest = 0;
    for (int d : flags.bench.depths) deepest = std::max(deepest, d);
    KVX_RETURN_IF_ERROR(CheckTrainedContext(flags.runtime.options.model_path, deepest, flags.force, "the deepest context (--depths)"));
    return RunDecodeComparison(flags);
  }
  if (!flags.kvs.empty()) flags.runtime.kv = flags.kvs[0];
  int max_depth = 0;
  for (int d : flags.bench.depths) max_depth = std::max(max_depth, d);
  if (!flags.seqs.empty()) {
    KVX_ASSIGN_OR_RETURN(flags.bench.seqs, ParseList(flags.seqs, "--seqs"));
    KVX_ASSIGN_OR_RETURN(flags.bench.seq_depths, ParseList(flags.seq_depths, "--seq-depths"));
    int most = 0;
    for (int n : flags.bench.seqs) {
      if (n < 1 || n > 1024) return InvalidArgument("--seqs: counts must be in 1..1024 (got " + std::to_string(n) + ")");
      most = std::max(most, n);
    }
    for (int d : flags.bench.seq_depths) max_depth = std::max(max_depth, d);
    flags.runtime.options.n_seqs = most;  // the pool holds the largest batch at its deepest
  }
  if (flags.runtime.options.n_ctx == 0) {
    flags.runtime.options.n_ctx = std::max(max_depth + flags.bench.gen_tokens + 1, flags.bench.prompt_tokens);
  }
  flags.runtime.options.n_batch = flags.bench.prompt_tokens;
  // The depths asked for (decode then runs -n tokens past the deepest).
  KVX_RETURN_IF_ERROR(CheckTrainedContext(flags.runtime.options.model_path,
                                          std::max(max_depth, flags.bench.prompt_tokens), flags.force,
                                          "the deepest context (--depths, --seq-depths, -p)"));
  KVX_ASSIGN_OR_RETURN(auto rt, LoadEngine(flags.runtime));
  std::fprintf(stderr, "bench: measuring bandwidth, peak FLOP/s, prefill and decode at %zu depths...\n",
               flags.bench.depths.size());
  KVX_ASSIGN_OR_RETURN(eval::SpeedBenchResult r, eval::RunSpeedBench(rt.get(), flags.bench));
  std::printf("%s", r.ToTable().c_str());
  if (!flags.json_path.empty()) {
    KVX_RETURN_IF_ERROR(WriteFileAtomically(flags.json_path, r.ToJson().dump(1) + "\n"));
  }
  return Status::Ok();
}

}  // namespace

void RegisterBench(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<BenchFlags>();
  CLI::App* cmd = app.add_subcommand("bench", "Prefill/decode speed at several depths against the measured roofline");
  AddEngineFlags(cmd, &flags->runtime,
                 ContextFlag{.help = "Context (0: just enough for the depths)", .hint = "0: just enough for the depths"},
                 &flags->kvs,
                 "several compare their decode speed at --depths in interleaved rounds (-r rounds of -n tokens)");
  cmd->add_option("--depths", flags->depths, "Context depths for decode, comma-separated")->capture_default_str();
  cmd->add_option("--seqs", flags->seqs, "Also decode N concurrent sequences in batched steps, e.g. 1,2,4,8,16,32");
  cmd->add_option("--seq-depths", flags->seq_depths, "Context depths for --seqs")->capture_default_str();
  cmd->add_option("-p,--prompt-tokens", flags->bench.prompt_tokens, "Prefill batch size")->capture_default_str()
      ->check(IntIn(1, kMaxBatch));
  cmd->add_option("-n,--gen-tokens", flags->bench.gen_tokens, "Decoded tokens per depth and repetition")
      ->capture_default_str()
      ->check(IntIn(1, kMaxBatch));
  cmd->add_option("-r,--reps", flags->bench.reps, "Repetitions (medians are reported)")->capture_default_str()
      ->check(IntIn(1, 1000));
  cmd->add_option("--json", flags->json_path, "Also write the results as JSON");
  cmd->add_flag("--profile", flags->bench.profile,
                "Also time each step's op groups (matmuls, attention, KV append, norms/RoPE, sampling, policy hooks, "
                "observers, step bookkeeping) for prefill and every --seqs configuration");
  AddForceFlag(cmd, &flags->force);
  cmd->callback([flags, exit_code] { *exit_code = ReportStatus(RunBench(*flags)); });
}

}  // namespace kvx::tools
