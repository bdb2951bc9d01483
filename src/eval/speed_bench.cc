#include "eval/speed_bench.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iterator>
#include <random>
#include <string_view>

#include "kv/sequence_kv.h"
#include "model/sampler.h"
#include "ops/simd_target.h"
#include "util/clock.h"

namespace kvx::eval {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

namespace {

std::vector<int32_t> RandomTokens(int n, int n_vocab, std::mt19937* rng) {
  std::uniform_int_distribution<int32_t> pick(0, n_vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = pick(*rng);
  return t;
}

// Profiles what runs in its scope when `on` (kvx bench --profile), adding
// the scope's wall time to *wall_s; the profile is off outside, so the
// setup between timed steps (fills, session creation) is not counted.
class ProfileWindow {
 public:
  ProfileWindow(bool on, double* wall_s) : on_(on), wall_s_(wall_s), t0_(util::MonotonicSeconds()) {
    if (on_) util::EnableStepProfile(true);
  }
  ~ProfileWindow() {
    if (on_) util::EnableStepProfile(false);
    *wall_s_ += util::MonotonicSeconds() - t0_;
  }

 private:
  bool on_;
  double* wall_s_;
  double t0_;
};

}  // namespace

Status FillDepth(engine::Engine* rt, engine::Session* session, int depth, uint64_t seed, std::mt19937* rng) {
  session->Reset();
  if (rt->kv_spec().policies.empty()) return session->AppendSyntheticKV(depth, seed);
  if (depth == 0) return Status::Ok();
  const auto tokens = RandomTokens(depth, rt->model().config().n_vocab, rng);
  KVX_RETURN_IF_ERROR(session->Feed(tokens).status());
  return session->Compress();
}

double StepProfileResult::unaccounted_ms() const {
  double sum = 0;
  for (double ms : phase_ms) sum += ms;
  return step_ms - sum;
}

StepProfileResult StepProfileResult::From(const util::StepProfileTotals& t, int steps, double wall_s) {
  StepProfileResult p;
  p.measured = true;
  if (steps <= 0) return p;
  p.step_ms = 1e3 * wall_s / steps;
  for (int i = 0; i < util::kStepPhases; ++i) p.phase_ms[i] = 1e-6 * static_cast<double>(t.ns[i]) / steps;
  p.observer_thread_ms = 1e-6 * static_cast<double>(t.observer_thread_ns) / steps;
  return p;
}

nlohmann::json StepProfileResult::ToJson() const {
  nlohmann::json j = {{"step_ms", step_ms}, {"observer_thread_ms", observer_thread_ms},
                      {"unaccounted_ms", unaccounted_ms()}};
  for (int i = 0; i < util::kStepPhases; ++i) {
    j["phase_ms"][std::string(util::StepPhaseName(static_cast<util::StepPhase>(i)))] = phase_ms[i];
  }
  return j;
}

double CurrentRssBytes() {
  long pages_total = 0, pages_resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  const int got = std::fscanf(f, "%ld %ld", &pages_total, &pages_resident);
  std::fclose(f);
  return got == 2 ? static_cast<double>(pages_resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) : 0;
}

PlanInputs ModelPlanInputs(const engine::Engine& rt) {
  const model::Model& m = rt.model();
  const model::ModelConfig& c = m.config();
  PlanInputs in;
  in.model = c.name.empty() ? c.arch_name : c.name;
  in.n_layers = c.n_layers;
  in.n_heads = c.n_heads;
  in.head_dim = c.head_dim;
  in.n_embd = c.n_embd;
  in.n_vocab = c.n_vocab;
  in.weight_bytes = static_cast<double>(m.WeightBytes());
  in.decode_weight_bytes = static_cast<double>(m.DecodeWeightBytesPerToken());
  in.matmul_flops_per_token = m.MatmulFlopsPerToken();
  in.kv_bytes_per_token =
      static_cast<double>(kv::BytesPerToken(m.KVLayoutFor(rt.kv_spec().page_tokens), rt.kv_spec().codec));
  in.kv_spec = rt.kv_spec().ToString();
  return in;
}

double Int8MatmulFraction(const model::Model& m) {
  static constexpr std::string_view kMatrices[] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                                   "ffn_gate", "ffn_up", "ffn_down"};
  double all = 0, int8 = 0;
  for (const gguf::TensorInfo& t : m.file().tensors()) {
    // blk.<layer>.<matrix>.weight
    std::string_view name = t.name;
    if (!name.starts_with("blk.") || !name.ends_with(".weight")) continue;
    name.remove_prefix(4);
    const size_t dot = name.find('.');
    if (dot == std::string_view::npos) continue;
    name = name.substr(dot + 1, name.size() - dot - 1 - 7);
    if (std::find(std::begin(kMatrices), std::end(kMatrices), name) == std::end(kMatrices)) continue;
    const double macs = static_cast<double>(t.n_elements);  // per token
    all += macs;
    if (UsesInt8Dot(t.type)) int8 += macs;
  }
  return all > 0 ? int8 / all : 0;
}

double PeakRssBytes() {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) * 1024.0;
}

Result<SpeedBenchResult> RunSpeedBench(engine::Engine* rt, const SpeedBenchOptions& o) {
  if (o.reps <= 0 || o.gen_tokens <= 0 || o.prompt_tokens <= 0) {
    return InvalidArgument("repetitions, generated tokens and prompt tokens must be positive");
  }
  const model::Model& m = rt->model();
  const model::ModelConfig& c = m.config();
  int max_depth = o.depths.empty() ? 0 : *std::max_element(o.depths.begin(), o.depths.end());
  if (!o.seqs.empty()) {
    for (int d : o.seq_depths) max_depth = std::max(max_depth, d);
    for (int n : o.seqs) {
      if (n < 1) return InvalidArgument("--seqs: sequence counts must be positive");
    }
  }
  if (max_depth + o.gen_tokens + 1 > rt->n_ctx() || o.prompt_tokens > rt->n_ctx()) {
    return InvalidArgument("the context (" + std::to_string(rt->n_ctx()) + ") is too small for depth " +
                           std::to_string(max_depth) + " + " + std::to_string(o.gen_tokens) +
                           " generated tokens; raise -c");
  }
  SpeedBenchResult r;
  r.model = c.name.empty() ? c.arch_name : c.name;
  r.kv_spec = rt->kv_spec().ToString();
  r.threads = rt->threads().size();
  r.weight_bytes = static_cast<double>(m.WeightBytes());
  r.decode_weight_bytes = static_cast<double>(m.DecodeWeightBytesPerToken());
  r.kv_bytes_per_token =
      static_cast<double>(kv::BytesPerToken(m.KVLayoutFor(rt->kv_spec().page_tokens), rt->kv_spec().codec));
  r.matmul_ops_per_token = m.MatmulFlopsPerToken() + 2.0 * c.n_embd * c.n_vocab;
  r.attention_ops_per_entry = 4.0 * c.n_layers * c.n_heads * c.head_dim;
  r.int8_matmul_fraction = Int8MatmulFraction(m);
  const RunBound bound_before = MeasureRunBound(&rt->threads(), r.decode_weight_bytes, r.int8_matmul_fraction);
  KVX_ASSIGN_OR_RETURN(auto session, rt->NewSession());
  std::mt19937 rng(static_cast<uint32_t>(o.seed));

  // Prefill.
  r.prompt_tokens = o.prompt_tokens;
  std::vector<double> prefill;
  double profiled_s = 0;
  util::ResetStepProfile();
  for (int rep = 0; rep < o.reps; ++rep) {
    session->Reset();
    const auto tokens = RandomTokens(o.prompt_tokens, c.n_vocab, &rng);
    const double t0 = util::MonotonicSeconds();
    {
      ProfileWindow window(o.profile, &profiled_s);
      KVX_ASSIGN_OR_RETURN(const float* logits, session->Feed(tokens));
      (void)logits;
    }
    prefill.push_back(o.prompt_tokens / (util::MonotonicSeconds() - t0));
  }
  r.prefill_tok_s = Median(prefill);
  if (o.profile) r.prefill_profile = StepProfileResult::From(util::TakeStepProfile(), o.reps, profiled_s);
  const double p = o.prompt_tokens;
  const PrefillOps ops = CountPrefillOps(ModelPlanInputs(*rt), p);
  r.prefill_matmul_ops = ops.matmul;
  r.prefill_attention_ops = ops.attention;
  r.prefill_gflops = ops.Total() / (p / r.prefill_tok_s) / 1e9;

  // Decode at each depth.
  for (int depth : o.depths) {
    DepthResult d;
    d.depth = depth;
    std::vector<double> per_token;
    for (int rep = 0; rep < o.reps; ++rep) {
      KVX_RETURN_IF_ERROR(FillDepth(rt, session.get(), depth, o.seed + rep, &rng));
      int32_t token = RandomTokens(1, c.n_vocab, &rng)[0];
      for (int i = 0; i < o.gen_tokens; ++i) {
        const double t0 = util::MonotonicSeconds();
        KVX_ASSIGN_OR_RETURN(const float* logits, session->Feed({token}));
        per_token.push_back(util::MonotonicSeconds() - t0);
        token = model::ArgMax(logits, c.n_vocab);
      }
      // KV held at the middle of the decode, measured from the pool.
      d.kv_bytes = static_cast<double>(session->kv().BytesInUse());
      d.rss_bytes = CurrentRssBytes();
    }
    d.decode_tok_s = 1.0 / Median(per_token);
    d.bytes_per_token = r.decode_weight_bytes + d.kv_bytes;
    r.depths.push_back(d);
  }
  session.reset();

  // Batched decode: N sessions, one token each per step.
  std::vector<double> batch_rss;
  for (int n_seqs : o.seqs) {
    for (int depth : o.seq_depths) {
      BatchDecodeResult b;
      b.seqs = n_seqs;
      b.depth = depth;
      std::vector<double> per_step;
      double profiled_s = 0;
      util::ResetStepProfile();
      for (int rep = 0; rep < o.reps; ++rep) {
        std::vector<std::unique_ptr<engine::Session>> ss;
        for (int i = 0; i < n_seqs; ++i) {
          KVX_ASSIGN_OR_RETURN(auto s, rt->NewSession());
          KVX_RETURN_IF_ERROR(FillDepth(rt, s.get(), depth, o.seed + rep * 1000 + i, &rng));
          ss.push_back(std::move(s));
        }
        std::vector<std::vector<int32_t>> next(n_seqs, std::vector<int32_t>(1));
        std::vector<std::vector<float>> logits(n_seqs);
        std::vector<engine::StepInput> in(n_seqs);
        for (int i = 0; i < n_seqs; ++i) next[i][0] = RandomTokens(1, c.n_vocab, &rng)[0];
        for (int step = 0; step < o.gen_tokens; ++step) {
          for (int i = 0; i < n_seqs; ++i) in[i] = {ss[i].get(), next[i], -1, &logits[i]};
          ProfileWindow window(o.profile, &profiled_s);
          const double t0 = util::MonotonicSeconds();
          KVX_RETURN_IF_ERROR(rt->Step(in));
          per_step.push_back(util::MonotonicSeconds() - t0);
          util::ScopedPhase sampling(util::StepPhase::kSampling);
          for (int i = 0; i < n_seqs; ++i) next[i][0] = model::ArgMax(logits[i].data(), c.n_vocab);
        }
        b.kv_bytes = static_cast<double>(rt->kv_manager().BytesInUse());
      }
      b.total_tok_s = n_seqs / Median(per_step);
      b.per_seq_tok_s = b.total_tok_s / n_seqs;
      b.bytes_per_step = r.decode_weight_bytes + b.kv_bytes;
      if (o.profile) b.profile = StepProfileResult::From(util::TakeStepProfile(), o.reps * o.gen_tokens, profiled_s);
      r.batch.push_back(b);
    }
  }
  // Peak RSS before the probes, whose large arrays are not the model's.
  r.peak_rss_bytes = PeakRssBytes();
  r.bound = MergeRunBounds(bound_before, MeasureRunBound(&rt->threads(), r.decode_weight_bytes, r.int8_matmul_fraction));
  r.simd_target = ops::ActiveSimdTarget();
  r.cpu = DescribeCpu();
  r.prefill_peak_kind = r.bound.matmul_int8 ? "int8" : "fma";
  r.ComputeBounds();
  return r;
}

RunBound MeasureRunBound(ThreadPool* pool, double decode_bytes, double int8_matmul_fraction) {
  RunBound b;
  b.bandwidth = MeasureBandwidth(pool);
  b.stream_read_gbps = MeasureStreamReadGbps(pool, static_cast<size_t>(decode_bytes));
  b.read_gbps = std::max(b.bandwidth.read_gbps, b.stream_read_gbps);
  b.peak = MeasurePeakFlops(pool);
  b.peak_int8 = MeasurePeakInt8(pool);
  // Without an int8 probe (no AVX2) ops/ runs its scalar integer code:
  // the FMA peak is then the only (and a generous) bound.
  b.matmul_int8 = int8_matmul_fraction >= 0.5 && b.peak_int8.gops > 0;
  return b;
}

RunBound MergeRunBounds(const RunBound& a, const RunBound& b) {
  RunBound m = a;
  m.bandwidth.read_gbps = std::max(a.bandwidth.read_gbps, b.bandwidth.read_gbps);
  m.bandwidth.triad_gbps = std::max(a.bandwidth.triad_gbps, b.bandwidth.triad_gbps);
  m.stream_read_gbps = std::max(a.stream_read_gbps, b.stream_read_gbps);
  m.read_gbps = std::max(a.read_gbps, b.read_gbps);
  if (b.peak.gflops > a.peak.gflops) m.peak = b.peak;
  if (b.peak_int8.gops > a.peak_int8.gops) m.peak_int8 = b.peak_int8;
  m.matmul_int8 = a.matmul_int8 || b.matmul_int8;
  return m;
}

void SpeedBenchResult::ComputeBounds() {
  const double read_bps = bound.read_gbps * 1e9;
  const double matmul_peak = bound.matmul_peak_gops() * 1e9, fma_peak = bound.peak.gflops * 1e9;
  // Prefill: the matmuls at their peak, attention at the FMA peak (plan.h PrefillBoundSeconds).
  const double prefill_s = matmul_peak > 0 && fma_peak > 0
                               ? prefill_matmul_ops / matmul_peak + prefill_attention_ops / fma_peak
                               : 0;
  prefill_bound_gops = prefill_s > 0 ? (prefill_matmul_ops + prefill_attention_ops) / prefill_s / 1e9 : 0;
  prefill_pct_of_bound = prefill_bound_gops > 0 ? 100.0 * prefill_gflops / prefill_bound_gops : 0;
  prefill_pct_of_peak = matmul_peak > 0 ? 100.0 * prefill_gflops / (matmul_peak / 1e9) : 0;
  for (DepthResult& d : depths) {
    d.bound_gbps = bound.read_gbps;
    d.bound_tok_s = d.bytes_per_token > 0 ? read_bps / d.bytes_per_token : 0;
    d.pct_of_bound = d.bound_tok_s > 0 ? 100.0 * d.decode_tok_s / d.bound_tok_s : 0;
  }
  for (BatchDecodeResult& b : batch) {
    b.bound_gbps = bound.read_gbps;
    b.memory_bound_tok_s = b.bytes_per_step > 0 ? b.seqs * read_bps / b.bytes_per_step : 0;
    // Per token: the matmuls at the matmul peak, attention over `depth`
    // entries (and the token itself) at the FMA peak.
    const double step_s = matmul_peak > 0 && fma_peak > 0
                              ? b.seqs * (matmul_ops_per_token / matmul_peak +
                                          attention_ops_per_entry * (b.depth + 1) / fma_peak)
                              : 0;
    b.compute_bound_tok_s = step_s > 0 ? b.seqs / step_s : 0;
    b.bound_tok_s = std::min(b.memory_bound_tok_s, b.compute_bound_tok_s);
    b.bound_kind = b.memory_bound_tok_s <= b.compute_bound_tok_s ? "memory" : "compute";
    b.pct_of_bound = b.bound_tok_s > 0 ? 100.0 * b.total_tok_s / b.bound_tok_s : 0;
  }
}

std::string SpeedBenchResult::ProfileTable() const {
  std::vector<std::pair<std::string, const StepProfileResult*>> cols;
  if (prefill_profile.measured) cols.push_back({"prefill " + std::to_string(prompt_tokens), &prefill_profile});
  for (const BatchDecodeResult& b : batch) {
    if (b.profile.measured) cols.push_back({std::to_string(b.seqs) + " seq, depth " + std::to_string(b.depth), &b.profile});
  }
  if (cols.empty()) return "";
  char buf[128];
  std::string s = "| phase |", rule = "|---|";
  for (const auto& c : cols) {
    s += " " + c.first + " |";
    rule += "---|";
  }
  s += "\n" + rule + "\n";
  auto row = [&](const std::string& name, auto&& ms_of) {
    s += "| " + name + " |";
    for (const auto& c : cols) {
      const double ms = ms_of(*c.second);
      std::snprintf(buf, sizeof(buf), " %.3f (%.1f%%) |", ms, c.second->step_ms > 0 ? 100 * ms / c.second->step_ms : 0.0);
      s += buf;
    }
    s += "\n";
  };
  for (int i = 0; i < util::kStepPhases; ++i) {
    row(std::string(util::StepPhaseName(static_cast<util::StepPhase>(i))),
        [i](const StepProfileResult& p) { return p.phase_ms[i]; });
  }
  row("of attention: observer callbacks (summed over threads)",
      [](const StepProfileResult& p) { return p.observer_thread_ms; });
  row("outside the phases (bench loop)", [](const StepProfileResult& p) { return p.unaccounted_ms(); });
  row("whole step", [](const StepProfileResult& p) { return p.step_ms; });
  return "\nProfile (--profile: ms per step, share of the step's wall time):\n" + s;
}

nlohmann::json SpeedBenchResult::ToJson() const {
  nlohmann::json j;
  j["model"] = model;
  j["kv_spec"] = kv_spec;
  j["threads"] = threads;
  j["weight_bytes"] = weight_bytes;
  j["decode_weight_bytes_per_token"] = decode_weight_bytes;
  j["kv_bytes_per_token"] = kv_bytes_per_token;
  j["bandwidth"] = {{"read_gbps", bound.bandwidth.read_gbps}, {"triad_gbps", bound.bandwidth.triad_gbps},
                    {"array_bytes", bound.bandwidth.bytes}};
  j["peak_flops"] = {{"gflops", bound.peak.gflops}, {"isa", bound.peak.isa}};
  j["peak_int8"] = {{"gops", bound.peak_int8.gops}, {"isa", bound.peak_int8.isa}};
  j["bound"] = {{"read_gbps", bound.read_gbps},
                {"stream_read_gbps", bound.stream_read_gbps},
                {"matmul_peak_gops", bound.matmul_peak_gops()},
                {"fma_peak_gflops", bound.peak.gflops}};
  j["simd_target"] = simd_target;
  j["cpu"] = cpu.ToJson();
  j["prefill"] = {{"tokens", prompt_tokens},
                  {"tok_s", prefill_tok_s},
                  {"gflops", prefill_gflops},
                  {"matmul_ops", prefill_matmul_ops},
                  {"attention_ops", prefill_attention_ops},
                  {"bound_gops", prefill_bound_gops},
                  {"pct_of_bound", prefill_pct_of_bound},
                  {"pct_of_peak", prefill_pct_of_peak},
                  {"peak_kind", prefill_peak_kind},
                  {"int8_matmul_fraction", int8_matmul_fraction}};
  if (prefill_profile.measured) j["prefill"]["profile"] = prefill_profile.ToJson();
  j["decode"] = nlohmann::json::array();
  for (const DepthResult& d : depths) {
    j["decode"].push_back({{"depth", d.depth},
                           {"tok_s", d.decode_tok_s},
                           {"kv_bytes", d.kv_bytes},
                           {"rss_bytes", d.rss_bytes},
                           {"bytes_per_token", d.bytes_per_token},
                           {"bound_gbps", d.bound_gbps},
                           {"bound_tok_s", d.bound_tok_s},
                           {"pct_of_bound", d.pct_of_bound}});
  }
  j["batch"] = nlohmann::json::array();
  for (const BatchDecodeResult& b : batch) {
    j["batch"].push_back({{"seqs", b.seqs},
                          {"depth", b.depth},
                          {"total_tok_s", b.total_tok_s},
                          {"per_seq_tok_s", b.per_seq_tok_s},
                          {"kv_bytes", b.kv_bytes},
                          {"bytes_per_step", b.bytes_per_step},
                          {"bound_gbps", b.bound_gbps},
                          {"memory_bound_tok_s", b.memory_bound_tok_s},
                          {"compute_bound_tok_s", b.compute_bound_tok_s},
                          {"bound_tok_s", b.bound_tok_s},
                          {"bound_kind", b.bound_kind},
                          {"pct_of_bound", b.pct_of_bound}});
    if (b.profile.measured) j["batch"].back()["profile"] = b.profile.ToJson();
  }
  j["peak_rss_bytes"] = peak_rss_bytes;
  return j;
}

std::string SpeedBenchResult::ToTable() const {
  char buf[512];
  std::string s;
  std::snprintf(buf, sizeof(buf),
                "model %s, KV `%s`, %d threads; weights %.1f MiB (decode reads %.1f MiB/token); KV %.0f bytes/token\n"
                "one bound for every section (best of the probes before and after): read %.1f GB/s (256 MiB %.1f, "
                "re-reading the weights %.1f; triad %.1f GB/s); peak %.1f GFLOP/s (%s FMA), %.1f int8 GOP/s (%s); "
                "kernels %s\n\n",
                model.c_str(), kv_spec.c_str(), threads, weight_bytes / 1048576.0, decode_weight_bytes / 1048576.0,
                kv_bytes_per_token, bound.read_gbps, bound.bandwidth.read_gbps, bound.stream_read_gbps,
                bound.bandwidth.triad_gbps, bound.peak.gflops, bound.peak.isa.c_str(), bound.peak_int8.gops,
                bound.peak_int8.isa.c_str(), simd_target.c_str());
  s += cpu.ToText() + "\n" + buf;
  const bool int8 = prefill_peak_kind == "int8";
  const double ops = prefill_matmul_ops + prefill_attention_ops;
  std::snprintf(buf, sizeof(buf),
                "| prefill | tok/s | G ops/s | bound G ops/s | %% of bound | %% of the %s peak alone |\n"
                "|---|---|---|---|---|---|\n"
                "| %d tokens | %.1f | %.1f | %.1f | %.1f%% | %.1f%% |\n\n"
                "The bound runs the matmuls (%.1f%% of the ops) at the %s peak and attention (%.1f%%) at the FMA "
                "peak.\n\n",
                int8 ? "int8" : "FMA", prompt_tokens, prefill_tok_s, prefill_gflops, prefill_bound_gops,
                prefill_pct_of_bound, prefill_pct_of_peak, ops > 0 ? 100.0 * prefill_matmul_ops / ops : 0.0,
                int8 ? "int8" : "FMA", ops > 0 ? 100.0 * prefill_attention_ops / ops : 0.0);
  s += buf;
  s += "| decode depth | tok/s | KV MiB | RSS MiB | bytes read/token (MiB) | bound GB/s | bound tok/s | % of bound |\n"
       "|---|---|---|---|---|---|---|---|\n";
  for (const DepthResult& d : depths) {
    std::snprintf(buf, sizeof(buf), "| %d | %.1f | %.2f | %.1f | %.1f | %.1f | %.1f | %.1f%% |\n", d.depth,
                  d.decode_tok_s, d.kv_bytes / 1048576.0, d.rss_bytes / 1048576.0, d.bytes_per_token / 1048576.0, d.bound_gbps, d.bound_tok_s,
                  d.pct_of_bound);
    s += buf;
  }
  if (!batch.empty()) {
    s += "\n| sequences | depth | total tok/s | per-sequence tok/s | KV MiB | bound tok/s | bound by | % of bound |\n"
         "|---|---|---|---|---|---|---|---|\n";
    for (const BatchDecodeResult& b : batch) {
      std::snprintf(buf, sizeof(buf), "| %d | %d | %.1f | %.1f | %.1f | %.1f | %s | %.1f%% |\n", b.seqs, b.depth,
                    b.total_tok_s, b.per_seq_tok_s, b.kv_bytes / 1048576.0, b.bound_tok_s, b.bound_kind.c_str(),
                    b.pct_of_bound);
      s += buf;
    }
  }
  s += ProfileTable();
  std::snprintf(buf, sizeof(buf), "\npeak RSS: %.1f MiB\n", peak_rss_bytes / 1048576.0);
  s += buf;
  return s;
}

}  // namespace kvx::eval
