// kvx plan: the analytical deployment model (eval/plan.h) for a model or a
// model shape, a context length, a memory size and a KV spec; with
// --measure, the measured prefill and decode speeds beside the bounds.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "engine/session.h"
#include "eval/plan.h"
#include "eval/roofline.h"
#include "eval/speed_bench.h"
#include "kv/kv_manager.h"
#include "kv/kv_spec.h"
#include "kv/sequence_kv.h"
#include "model/synthetic_model.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "util/byte_size.h"
#include "util/printable.h"
#include "util/thread_pool.h"

namespace kvx::tools {

namespace {

struct PlanFlags {
  std::string model_path;
  std::string shape;
  std::string type = "q8_0";
  std::string kv_spec;
  std::string mem = "16G";
  long ctx = 4096;
  int threads = 0;
  bool measure = false;
  std::string tier_dir = "/tmp";
};

// --tier-dir must be a directory kvx can write a probe file into; a missing
// folder used to measure as 0 GB/s and give an infinite context switch.
Status CheckTierDir(const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    return NotFound("--tier-dir " + QuotePrintable(dir, 4096) + " does not exist: " + std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode)) return InvalidArgument("--tier-dir " + QuotePrintable(dir, 4096) + " is not a directory");
  if (::access(dir.c_str(), W_OK) != 0) {
    return InvalidArgument("--tier-dir " + QuotePrintable(dir, 4096) + " is not writable: " + std::strerror(errno));
  }
  return Status::Ok();
}

Status RunPlan(const PlanFlags& flags) {
  if (flags.model_path.empty() == flags.shape.empty()) return InvalidArgument("give exactly one of -m MODEL or --shape NAME");
  if (flags.ctx <= 0) return InvalidArgument("--ctx must be positive");
  if (flags.measure && flags.model_path.empty()) {
    return InvalidArgument("--measure needs a model file (-m); make one with kvx gen-model --shape ...");
  }
  eval::PlanInputs in;
  auto mem = ParseByteSize(flags.mem);
  if (!mem.ok()) return InvalidArgument("--mem " + mem.status().message());
  in.mem_bytes = static_cast<double>(*mem);
  if (in.mem_bytes <= 0) return InvalidArgument("--mem must be a positive size, e.g. --mem 16G");
  KVX_RETURN_IF_ERROR(CheckTierDir(flags.tier_dir));
  KVX_ASSIGN_OR_RETURN(const kv::KVSpec spec, kv::ParseKVSpec(flags.kv_spec));  // its one parse
  in.ctx = flags.ctx;
  std::unique_ptr<engine::Engine> rt;
  gguf::TensorType shape_type = gguf::TensorType::kF32;
  if (!flags.model_path.empty()) {
    engine::EngineOptions ro;
    ro.model_path = flags.model_path;
    ro.kv_spec = spec;
    ro.n_threads = flags.threads;
    ro.n_ctx = static_cast<int>(std::min<long>(flags.ctx + 64, 1 << 30));
    KVX_ASSIGN_OR_RETURN(rt, engine::Engine::Load(ro));
    eval::PlanInputs model_in = eval::ModelPlanInputs(*rt);
    model_in.ctx = in.ctx;
    model_in.mem_bytes = in.mem_bytes;
    in = model_in;
    const kv::KVManager& m = rt->kv_manager();
    in.kv_bytes_per_token = kv::SteadyStateBytesPerToken(m.spec(), m.policies(), static_cast<int>(std::min<long>(in.ctx, 1 << 30)));
  } else {
    KVX_ASSIGN_OR_RETURN(model::ModelShape s, model::FindModelShape(flags.shape));
    gguf::TensorType& type = shape_type;
    if (!gguf::ParseTensorType(flags.type, &type)) return InvalidArgument("unknown --type '" + flags.type + "'");
    const model::ShapeWeightBytes w = model::ComputeShapeWeightBytes(s, type);
    in.model = s.name + " (" + flags.type + ")";
    in.n_layers = s.n_layers;
    in.n_heads = s.n_heads;
    in.head_dim = s.n_embd / s.n_heads;
    in.n_embd = s.n_embd;
    in.n_vocab = s.n_vocab;
    in.weight_bytes = w.total;
    in.decode_weight_bytes = w.decode_per_token;
    in.matmul_flops_per_token = w.matmul_flops_per_token;
    kv::KVLayout layout;
    layout.n_layers = s.n_layers;
    layout.n_kv_heads = s.n_kv_heads;
    layout.head_dim = in.head_dim;
    // The same resolution and checks as every command that runs the spec.
    KVX_ASSIGN_OR_RETURN(kv::ResolvedKVSpec resolved,
                         kv::ResolveKVSpec(spec, layout, static_cast<int>(std::min<long>(flags.ctx, 1 << 30)), 1));
    in.kv_bytes_per_token =
        kv::SteadyStateBytesPerToken(resolved, resolved.policies, static_cast<int>(std::min<long>(flags.ctx, 1 << 30)));
    in.kv_spec = spec.ToString();
  }
  ThreadPool own_pool(flags.threads);
  ThreadPool* pool = rt ? &rt->threads() : &own_pool;
  std::fprintf(stderr, "plan: measuring memory bandwidth, peak FLOP/s and disk write speed...\n");
  in.bandwidth_gbps = eval::MeasureBandwidth(pool).read_gbps;
  // The matmuls' compute bound is the arithmetic they run: int8 dot products
  // for quantized weights (as kvx bench does), float FMAs otherwise;
  // attention always runs float FMAs (plan.h).
  const bool int8_matmuls = rt ? eval::Int8MatmulFraction(rt->model()) >= 0.5 : eval::UsesInt8Dot(shape_type);
  const eval::PeakInt8Result int8_peak = int8_matmuls ? eval::MeasurePeakInt8(pool) : eval::PeakInt8Result{};
  in.fma_peak_gflops = eval::MeasurePeakFlops(pool).gflops;
  in.matmul_peak_is_int8 = int8_peak.gops > 0;
  in.matmul_peak_gops = in.matmul_peak_is_int8 ? int8_peak.gops : in.fma_peak_gflops;
  in.tier_gbps = eval::MeasureDiskWriteGbps(flags.tier_dir);
  if (!(in.tier_gbps > 0)) {
    return IoError("cannot measure the write speed of --tier-dir " + QuotePrintable(flags.tier_dir, 4096) +
                   ": writing a probe file there failed (is the disk full?)");
  }
  const eval::PlanResult plan = eval::ComputePlan(in);
  std::printf("%s", plan.ToString(in).c_str());
  if (plan.concurrency == 0) {
    std::printf("\nThe weights plus one sequence's KV cache do not fit in %s: raise --mem, shorten --ctx or "
                "compress the KV cache (--kv).\n", flags.mem.c_str());
  }
  if (flags.measure) {
    eval::SpeedBenchOptions bo;
    bo.depths = {static_cast<int>(flags.ctx)};
    // Long enough that attention's ops, bounded by the FMA peak, weigh in
    // (a quarter of SmolLM2-135M's at 2048 tokens, 8% at 512), short enough
    // to take seconds on small models.
    bo.prompt_tokens = static_cast<int>(std::min<long>(flags.ctx, 2048));
    bo.gen_tokens = 8;
    bo.reps = 3;
    std::fprintf(stderr, "plan: measuring prefill (%d tokens) and decode at depth %ld...\n", bo.prompt_tokens,
                 flags.ctx);
    KVX_ASSIGN_OR_RETURN(eval::SpeedBenchResult m, eval::RunSpeedBench(rt.get(), bo));
    const double bound_prefill = bo.prompt_tokens / eval::PrefillBoundSeconds(in, bo.prompt_tokens);
    std::printf("\n| measured vs model (one sequence) | model bound | measured | measured/bound |\n|---|---|---|---|\n");
    std::printf("| prefill of %d tokens, tok/s | %.1f | %.1f | %.1f%% |\n", bo.prompt_tokens, bound_prefill,
                m.prefill_tok_s, 100.0 * m.prefill_tok_s / bound_prefill);
    std::printf("| decode at depth %ld, tok/s | %.1f | %.1f | %.1f%% |\n", flags.ctx, plan.single_decode_tok_s,
                m.depths[0].decode_tok_s, 100.0 * m.depths[0].decode_tok_s / plan.single_decode_tok_s);
    std::printf("| KV bytes at depth %ld | %.0f | %.0f | |\n", flags.ctx, plan.kv_per_seq_bytes, m.depths[0].kv_bytes);
    std::printf("\nConcurrency and the batched decode throughput are not measured yet: kvx has no batch "
                "scheduler (a later issue).\n");
  }
  return Status::Ok();
}

}  // namespace

void RegisterPlan(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<PlanFlags>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Analytical deployment model: concurrency, prefill, decode throughput, context-switch time");
  auto* m = cmd->add_option("-m,--model", flags->model_path, "GGUF model file");
  cmd->add_option("--shape", flags->shape, "Model shape instead of a file (see kvx gen-model --list)")->excludes(m);
  cmd->add_option("--type", flags->type, "Weight type for --shape")->capture_default_str();
  cmd->add_option("--ctx", flags->ctx, "Context length per sequence")->capture_default_str()
      ->check(IntIn(1, kMaxContext));
  cmd->add_option("--mem", flags->mem, "Memory for weights + KV (bytes, K/M/G suffixes)")->capture_default_str();
  AddKVFlag(cmd, &flags->kv_spec);
  cmd->add_option("-t,--threads", flags->threads, "Threads (0: all cores)")->capture_default_str()
      ->check(Threads());
  cmd->add_option("--tier-dir", flags->tier_dir, "Directory whose write speed bounds the context switch")
      ->capture_default_str();
  cmd->add_flag("--measure", flags->measure, "Also measure prefill and decode at --ctx (needs -m)");
  cmd->callback([flags, exit_code] { *exit_code = ReportStatus(RunPlan(*flags)); });
}

}  // namespace kvx::tools
