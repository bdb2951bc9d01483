// The JSON report (schema kvx.eval/1, docs/eval.md) and its inverse.
// ReportFromJson reads back every field ReportToJson writes, so that
// ReportToJson(ReportFromJson(j)) == j: the Markdown and SVGs of a committed
// report can be re-rendered from its JSON alone (`kvx eval --render`).
// Counts that ratios are made of (hits, score sums) are written beside the
// ratios for that reason; reports written before they were added are read
// back from the ratios.
#include <cmath>
#include <limits>

#include "eval/report.h"
#include "eval/stats.h"

namespace kvx::eval {

using nlohmann::json;

namespace {

json KvJson(const KvMeasure& kv) {
  json j{{"peak_bytes", kv.peak_bytes},
         {"peak_tokens", kv.peak_tokens},
         {"f16_bytes", kv.f16_bytes},
         {"compression_vs_f16", kv.CompressionVsF16()}};
  if (kv.live_fraction) j["live_fraction"] = *kv.live_fraction;
  return j;
}

json OutcomeJson(const TaskOutcome& t) {
  json j{{"ok", t.ok}, {"seconds", t.seconds}, {"kv", KvJson(t.kv)}};
  if (!t.ok) j["error"] = t.error;
  return j;
}

json SolvedJson(const SolvedCells& s) {
  return json{{"cells", s.cells},      {"solved", s.solved},     {"share", s.Share()},
              {"n", s.n},              {"hits", s.hits},         {"score_sum", s.score_sum},
              {"accuracy", s.Accuracy()}, {"score", s.Score()}};
}

json IntervalJson(const Interval& i) { return json::array({i.lo, i.hi}); }

// Per prompt: id (the same prompt under every spec), its cell's depth (when
// the task has depths), hit and score: what paired tests need.
json PromptsJson(const RetrievalResult& r) {
  json out = json::array();
  for (const PromptOutcome& o : r.prompts) {
    json p{{"id", o.id}, {"cell", o.cell}, {"hit", o.hit}, {"score", o.score}};
    if (static_cast<size_t>(o.cell) < r.cells.size() && r.cells[static_cast<size_t>(o.cell)].cell.depth >= 0) {
      p["depth"] = r.cells[static_cast<size_t>(o.cell)].cell.depth;
    }
    out.push_back(p);
  }
  return out;
}

json RetrievalJson(const RetrievalResult& r, const RetrievalResult* baseline) {
  json j = OutcomeJson(r);
  j["metric"] = r.metric;
  j["n"] = r.n;
  j["hits"] = r.hits;
  j["score_sum"] = r.score_sum;
  j["accuracy"] = r.Accuracy();
  j["score"] = r.Score();
  // Derived, not read back: recomputed from the counts and prompts.
  j["accuracy_ci95"] = IntervalJson(WilsonInterval(r.hits, r.n));
  j["score_ci95"] = IntervalJson(ScoreInterval(r));
  if (baseline && baseline->ok && r.ok) {
    j["baseline_solved"] = SolvedJson(BaselineSolved(*baseline, r));
    if (baseline != &r && !r.prompts.empty()) {
      const PairedComparison c = CompareWithBaseline(*baseline, r);
      j["vs_baseline"] = json{{"n", c.n},       {"both", c.both}, {"baseline_only", c.baseline_only},
                              {"spec_only", c.spec_only}, {"p", c.p}, {"verdict", c.verdict}};
    }
  }
  json cells = json::array();
  for (const CellResult& c : r.cells) {
    json cj;
    if (c.cell.length > 0) cj["length"] = c.cell.length;
    if (c.cell.depth >= 0) cj["depth"] = c.cell.depth;
    if (c.cell.n_lines > 0) cj["n_lines"] = c.cell.n_lines;
    cj["n"] = c.n;
    cj["hits"] = c.hits;
    cj["score_sum"] = c.score_sum;
    cj["prompt_tokens_sum"] = c.prompt_tokens_sum;
    cj["accuracy"] = c.Accuracy();
    cj["score"] = c.Score();
    cj["mean_prompt_tokens"] = c.n > 0 ? c.prompt_tokens_sum / c.n : 0.0;
    cj["example"] = c.example;
    cj["score_ci95"] = IntervalJson(ScoreInterval(r, static_cast<int>(cells.size())));
    cells.push_back(cj);
  }
  j["cells"] = cells;
  if (!r.prompts.empty()) j["prompts"] = PromptsJson(r);
  return j;
}

// ---- reading back ----

// A malformed report: json::exception is turned into one InvalidArgument by
// ReportFromJson, naming the field.
double Num(const json& j, const char* key) {
  const json& v = j.at(key);
  if (v.is_null()) return std::numeric_limits<double>::quiet_NaN();  // NaN is written as null
  return v.get<double>();
}

KvMeasure ReadKv(const json& j) {
  KvMeasure kv;
  kv.peak_bytes = j.at("peak_bytes").get<uint64_t>();
  kv.peak_tokens = j.at("peak_tokens").get<int64_t>();
  kv.f16_bytes = j.at("f16_bytes").get<uint64_t>();
  if (j.contains("live_fraction")) kv.live_fraction = j.at("live_fraction").get<double>();
  return kv;
}

void ReadOutcome(const json& j, TaskOutcome* t) {
  t->ok = j.at("ok").get<bool>();
  t->seconds = Num(j, "seconds");
  t->kv = ReadKv(j.at("kv"));
  if (j.contains("error")) t->error = j["error"].get<std::string>();
}

RetrievalResult ReadRetrieval(const json& j) {
  RetrievalResult r;
  ReadOutcome(j, &r);
  r.metric = j.at("metric").get<std::string>();
  r.n = j.at("n").get<int>();
  r.hits = j.contains("hits") ? j["hits"].get<int>() : static_cast<int>(std::llround(Num(j, "accuracy") * r.n));
  r.score_sum = j.contains("score_sum") ? Num(j, "score_sum") : Num(j, "score") * r.n;
  for (const json& cj : j.at("cells")) {
    CellResult c;
    c.cell.length = cj.value("length", 0);
    c.cell.depth = cj.value("depth", -1.0);
    c.cell.n_lines = cj.value("n_lines", 0);
    c.n = cj.at("n").get<int>();
    c.hits = cj.contains("hits") ? cj["hits"].get<int>() : static_cast<int>(std::llround(Num(cj, "accuracy") * c.n));
    c.score_sum = cj.contains("score_sum") ? Num(cj, "score_sum") : Num(cj, "score") * c.n;
    c.prompt_tokens_sum = cj.contains("prompt_tokens_sum") ? Num(cj, "prompt_tokens_sum")
                                                           : Num(cj, "mean_prompt_tokens") * c.n;
    c.example = cj.at("example").get<std::string>();
    r.cells.push_back(std::move(c));
  }
  if (j.contains("prompts")) {
    for (const json& pj : j["prompts"]) {
      r.prompts.push_back({pj.at("id").get<int>(), pj.at("cell").get<int>(), pj.at("hit").get<bool>(), Num(pj, "score")});
    }
  }
  return r;
}

EvalReport ReadReport(const json& j) {
  EvalReport r;
  r.complete = j.at("complete").get<bool>();
  r.created_utc = j.at("created_utc").get<std::string>();
  const json& m = j.at("model");
  ModelInfo& mi = r.model;
  mi.path = m.at("path").get<std::string>();
  mi.name = m.at("name").get<std::string>();
  mi.arch = m.at("arch").get<std::string>();
  mi.n_layers = m.at("n_layers").get<int>();
  mi.n_kv_heads = m.at("n_kv_heads").get<int>();
  mi.head_dim = m.at("head_dim").get<int>();
  mi.n_ctx_train = m.at("n_ctx_train").get<int>();
  mi.n_vocab = m.at("n_vocab").get<int>();
  mi.f16_bytes_per_token = m.at("f16_bytes_per_token").get<uint64_t>();

  const json& s = j.at("settings");
  EvalOptions& o = r.settings;
  o.tasks.clear();
  for (const json& t : s.at("tasks")) {
    const std::optional<Task> task = TaskByName(t.get<std::string>());
    if (!task) throw std::invalid_argument("unknown task " + t.dump());
    o.tasks.push_back(*task);
  }
  o.baseline = s.at("baseline").get<std::string>();
  o.specs = s.at("specs").get<std::vector<std::string>>();
  o.n_ctx = s.at("n_ctx").get<int>();
  o.seed = s.at("seed").get<uint64_t>();
  o.text_name = s.at("text").get<std::string>();
  o.data_dir = s.at("data_dir").get<std::string>();
  o.compress = s.contains("compress") ? s.at("compress").get<std::string>() : "none";  // older reports: none
  o.chunk = s.at("ppl").at("chunk").get<int>();
  o.max_chunks = s.at("ppl").at("max_chunks").get<int>();
  o.kld_context = s.at("ppl").value("kld_context", 0.75);
  o.kld_score = s.at("ppl").value("kld_score", 0);
  const json& copy = s.at("copy");
  o.copy_span = copy.at("span").get<int>();
  o.copy_skip = copy.at("skip").get<int>();
  o.copy_distances = copy.at("distances").get<std::vector<int>>();
  o.copy_trials = copy.at("trials").get<int>();
  r.copy_candidates = copy.at("random_candidates").get<int>();
  const json& pk = s.at("passkey");
  o.lengths = pk.at("lengths").get<std::vector<int>>();
  o.depths = pk.at("depths").get<std::vector<double>>();
  o.passkey_trials = pk.at("trials").get<int>();
  o.passkey_gen = pk.at("n_gen").get<int>();
  const json& lines = s.at("lines");
  o.line_counts = lines.at("counts").get<std::vector<int>>();
  r.dropped_line_counts = lines.at("dropped_counts").get<std::vector<int>>();
  o.lines_trials = lines.at("trials").get<int>();
  o.lines_gen = lines.at("n_gen").get<int>();
  o.needle_gen = s.at("needle").at("n_gen").get<int>();
  if (s.contains("ruler")) {
    const json& ru = s["ruler"];
    o.ruler_trials = ru.at("trials").get<int>();
    o.ruler_gen = ru.at("gen").get<int>();
  }

  for (const json& rj : j.at("results")) {
    SpecResult sr;
    sr.spec = rj.at("spec").get<std::string>();
    sr.canonical = rj.at("canonical").get<std::string>();
    sr.is_baseline = rj.at("baseline").get<bool>();
    sr.done = rj.at("done").get<bool>();
    sr.seconds = Num(rj, "seconds");
    sr.kv = ReadKv(rj.at("kv"));
    if (rj.contains("error")) sr.error = rj["error"].get<std::string>();
    sr.prefill_reused = rj.value("prefill_reused", int64_t{0});
    if (rj.contains("ppl")) {
      const json& pj = rj["ppl"];
      PplResult p;
      ReadOutcome(pj, &p);
      p.ppl = Num(pj, "ppl");
      p.ppl_stderr = Num(pj, "ppl_stderr");
      p.n_chunks = pj.at("n_chunks").get<int>();
      p.n_scored = pj.at("n_scored").get<int>();
      p.chunk = pj.at("chunk").get<int>();
      p.context = pj.value("context", 0);
      sr.ppl = p;
    }
    if (rj.contains("kld")) {
      const json& kj = rj["kld"];
      KldResult k;
      ReadOutcome(kj, &k);
      k.mean = Num(kj, "mean");
      k.mean_stderr = Num(kj, "mean_stderr");
      k.median = Num(kj, "median");
      k.p90 = Num(kj, "p90");
      k.p99 = Num(kj, "p99");
      k.max = Num(kj, "max");
      k.top1 = Num(kj, "top1");
      k.top1_stderr = Num(kj, "top1_stderr");
      k.n_positions = kj.at("n_positions").get<int64_t>();
      k.context = kj.value("context", 0);
      sr.kld = k;
    }
    if (rj.contains("copy")) {
      const json& cj = rj["copy"];
      CopyResult c;
      ReadOutcome(cj, &c);
      c.span = cj.at("span").get<int>();
      c.skip = cj.at("skip").get<int>();
      for (const json& src : cj.at("sources")) {
        CopySource cs;
        cs.source = src.at("source").get<std::string>();
        cs.chance = src.at("chance").is_null() ? -1.0 : src["chance"].get<double>();
        cs.n_sequences = src.at("n_sequences").get<int64_t>();
        cs.n_scored = src.at("n_scored").get<int64_t>();
        cs.accuracy = Num(src, "accuracy");
        cs.first_accuracy = Num(src, "first_accuracy");
        for (const json& d : src.at("by_distance")) {
          cs.by_distance.push_back(CopyDistance{d.at("distance").get<int>(), d.at("n_scored").get<int64_t>(),
                                                Num(d, "accuracy"), Num(d, "first_accuracy")});
        }
        c.sources.push_back(std::move(cs));
      }
      sr.copy = c;
    }
    for (Task t : kRetrievalTasks) {
      const std::string name(TaskName(t));
      if (rj.contains(name)) *sr.Retrieval(t) = ReadRetrieval(rj[name]);
    }
    r.specs.push_back(std::move(sr));
  }
  return r;
}

}  // namespace

json ReportToJson(const EvalReport& report) {
  const EvalOptions& o = report.settings;
  json tasks = json::array();
  json ruler_gen = json::object();
  for (Task t : o.tasks) {
    tasks.push_back(std::string(TaskName(t)));
    if (IsRulerTask(t)) ruler_gen[std::string(TaskName(t))] = o.ruler_gen > 0 ? o.ruler_gen : RulerDefaultGen(t);
  }
  json settings{
      {"tasks", tasks},
      {"baseline", o.baseline},
      {"specs", o.specs},
      {"n_ctx", o.n_ctx},
      {"seed", o.seed},
      {"text", o.text_name},
      {"data_dir", o.data_dir},
      {"ppl", {{"chunk", o.chunk}, {"max_chunks", o.max_chunks}}},
      {"copy",
       {{"span", o.copy_span},
        {"skip", o.copy_skip},
        {"distances", o.copy_distances},
        {"trials", o.copy_trials},
        {"random_candidates", report.copy_candidates}}},
      {"passkey",
       {{"lengths", o.lengths}, {"depths", o.depths}, {"trials", o.passkey_trials}, {"n_gen", o.passkey_gen}}},
      {"lines",
       {{"counts", o.line_counts},
        {"dropped_counts", report.dropped_line_counts},
        {"trials", o.lines_trials},
        {"n_gen", o.lines_gen}}},
      {"needle", {{"lengths", o.lengths}, {"depths", o.depths}, {"n_gen", o.needle_gen}}},
      {"ruler",
       {{"lengths", o.lengths},
        {"depths", o.depths},
        {"trials", o.ruler_trials},
        {"gen", o.ruler_gen},
        {"n_gen", ruler_gen}}}};
  // Reports from before the compression moment existed read as "none" and
  // are written back without the key, so they round-trip unchanged.
  if (o.compress != "none") {
    settings["compress"] = o.compress;
    // Only a compressing run splits its chunks; older reports stay byte-identical.
    settings["ppl"]["kld_context"] = o.kld_context;
    if (o.kld_score > 0) settings["ppl"]["kld_score"] = o.kld_score;
  }
  const ModelInfo& m = report.model;
  json model{{"path", m.path},
             {"name", m.name},
             {"arch", m.arch},
             {"n_layers", m.n_layers},
             {"n_kv_heads", m.n_kv_heads},
             {"head_dim", m.head_dim},
             {"n_ctx_train", m.n_ctx_train},
             {"n_vocab", m.n_vocab},
             {"f16_bytes_per_token", m.f16_bytes_per_token}};
  const SpecResult* base = nullptr;
  for (const SpecResult& s : report.specs) {
    if (s.is_baseline) base = &s;
  }
  json results = json::array();
  for (const SpecResult& s : report.specs) {
    json j{{"spec", s.spec}, {"canonical", s.canonical}, {"baseline", s.is_baseline},
           {"done", s.done}, {"seconds", s.seconds},     {"kv", KvJson(s.kv)}};
    if (!s.error.empty()) j["error"] = s.error;
    if (s.prefill_reused > 0) j["prefill_reused"] = s.prefill_reused;
    if (s.ppl) {
      json p = OutcomeJson(*s.ppl);
      p["ppl"] = s.ppl->ppl;
      p["ppl_stderr"] = s.ppl->ppl_stderr;
      p["n_chunks"] = s.ppl->n_chunks;
      p["n_scored"] = s.ppl->n_scored;
      p["chunk"] = s.ppl->chunk;
      if (s.ppl->context > 0) p["context"] = s.ppl->context;
      j["ppl"] = p;
    }
    if (s.kld) {
      json k = OutcomeJson(*s.kld);
      k["mean"] = s.kld->mean;
      k["mean_stderr"] = s.kld->mean_stderr;
      k["median"] = s.kld->median;
      k["p90"] = s.kld->p90;
      k["p99"] = s.kld->p99;
      k["max"] = s.kld->max;
      k["top1"] = s.kld->top1;
      k["top1_stderr"] = s.kld->top1_stderr;
      k["n_positions"] = s.kld->n_positions;
      if (s.kld->context > 0) k["context"] = s.kld->context;
      j["kld"] = k;
    }
    if (s.copy) {
      json c = OutcomeJson(*s.copy);
      c["span"] = s.copy->span;
      c["skip"] = s.copy->skip;
      json sources = json::array();
      for (const CopySource& src : s.copy->sources) {
        json sj{{"source", src.source},           {"chance", src.chance >= 0 ? json(src.chance) : json(nullptr)},
                {"n_sequences", src.n_sequences}, {"n_scored", src.n_scored},
                {"accuracy", src.accuracy},       {"first_accuracy", src.first_accuracy}};
        json by = json::array();
        for (const CopyDistance& d : src.by_distance) {
          by.push_back(json{{"distance", d.distance},
                            {"n_scored", d.n_scored},
                            {"accuracy", d.accuracy},
                            {"first_accuracy", d.first_accuracy}});
        }
        sj["by_distance"] = by;
        sources.push_back(sj);
      }
      c["sources"] = sources;
      j["copy"] = c;
    }
    for (Task t : kRetrievalTasks) {
      const std::optional<RetrievalResult>& r = *s.Retrieval(t);
      if (!r) continue;
      const std::optional<RetrievalResult>* b = base ? base->Retrieval(t) : nullptr;
      j[std::string(TaskName(t))] = RetrievalJson(*r, b && *b ? &**b : nullptr);
    }
    results.push_back(j);
  }
  return json{{"schema", kReportSchema}, {"complete", report.complete}, {"created_utc", report.created_utc},
              {"model", model},          {"settings", settings},        {"results", results}};
}

std::string ReportToJsonText(const EvalReport& report) {
  return ReportToJson(report).dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

Result<EvalReport> ReportFromJson(const json& j) {
  if (!j.is_object() || j.value("schema", "") != kReportSchema) {
    return InvalidArgument(std::string("not a kvx eval report: \"schema\" must be \"") + kReportSchema + "\"");
  }
  try {
    return ReadReport(j);
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("malformed kvx eval report: ") + e.what());
  }
}

Result<EvalReport> ReportFromJsonText(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("the eval report is not valid JSON");
  return ReportFromJson(j);
}

}  // namespace kvx::eval
