#include "eval/report.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "eval/plots.h"
#include "eval/svg.h"

namespace kvx::eval {

using nlohmann::json;

namespace {

json KvJson(const KvMeasure& kv) {
  return json{{"peak_bytes", kv.peak_bytes},
              {"peak_tokens", kv.peak_tokens},
              {"f16_bytes", kv.f16_bytes},
              {"compression_vs_f16", kv.CompressionVsF16()}};
}

json OutcomeJson(const TaskOutcome& t) {
  json j{{"ok", t.ok}, {"seconds", t.seconds}, {"kv", KvJson(t.kv)}};
  if (!t.ok) j["error"] = t.error;
  return j;
}

json RetrievalJson(const RetrievalResult& r) {
  json j = OutcomeJson(r);
  j["metric"] = r.metric;
  j["n"] = r.n;
  j["accuracy"] = r.Accuracy();
  j["score"] = r.Score();
  json cells = json::array();
  for (const CellResult& c : r.cells) {
    json cj;
    if (c.cell.length > 0) cj["length"] = c.cell.length;
    if (c.cell.depth >= 0) cj["depth"] = c.cell.depth;
    if (c.cell.n_lines > 0) cj["n_lines"] = c.cell.n_lines;
    cj["n"] = c.n;
    cj["accuracy"] = c.Accuracy();
    cj["score"] = c.Score();
    cj["mean_prompt_tokens"] = c.n > 0 ? c.prompt_tokens_sum / c.n : 0.0;
    cj["example"] = c.example;
    cells.push_back(cj);
  }
  j["cells"] = cells;
  return j;
}

// A fraction as a percentage, with more decimals for small values (chance
// levels of copy are ~0.05%).
std::string Pct(double v) {
  char buf[32];
  const double p = v * 100.0;
  const int decimals = (p == 0 || p >= 1.0) ? 1 : (p >= 0.1 ? 2 : 3);
  std::snprintf(buf, sizeof(buf), "%.*f%%", decimals, p);
  return buf;
}

std::string Fixed(double v, int decimals) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

std::string Sci(double v) {
  char buf[48];
  if (v != 0 && std::fabs(v) < 1e-3) {
    std::snprintf(buf, sizeof(buf), "%.3e", v);
  } else {
    std::snprintf(buf, sizeof(buf), "%.5f", v);
  }
  return buf;
}

// Markdown table cell text: '|' would split the cell.
std::string Cell(std::string s) {
  std::string out;
  for (char c : s) {
    if (c == '|') {
      out += "\\|";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string Code(std::string s) {
  for (char& c : s) {
    if (c == '`') c = '\'';
  }
  return "`" + Cell(s) + "`";
}

const SpecResult* Baseline(const EvalReport& r) {
  for (const SpecResult& s : r.specs) {
    if (s.is_baseline) return &s;
  }
  return nullptr;
}

std::string FileName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// "TinyStories-656K-F32.gguf" — the file says more than general.name, which
// is often just "llama".
std::string ModelLabel(const ModelInfo& m) { return m.path.empty() ? m.name : FileName(m.path); }

std::string DepthLabel(double d) { return FormatNumber(d * 100.0, 0) + "%"; }

}  // namespace

json ReportToJson(const EvalReport& report) {
  const EvalOptions& o = report.settings;
  json tasks = json::array();
  for (Task t : o.tasks) tasks.push_back(std::string(TaskName(t)));
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
      {"needle", {{"lengths", o.lengths}, {"depths", o.depths}, {"n_gen", o.needle_gen}}}};
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
  json results = json::array();
  for (const SpecResult& s : report.specs) {
    json j{{"spec", s.spec}, {"canonical", s.canonical}, {"baseline", s.is_baseline},
           {"done", s.done}, {"seconds", s.seconds},     {"kv", KvJson(s.kv)}};
    if (!s.error.empty()) j["error"] = s.error;
    if (s.ppl) {
      json p = OutcomeJson(*s.ppl);
      p["ppl"] = s.ppl->ppl;
      p["ppl_stderr"] = s.ppl->ppl_stderr;
      p["n_chunks"] = s.ppl->n_chunks;
      p["n_scored"] = s.ppl->n_scored;
      p["chunk"] = s.ppl->chunk;
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
    if (s.passkey) j["passkey"] = RetrievalJson(*s.passkey);
    if (s.lines) j["lines"] = RetrievalJson(*s.lines);
    if (s.needle) j["needle"] = RetrievalJson(*s.needle);
    results.push_back(j);
  }
  return json{{"schema", kReportSchema}, {"complete", report.complete}, {"created_utc", report.created_utc},
              {"model", model},          {"settings", settings},        {"results", results}};
}

std::string ReportToJsonText(const EvalReport& report) {
  return ReportToJson(report).dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

std::string SummaryTable(const EvalReport& report) {
  const EvalOptions& o = report.settings;
  auto has = [&](Task t) { return std::find(o.tasks.begin(), o.tasks.end(), t) != o.tasks.end(); };
  const SpecResult* base = Baseline(report);
  const bool text_copy = !o.text_name.empty();
  std::string head = "| # | spec | KV bytes (peak) | vs f16 |";
  std::string rule = "|---|---|---:|---:|";
  if (has(Task::kPpl)) {
    head += " PPL | ΔPPL |";
    rule += "---:|---:|";
  }
  if (has(Task::kKld)) {
    head += " KLD mean | KLD p99 | top-1 |";
    rule += "---:|---:|---:|";
  }
  if (has(Task::kCopy)) {
    head += " copy random (chance) |";
    rule += "---:|";
    if (text_copy) {
      head += " copy text (1st occ.) |";
      rule += "---:|";
    }
  }
  if (has(Task::kPasskey)) {
    head += " passkey |";
    rule += "---:|";
  }
  if (has(Task::kLines)) {
    head += " lines |";
    rule += "---:|";
  }
  if (has(Task::kNeedle)) {
    head += " needle R1-F1 |";
    rule += "---:|";
  }
  std::string out = head + "\n" + rule + "\n";
  const std::string pending = "…";
  auto err = [](const TaskOutcome& t) { return "error: " + Cell(t.error); };
  for (size_t i = 0; i < report.specs.size(); ++i) {
    const SpecResult& s = report.specs[i];
    std::string row = "| " + std::to_string(i) + " | " + Code(s.canonical) + (s.is_baseline ? " (baseline)" : "") +
                      " | " + (s.kv.peak_bytes ? FormatBytes(static_cast<double>(s.kv.peak_bytes)) : pending) + " | " +
                      (s.kv.peak_bytes ? Fixed(s.kv.CompressionVsF16(), 2) + "×" : pending) + " |";
    if (has(Task::kPpl)) {
      if (!s.ppl) {
        row += " " + pending + " | " + pending + " |";
      } else if (!s.ppl->ok) {
        row += " " + err(*s.ppl) + " | |";
      } else {
        row += " " + Fixed(s.ppl->ppl, 4) + " ± " + Fixed(s.ppl->ppl_stderr, 4) + " |";
        if (base && base->ppl && base->ppl->ok && !s.is_baseline) {
          const double d = s.ppl->ppl - base->ppl->ppl;
          row += " " + std::string(d >= 0 ? "+" : "") + Sci(d) + " |";
        } else {
          row += " |";
        }
      }
    }
    if (has(Task::kKld)) {
      if (s.is_baseline) {
        row += " – | – | – |";
      } else if (!s.kld) {
        row += " " + pending + " | " + pending + " | " + pending + " |";
      } else if (!s.kld->ok) {
        row += " " + err(*s.kld) + " | | |";
      } else {
        row += " " + Sci(s.kld->mean) + " | " + Sci(s.kld->p99) + " | " + Fixed(s.kld->top1 * 100.0, 2) + "% |";
      }
    }
    if (has(Task::kCopy)) {
      const CopySource* rnd = nullptr;
      const CopySource* txt = nullptr;
      if (s.copy) {
        for (const CopySource& c : s.copy->sources) (c.source == "random" ? rnd : txt) = &c;
      }
      if (s.copy && !s.copy->ok) {
        row += " " + err(*s.copy) + " |" + (text_copy ? " |" : "");
      } else {
        row += " " + (rnd ? Pct(rnd->accuracy) + " (" + Pct(rnd->chance) + ")" : pending) + " |";
        if (text_copy) row += " " + (txt ? Pct(txt->accuracy) + " (" + Pct(txt->first_accuracy) + ")" : pending) + " |";
      }
    }
    auto retrieval = [&](const std::optional<RetrievalResult>& r, bool score) {
      if (!r) return " " + pending + " |";
      if (!r->ok) return " " + err(*r) + " |";
      return " " + (score ? Fixed(r->Score(), 3) : Pct(r->Accuracy())) + " |";
    };
    if (has(Task::kPasskey)) row += retrieval(s.passkey, false);
    if (has(Task::kLines)) row += retrieval(s.lines, false);
    if (has(Task::kNeedle)) row += retrieval(s.needle, true);
    out += row + "\n";
  }
  return out;
}

std::string ReportToMarkdown(const EvalReport& report, bool with_images) {
  const EvalOptions& o = report.settings;
  const ModelInfo& m = report.model;
  auto has = [&](Task t) { return std::find(o.tasks.begin(), o.tasks.end(), t) != o.tasks.end(); };
  std::string md = "# kvx eval: " + ModelLabel(m) + "\n\n";
  md += "Model `" + FileName(m.path) + "` (" + (m.name.empty() ? "" : "\"" + m.name + "\", ") + m.arch + ", " +
        std::to_string(m.n_layers) + " layers, " + std::to_string(m.n_kv_heads) + " KV heads × " +
        std::to_string(m.head_dim) + ", dense f16 KV " + std::to_string(m.f16_bytes_per_token) +
        " B/token). Baseline `" + o.baseline + "`, context " + std::to_string(o.n_ctx) + " tokens, seed " +
        std::to_string(o.seed) + (o.text_name.empty() ? "" : ", text `" + FileName(o.text_name) + "`") + ". " +
        (report.complete ? "Complete" : "**Incomplete** (the run is going on or was interrupted)") + "; created " +
        report.created_utc + ".\n\n";
  md += SummaryTable(report);
  md +=
      "\nKV bytes: the most the spec's block pool held at the end of any sequence of the run (measured); vs f16 "
      "= dense f16 K/V bytes for that sequence ÷ measured bytes. ";
  if (has(Task::kPpl)) md += "PPL ± standard error (llama.cpp protocol). ";
  if (has(Task::kKld)) md += "KLD = KL(baseline ‖ spec) per scored position; top-1 = argmax agreement. ";
  if (has(Task::kCopy))
    md +=
        "Copy: top-1 accuracy on repeated spans (random tokens, with chance level; real text, "
        "with first-occurrence accuracy as the no-copy control). ";
  md += "Protocols: docs/eval.md.\n";
  if (with_images && !ParetoSvg(report).empty()) md += "\n![quality vs KV bytes](pareto.svg)\n";

  if (has(Task::kCopy)) {
    md +=
        "\n## copy: accuracy by distance\n\n| spec | source | distance | repeat acc | first-occ. acc | scored |\n"
        "|---|---|---:|---:|---:|---:|\n";
    for (const SpecResult& s : report.specs) {
      if (!s.copy || !s.copy->ok) continue;
      for (const CopySource& src : s.copy->sources) {
        for (const CopyDistance& d : src.by_distance) {
          md += "| " + Code(s.canonical) + " | " + src.source + " | " + std::to_string(d.distance) + " | " +
                Pct(d.accuracy) + " | " + Pct(d.first_accuracy) + " | " + std::to_string(d.n_scored) + " |\n";
        }
      }
    }
  }
  auto grid = [&](const char* title, const std::string& task, auto get, bool score) {
    md += std::string("\n## ") + title + "\n\n";
    for (size_t i = 0; i < report.specs.size(); ++i) {
      const SpecResult& s = report.specs[i];
      const std::optional<RetrievalResult>& r = get(s);
      if (!r) continue;
      md += "**" + Code(s.canonical) + "**" + (s.is_baseline ? " (baseline)" : "") + ": ";
      if (!r->ok) {
        md += "error: " + r->error + "\n\n";
        continue;
      }
      md += (score ? "mean ROUGE-1 F1 " + Fixed(r->Score(), 3) + ", all answer words found in " + Pct(r->Accuracy())
                   : "accuracy " + Pct(r->Accuracy())) +
            " of " + std::to_string(r->n) + "\n\n";
      if (task == "lines") {
        md += "| lines | prompt tokens | accuracy | n | first output |\n|---:|---:|---:|---:|---|\n";
        for (const CellResult& c : r->cells) {
          md += "| " + std::to_string(c.cell.n_lines) + " | " + Fixed(c.n ? c.prompt_tokens_sum / c.n : 0.0, 0) +
                " | " + Pct(c.Accuracy()) + " | " + std::to_string(c.n) + " | " + Code(c.example) + " |\n";
        }
        md += "\n";
        continue;
      }
      if (with_images) md += "![" + task + " heat map](" + task + "-" + std::to_string(i) + ".svg)\n\n";
      md += "| depth \\ length |";
      std::string rule = "|---|";
      for (int l : o.lengths) {
        md += " " + std::to_string(l) + " |";
        rule += "---:|";
      }
      md += "\n" + rule + "\n";
      for (double d : o.depths) {
        md += "| " + DepthLabel(d) + " |";
        for (int l : o.lengths) {
          std::string v = "";
          for (const CellResult& c : r->cells) {
            if (c.cell.length == l && c.cell.depth == d) v = score ? Fixed(c.Score(), 2) : Pct(c.Accuracy());
          }
          md += " " + v + " |";
        }
        md += "\n";
      }
      md += "\n";
    }
  };
  if (has(Task::kPasskey)) {
    grid(
        "passkey: accuracy by depth × length", "passkey",
        [](const SpecResult& s) -> const std::optional<RetrievalResult>& { return s.passkey; }, false);
  }
  if (has(Task::kLines)) {
    grid(
        "lines: accuracy by record size", "lines",
        [](const SpecResult& s) -> const std::optional<RetrievalResult>& { return s.lines; }, false);
  }
  if (has(Task::kNeedle)) {
    grid(
        "needle: ROUGE-1 F1 by depth × length", "needle",
        [](const SpecResult& s) -> const std::optional<RetrievalResult>& { return s.needle; }, true);
  }
  return md;
}

std::string ParetoSvg(const EvalReport& report) {
  ParetoChart chart;
  const ModelInfo& m = report.model;
  chart.title = "Quality vs KV bytes: " + ModelLabel(m);
  chart.subtitle =
      "each point a --kv spec; x = bytes its pool held (measured peak); dashed = Pareto frontier; "
      "baseline " +
      report.settings.baseline;
  for (const SpecResult& s : report.specs) chart.legend.push_back(s.canonical + (s.is_baseline ? " (baseline)" : ""));
  auto add_panel = [&](const std::string& title, bool higher, bool percent, auto get) {
    ParetoPanel p;
    p.title = title;
    p.higher_is_better = higher;
    p.percent = percent;
    for (size_t i = 0; i < report.specs.size(); ++i) {
      double bytes = 0, value = 0;
      if (get(report.specs[i], &bytes, &value) && bytes > 0) {
        p.points.push_back(ParetoPoint{static_cast<int>(i), bytes, value});
      }
    }
    if (!p.points.empty()) chart.panels.push_back(std::move(p));
  };
  add_panel("PPL", false, false, [](const SpecResult& s, double* b, double* v) {
    if (!s.ppl || !s.ppl->ok) return false;
    *b = static_cast<double>(s.ppl->kv.peak_bytes);
    *v = s.ppl->ppl;
    return true;
  });
  add_panel("KLD mean vs baseline", false, false, [](const SpecResult& s, double* b, double* v) {
    if (!s.kld || !s.kld->ok) return false;
    *b = static_cast<double>(s.kld->kv.peak_bytes);
    *v = s.kld->mean;
    return true;
  });
  add_panel("top-1 agreement", true, true, [](const SpecResult& s, double* b, double* v) {
    if (!s.kld || !s.kld->ok) return false;
    *b = static_cast<double>(s.kld->kv.peak_bytes);
    *v = s.kld->top1;
    return true;
  });
  for (const char* source : {"random", "text"}) {
    add_panel(std::string("copy accuracy (") + source + ")", true, true,
              [source](const SpecResult& s, double* b, double* v) {
                if (!s.copy || !s.copy->ok) return false;
                for (const CopySource& c : s.copy->sources) {
                  if (c.source == source) {
                    *b = static_cast<double>(s.copy->kv.peak_bytes);
                    *v = c.accuracy;
                    return true;
                  }
                }
                return false;
              });
  }
  auto retrieval_panel = [&](const std::string& title, auto get, bool score) {
    add_panel(title, true, !score, [get, score](const SpecResult& s, double* b, double* v) {
      const std::optional<RetrievalResult>& r = get(s);
      if (!r || !r->ok) return false;
      *b = static_cast<double>(r->kv.peak_bytes);
      *v = score ? r->Score() : r->Accuracy();
      return true;
    });
  };
  retrieval_panel(
      "passkey accuracy", [](const SpecResult& s) -> const std::optional<RetrievalResult>& { return s.passkey; },
      false);
  retrieval_panel(
      "lines accuracy", [](const SpecResult& s) -> const std::optional<RetrievalResult>& { return s.lines; }, false);
  retrieval_panel(
      "needle ROUGE-1 F1", [](const SpecResult& s) -> const std::optional<RetrievalResult>& { return s.needle; }, true);
  if (chart.panels.empty()) return "";
  return RenderParetoSvg(chart);
}

std::string HeatMapSvg(const EvalReport& report, size_t index, const std::string& task) {
  if (index >= report.specs.size()) return "";
  const SpecResult& s = report.specs[index];
  const std::optional<RetrievalResult>& r = task == "needle" ? s.needle : s.passkey;
  if (!r || !r->ok) return "";
  const EvalOptions& o = report.settings;
  HeatMapData h;
  const ModelInfo& m = report.model;
  h.title = (task == "needle" ? "Needle in a haystack, ROUGE-1 F1: " : "Passkey retrieval accuracy: ") + ModelLabel(m);
  h.subtitle = "--kv " + s.canonical + (s.is_baseline ? " (baseline)" : "") + "; KV peak " +
               FormatBytes(static_cast<double>(r->kv.peak_bytes)) + "; overall " +
               (task == "needle" ? FormatNumber(r->Score(), 3) : FormatNumber(r->Accuracy() * 100, 1) + "%");
  h.x_label = "sequence length (tokens, prompt + answer)";
  h.y_label = "depth";
  h.percent = task != "needle";
  for (int l : o.lengths) h.x_labels.push_back(std::to_string(l));
  for (double d : o.depths) {
    h.y_labels.push_back(DepthLabel(d));
    std::vector<double> row;
    for (int l : o.lengths) {
      double v = NAN;
      for (const CellResult& c : r->cells) {
        if (c.cell.length == l && c.cell.depth == d && c.n > 0) v = task == "needle" ? c.Score() : c.Accuracy();
      }
      row.push_back(v);
    }
    h.values.push_back(row);
  }
  return RenderHeatMapSvg(h);
}

Status WriteFileAtomic(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return IoError("cannot write " + tmp);
    f.write(content.data(), static_cast<std::streamsize>(content.size()));
    if (!f) return IoError("error writing " + tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return IoError("cannot rename " + tmp + " to " + path + ": " + ec.message());
  return Status::Ok();
}

Status WriteReportDir(const EvalReport& report, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return IoError("cannot create the report directory " + dir + ": " + ec.message());
  KVX_RETURN_IF_ERROR(WriteFileAtomic(dir + "/report.json", ReportToJsonText(report)));
  KVX_RETURN_IF_ERROR(WriteFileAtomic(dir + "/report.md", ReportToMarkdown(report, /*with_images=*/true)));
  const std::string pareto = ParetoSvg(report);
  if (!pareto.empty()) KVX_RETURN_IF_ERROR(WriteFileAtomic(dir + "/pareto.svg", pareto));
  for (size_t i = 0; i < report.specs.size(); ++i) {
    for (const char* task : {"needle", "passkey"}) {
      const std::string svg = HeatMapSvg(report, i, task);
      if (!svg.empty()) {
        KVX_RETURN_IF_ERROR(WriteFileAtomic(dir + "/" + task + "-" + std::to_string(i) + ".svg", svg));
      }
    }
  }
  return Status::Ok();
}

}  // namespace kvx::eval
