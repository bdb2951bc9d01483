#include "eval/decode_compare.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>

#include "engine/engine.h"
#include "engine/session.h"
#include "eval/speed_bench.h"
#include "model/sampler.h"
#include "util/clock.h"

namespace kvx::eval {

Result<DecodeCompareResult> RunDecodeCompare(const model::Model& model, ThreadPool* threads,
                                             const std::vector<kv::KVSpec>& specs, const DecodeCompareOptions& o) {
  if (specs.empty()) return InvalidArgument("decode comparison: no --kv spec given");
  if (o.rounds < 1 || o.gen_tokens < 1) return InvalidArgument("decode comparison: rounds and tokens must be >= 1");
  const int n_vocab = model.config().n_vocab;
  const int max_depth = o.depths.empty() ? 0 : *std::max_element(o.depths.begin(), o.depths.end());
  std::vector<std::unique_ptr<engine::Engine>> engines;
  for (const kv::KVSpec& spec : specs) {
    engine::EngineOptions eo;
    eo.kv_spec = spec;
    eo.n_ctx = max_depth + o.rounds * o.gen_tokens + 1;
    KVX_ASSIGN_OR_RETURN(auto e, engine::Engine::Create(&model, threads, eo));
    engines.push_back(std::move(e));
  }
  DecodeCompareResult r;
  r.model = model.config().name.empty() ? model.config().arch_name : model.config().name;
  r.threads = static_cast<int>(threads->size());
  r.gen_tokens = o.gen_tokens;
  r.rounds = o.rounds;
  std::mt19937 rng(static_cast<uint32_t>(o.seed));
  std::uniform_int_distribution<int32_t> pick(0, n_vocab - 1);
  for (int depth : o.depths) {
    std::vector<std::unique_ptr<engine::Session>> sessions;
    std::vector<int32_t> next;
    for (auto& e : engines) {
      KVX_ASSIGN_OR_RETURN(auto s, e->NewSession());
      KVX_RETURN_IF_ERROR(FillDepth(e.get(), s.get(), depth, o.seed, &rng));
      sessions.push_back(std::move(s));
      next.push_back(pick(rng));
    }
    std::vector<std::vector<double>> tok_s(specs.size());
    for (int round = 0; round < o.rounds; ++round) {
      for (size_t i = 0; i < specs.size(); ++i) {
        std::vector<double> per_token;
        for (int t = 0; t < o.gen_tokens; ++t) {
          const double t0 = util::MonotonicSeconds();
          KVX_ASSIGN_OR_RETURN(const float* logits, sessions[i]->Feed({next[i]}));
          per_token.push_back(util::MonotonicSeconds() - t0);
          next[i] = model::ArgMax(logits, n_vocab);
        }
        tok_s[i].push_back(1.0 / Median(per_token));
        r.order.push_back(static_cast<int>(i));
      }
    }
    for (size_t i = 0; i < specs.size(); ++i) {
      DecodeCompareRow row;
      row.spec = specs[i].ToString();
      row.depth = depth;
      row.kv_bytes = static_cast<double>(sessions[i]->kv().BytesInUse());
      row.round_tok_s = tok_s[i];
      row.tok_s = Median(tok_s[i]);
      std::vector<double> ratios;
      for (int k = 0; k < o.rounds; ++k) ratios.push_back(tok_s[i][k] / tok_s[0][k]);
      row.vs_first = Median(ratios);
      r.rows.push_back(std::move(row));
    }
  }
  return r;
}

nlohmann::json DecodeCompareResult::ToJson() const {
  nlohmann::json j = {{"model", model}, {"threads", threads}, {"gen_tokens", gen_tokens}, {"rounds", rounds},
                      {"order", order}};
  j["decode"] = nlohmann::json::array();
  for (const DecodeCompareRow& row : rows) {
    j["decode"].push_back({{"kv_spec", row.spec}, {"depth", row.depth}, {"kv_bytes", row.kv_bytes},
                           {"round_tok_s", row.round_tok_s}, {"tok_s", row.tok_s}, {"vs_first", row.vs_first}});
  }
  return j;
}

std::string DecodeCompareResult::ToTable() const {
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "model %s, %d threads; decode of every spec in interleaved rounds (%d rounds x %d tokens each): "
                "tok/s is the median over rounds, vs first the median of the per-round ratios\n\n",
                model.c_str(), threads, rounds, gen_tokens);
  std::string s = buf;
  s += "| depth | `--kv` | KV MiB | decode tok/s | vs first | each round (tok/s) |\n|---:|---|---:|---:|---:|---|\n";
  for (const DecodeCompareRow& row : rows) {
    std::string each;
    for (double v : row.round_tok_s) each += (each.empty() ? "" : ", ") + std::to_string(static_cast<int>(v + 0.5));
    std::snprintf(buf, sizeof(buf), "| %d | `%s` | %.2f | %.1f | %.2fx | %s |\n", row.depth, row.spec.c_str(),
                  row.kv_bytes / 1048576.0, row.tok_s, row.vs_first, each.c_str());
    s += buf;
  }
  return s;
}

}  // namespace kvx::eval
