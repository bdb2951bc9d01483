// kvx tune's outputs (tune.h): the JSON that --kv @FILE reads, the Pareto
// chart and the summary table.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "eval/plots.h"
#include "eval/tune.h"
#include "kv/kv_spec.h"

namespace kvx::eval {
namespace {

using json = nlohmann::ordered_json;

json MeasureJson(const TuneMeasure& m) {
  json j = {{"chunk", m.chunk},       {"n_chunks", m.n_chunks}, {"kld", m.kld},
            {"kld_stderr", m.kld_stderr}, {"top1", m.top1},    {"kv_bytes_measured", m.kv_bytes},
            {"kv_tokens_measured", m.kv_tokens}};
  if (!m.error.empty()) j["error"] = m.error;
  return j;
}

json RateJson(int hits, int n, const Interval& in) {
  return {{"hits", hits}, {"n", n}, {"rate", n > 0 ? static_cast<double>(hits) / n : 0.0}, {"lo95", in.lo},
          {"hi95", in.hi}};
}

json VerdictJson(const RetrievalVerdict& v) {
  json j = RateJson(v.hits, v.n, v.interval);
  j["only_spec"] = v.only_spec;
  j["only_f16"] = v.only_f16;
  j["mcnemar_p"] = v.mcnemar_p;
  j["verdict"] = v.verdict;
  if (!v.error.empty()) j["error"] = v.error;
  if (v.skipped > 0) j["skipped"] = v.skipped;  // stopped early: worse whatever these prompts gave
  return j;
}

json CandidateJson(const TuneResult& r, const TuneOptions& o, int i) {
  const TuneCandidate& c = r.candidates[static_cast<size_t>(i)];
  json j = {{"spec", c.spec},     {"origin", c.origin},     {"family", c.family},
            {"defaults", c.defaults}, {"bytes", c.bytes}, {"search", json::array()}};
  if (c.bytes > 0) j["vs_f16"] = static_cast<double>(r.f16_bytes) / static_cast<double>(c.bytes);
  for (const TuneMeasure& m : c.search) j["search"].push_back(MeasureJson(m));
  j["unseen"] = c.holdout ? MeasureJson(*c.holdout) : json(nullptr);
  if (c.vs_chosen) {
    const TunePaired& d = *c.vs_chosen;
    j["vs_chosen"] = {{"rung", d.rung}, {"chunk", d.chunk}, {"n_chunks", d.n_chunks}, {"kld_diff", d.diff},
                      {"lo95", d.lo95}, {"hi95", d.hi95},    {"p", d.p},               {"blocks", d.blocks},
                      {"verdict", d.verdict}};
  }
  if (c.retrieval) {
    j["retrieval"] = VerdictJson(*c.retrieval);
    j["equal_quality"] = EqualQuality(c, o);
  }
  return j;
}

json CandidateList(const TuneResult& r, const TuneOptions& o, const std::vector<int>& which) {
  json a = json::array();
  for (int i : which) a.push_back(CandidateJson(r, o, i));
  return a;
}

json RetrievalJson(const TuneResult& r, const TuneOptions& o) {
  if (!r.retrieval) return nullptr;
  const TuneRetrieval& tr = *r.retrieval;
  json tasks = json::array();
  for (Task t : o.retrieval.tasks) tasks.push_back(std::string(TaskName(t)));
  json compared = json::object();
  for (const auto& [role, i] : tr.compared) compared[role] = i >= 0 ? CandidateJson(r, o, i) : json(nullptr);
  return {{"tasks", tasks},
          {"length", tr.length},
          {"depths", o.retrieval.depths},
          {"trials", o.retrieval.trials},
          {"f16", RateJson(tr.hits, tr.n, tr.interval)},
          {"equal_kld", o.EqualKld()},
          {"seconds", tr.seconds},
          {"compared", compared}};
}

std::string Retrieval(const std::optional<RetrievalVerdict>& v) {
  if (!v) return "–";
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%d/%d [%.2f, %.2f] %s", v->hits, v->n, v->interval.lo, v->interval.hi,
                v->verdict.c_str());
  std::string s = buf;
  if (v->skipped > 0) s += " (stopped: " + std::to_string(v->skipped) + " prompts could not change it)";
  return s;
}

std::string Ratio(const TuneResult& r, uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2fx", bytes > 0 ? static_cast<double>(r.f16_bytes) / bytes : 0.0);
  return buf;
}

std::string Kld(const std::optional<TuneMeasure>& m) {
  if (!m) return "–";
  if (!m->error.empty()) return "error";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.5f ± %.5f (%d×%d)", m->kld, m->kld_stderr, m->n_chunks, m->chunk);
  return buf;
}

}  // namespace

std::string TuneResultJson(const TuneResult& r, const TuneOptions& o, const std::string& about_json) {
  json j;
  if (r.chosen >= 0) j[kv::kSpecFileKey] = r.candidates[static_cast<size_t>(r.chosen)].spec;
  j["kvx_tune"] = 1;  // the format's version
  j["about"] = json::parse(about_json.empty() ? "{}" : about_json);
  j["budget"] = {{"mem_bytes", o.mem_bytes}, {"ctx", o.ctx}, {"sessions", o.sessions},
                 {"f16_bytes", r.f16_bytes}, {"max_kld", o.max_kld ? json(*o.max_kld) : json(nullptr)}};
  j["stopped"] = r.stopped;
  if (r.stopped) j["stop_reason"] = r.stop_reason;
  j["seconds"] = r.seconds;
  j["rungs"] = r.rungs;
  j["space_size"] = r.space_size;
  j["fitting"] = r.candidates.size();
  j["chosen"] = r.chosen >= 0 ? CandidateJson(r, o, r.chosen) : json(nullptr);
  j["retrieval"] = RetrievalJson(r, o);
  j["finalists"] = CandidateList(r, o, r.finalists);
  j["pareto"] = CandidateList(r, o, r.pareto);
  std::vector<int> all(r.candidates.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  j["candidates"] = CandidateList(r, o, all);
  return j.dump(2) + "\n";
}

std::string TuneParetoSvg(const TuneResult& r) {
  ParetoChart chart;
  chart.title = "kvx tune: steady-state KV bytes vs KLD (rung 0)";
  chart.subtitle = "every candidate that fits, KL(f32 || spec) on the first rung's chunk; ringed: the chosen spec";
  chart.x_label = "steady-state KV bytes (all sessions at --ctx)";
  ParetoPanel panel;
  panel.title = "KLD";
  std::vector<int> which;
  panel.points = TuneRung0Points(r, &which);
  // The legend: the chosen spec first (series 0 is ringed), then the others.
  std::vector<int> order;
  if (r.chosen >= 0) order.push_back(r.chosen);
  for (int i : which) {
    if (i != r.chosen) order.push_back(i);
  }
  std::vector<int> series(r.candidates.size());
  for (size_t k = 0; k < order.size(); ++k) {
    series[static_cast<size_t>(order[k])] = static_cast<int>(k);
    chart.legend.push_back(r.candidates[static_cast<size_t>(order[k])].spec);
  }
  for (ParetoPoint& p : panel.points) p.series = series[static_cast<size_t>(p.series)];
  chart.panels.push_back(std::move(panel));
  // The specs the retrieval check judged, at their hit rate (f16's beside
  // the title): the front of bytes against retrieval.
  if (r.retrieval) {
    ParetoPanel hits;
    char title[96];
    std::snprintf(title, sizeof(title), "retrieval hit rate (f16: %d/%d)", r.retrieval->hits, r.retrieval->n);
    hits.title = title;
    hits.higher_is_better = true;
    hits.percent = true;
    for (int i : which) {
      const TuneCandidate& c = r.candidates[static_cast<size_t>(i)];
      if (c.retrieval && c.retrieval->n > 0) {
        hits.points.push_back(ParetoPoint{series[static_cast<size_t>(i)], static_cast<double>(c.bytes), c.retrieval->Rate()});
      }
    }
    if (!hits.points.empty()) {
      chart.title = "kvx tune: steady-state KV bytes vs KLD (rung 0) and retrieval";
      chart.panels.push_back(std::move(hits));
    }
  }
  return RenderParetoSvg(chart);
}

std::string TuneSummary(const TuneResult& r, const TuneOptions& o) {
  std::string s =
      "| # | spec | origin | bytes | vs f16 | KLD, search text | KLD, unseen text | retrieval vs f16 |\n"
      "|---|---|---|---:|---:|---|---|---|\n";
  int n = 0;
  for (int i : r.finalists) {
    const TuneCandidate& c = r.candidates[static_cast<size_t>(i)];
    const std::optional<TuneMeasure> last = c.search.empty() ? std::nullopt : std::optional(c.search.back());
    s += "| " + std::to_string(++n) + (i == r.chosen ? " (chosen)" : "") + " | `" + c.spec + "` | " + c.origin +
         " | " + std::to_string(c.bytes) + " | " + Ratio(r, c.bytes) + " | " + Kld(last) + " | " + Kld(c.holdout) +
         " | " + Retrieval(c.retrieval) + " |\n";
  }
  char line[256];
  std::snprintf(line, sizeof(line),
                "\n%d specs in the space for this model, %zu fit %llu bytes (%d session(s) x %d tokens; f16 needs "
                "%llu), %d rung(s), %.0f s%s\n",
                r.space_size, r.candidates.size(), static_cast<unsigned long long>(o.mem_bytes), o.sessions, o.ctx,
                static_cast<unsigned long long>(r.f16_bytes), r.rungs, r.seconds,
                r.stopped ? (", stopped (" + r.stop_reason + "): the best spec so far").c_str() : "");
  s += line;
  if (r.retrieval) {
    const TuneRetrieval& tr = *r.retrieval;
    std::snprintf(line, sizeof(line), "retrieval: f16 %d/%d [%.2f, %.2f] at %d tokens, %.0f s\n", tr.hits, tr.n,
                  tr.interval.lo, tr.interval.hi, tr.length, tr.seconds);
    s += line;
    for (const auto& [role, i] : tr.compared) {
      if (i < 0) continue;
      const TuneCandidate& c = r.candidates[static_cast<size_t>(i)];
      s += "  " + role + ": `" + c.spec + "` " + Ratio(r, c.bytes) + ", KLD rung 0 " + Kld(c.search.front()) +
           ", retrieval " + Retrieval(c.retrieval) + "\n";
    }
    if (r.chosen >= 0 && !EqualQuality(r.candidates[static_cast<size_t>(r.chosen)], o)) {
      char bound[32];
      std::snprintf(bound, sizeof(bound), "%g", o.EqualKld());
      s += std::string("note: the chosen spec is not of equal quality to f16 (KLD on unseen text above ") + bound +
           ", or retrieval worse than f16's)\n";
    }
  }
  if (r.chosen >= 0) s += "chosen: --kv '" + r.candidates[static_cast<size_t>(r.chosen)].spec + "'\n";
  return s;
}

}  // namespace kvx::eval
