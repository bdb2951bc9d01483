#include "eval/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "eval/plots.h"
#include "eval/svg.h"
#include "util/output_file.h"

namespace kvx::eval {

using nlohmann::json;

namespace {

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

bool HasTask(const EvalOptions& o, Task t) { return std::find(o.tasks.begin(), o.tasks.end(), t) != o.tasks.end(); }

// Tasks laid out on the length x depth grid (all retrieval tasks but lines).
bool IsGridTask(Task t) { return t == Task::kPasskey || t == Task::kNeedle || IsRulerTask(t); }

// needle's headline is its mean ROUGE-1 F1 (a number in [0, 1]); passkey and
// lines report accuracy, the RULER tasks their score (share of values found),
// both as percentages.
std::string Headline(Task t, const RetrievalResult& r) {
  if (t == Task::kNeedle) return Fixed(r.Score(), 3);
  return Pct(IsRulerTask(t) ? r.Score() : r.Accuracy());
}
// The headline with its 95% interval and n, and against the baseline (paired
// on the same prompts, exact McNemar at 0.05): "▼" worse, "▲" better, nothing
// when indistinguishable or unpaired (reports written before per-prompt
// outcomes were kept).
std::string HeadlineWithInterval(Task t, const RetrievalResult& r, const RetrievalResult* base) {
  // A partial score (share of values found) read from a report without
  // per-prompt outcomes has no interval to show.
  if (r.prompts.empty() && r.score_sum != r.hits) return Headline(t, r);
  const Interval ci = ScoreInterval(r);
  const bool needle = t == Task::kNeedle;
  std::string out = Headline(t, r) + " [" + (needle ? Fixed(ci.lo, 2) : Pct(ci.lo)) + "–" +
                    (needle ? Fixed(ci.hi, 2) : Pct(ci.hi)) + "] n=" + std::to_string(r.n);
  if (base && base != &r && base->ok && !r.prompts.empty() && !base->prompts.empty()) {
    const std::string v = CompareWithBaseline(*base, r).verdict;
    if (v == "worse") out += " ▼";
    if (v == "better") out += " ▲";
  }
  return out;
}
double HeadlineValue(Task t, const RetrievalResult& r) {
  return (t == Task::kNeedle || IsRulerTask(t)) ? r.Score() : r.Accuracy();
}
double CellValue(Task t, const CellResult& c) {
  return (t == Task::kNeedle || IsRulerTask(t)) ? c.Score() : c.Accuracy();
}
std::string ColumnTitle(Task t) { return t == Task::kNeedle ? "needle R1-F1" : std::string(TaskName(t)); }

}  // namespace

std::string SummaryTable(const EvalReport& report) {
  const EvalOptions& o = report.settings;
  auto has = [&](Task t) { return HasTask(o, t); };
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
  for (Task t : kRetrievalTasks) {
    if (!has(t)) continue;
    head += " " + ColumnTitle(t) + " |";
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
    for (Task t : kRetrievalTasks) {
      if (!has(t)) continue;
      const std::optional<RetrievalResult>& r = *s.Retrieval(t);
      const std::optional<RetrievalResult>* b = base ? base->Retrieval(t) : nullptr;
      row += " " + (!r ? pending : !r->ok ? err(*r) : HeadlineWithInterval(t, *r, b && *b ? &**b : nullptr)) + " |";
    }
    out += row + "\n";
  }
  return out;
}

namespace {

// The retrieval tasks scored again on the cells the baseline solves.
std::string SolvedTable(const EvalReport& report) {
  const SpecResult* base = Baseline(report);
  std::vector<Task> tasks;
  for (Task t : kRetrievalTasks) {
    const std::optional<RetrievalResult>* b = base ? base->Retrieval(t) : nullptr;
    if (HasTask(report.settings, t) && b && *b && (*b)->ok) tasks.push_back(t);
  }
  if (tasks.empty()) return "";
  std::string md =
      "\n## Retrieval on the cells the baseline solves\n\nA cell (length × depth, or record size for lines) is "
      "solved when every trial of the baseline in it is a hit. First row: the cells the baseline solves; then each "
      "spec's score on those cells only (as in the summary: needle mean ROUGE-1 F1, passkey and lines accuracy, "
      "RULER tasks the share of values found), so a spec is not blamed for what the model cannot do at all.\n\n"
      "| # | spec |";
  std::string rule = "|---|---|";
  for (Task t : tasks) {
    md += " " + ColumnTitle(t) + " |";
    rule += "---:|";
  }
  md += "\n" + rule + "\n| | cells the baseline solves |";
  for (Task t : tasks) {
    const SolvedCells sc = BaselineSolved(**base->Retrieval(t), **base->Retrieval(t));
    md += " " + std::to_string(sc.solved) + "/" + std::to_string(sc.cells) + " (" + Pct(sc.Share()) + ") |";
  }
  md += "\n";
  for (size_t i = 0; i < report.specs.size(); ++i) {
    const SpecResult& s = report.specs[i];
    md += "| " + std::to_string(i) + " | " + Code(s.canonical) + (s.is_baseline ? " (baseline)" : "") + " |";
    for (Task t : tasks) {
      const std::optional<RetrievalResult>& r = *s.Retrieval(t);
      std::string v = "…";
      if (r && !r->ok) {
        v = "error";
      } else if (r) {
        const SolvedCells sc = BaselineSolved(**base->Retrieval(t), *r);
        v = sc.n == 0 ? "–"
                      : (t == Task::kNeedle ? Fixed(sc.Score(), 3)
                                            : Pct(IsRulerTask(t) ? sc.Score() : sc.Accuracy()));
      }
      md += " " + v + " |";
    }
    md += "\n";
  }
  return md;
}

std::string SectionTitle(Task t) {
  switch (t) {
    case Task::kPasskey:
      return "passkey: accuracy by depth × length";
    case Task::kLines:
      return "lines: accuracy by record size";
    case Task::kNeedle:
      return "needle: ROUGE-1 F1 by depth × length";
    case Task::kNiahMultivalue:
    case Task::kVt:
      return std::string(TaskName(t)) + ": share of the values found by depth × length";
    default:
      return std::string(TaskName(t)) + ": exact match by depth × length";
  }
}

// One task's per-spec results: the lines table, or a depth x length table
// and its heat map.
std::string RetrievalSection(const EvalReport& report, Task task, bool with_images) {
  const EvalOptions& o = report.settings;
  const std::string name(TaskName(task));
  std::string md = "\n## " + SectionTitle(task) + "\n\n";
  for (size_t i = 0; i < report.specs.size(); ++i) {
    const SpecResult& s = report.specs[i];
    const std::optional<RetrievalResult>& r = *s.Retrieval(task);
    if (!r) continue;
    md += "**" + Code(s.canonical) + "**" + (s.is_baseline ? " (baseline)" : "") + ": ";
    if (!r->ok) {
      md += "error: " + r->error + "\n\n";
      continue;
    }
    if (task == Task::kNeedle) {
      md += "mean ROUGE-1 F1 " + Fixed(r->Score(), 3) + ", all answer words found in " + Pct(r->Accuracy());
    } else if (task == Task::kNiahMultivalue || task == Task::kVt) {
      md += "values found " + Pct(r->Score()) + ", all of them in " + Pct(r->Accuracy());
    } else {
      md += "accuracy " + Pct(r->Accuracy());
    }
    md += " of " + std::to_string(r->n) + "\n\n";
    if (task == Task::kLines) {
      md += "| lines | prompt tokens | accuracy | n | first output |\n|---:|---:|---:|---:|---|\n";
      for (const CellResult& c : r->cells) {
        md += "| " + std::to_string(c.cell.n_lines) + " | " + Fixed(c.n ? c.prompt_tokens_sum / c.n : 0.0, 0) +
              " | " + Pct(c.Accuracy()) + " | " + std::to_string(c.n) + " | " + Code(c.example) + " |\n";
      }
      md += "\n";
      continue;
    }
    if (with_images) md += "![" + name + " heat map](" + name + "-" + std::to_string(i) + ".svg)\n\n";
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
          if (c.cell.length == l && c.cell.depth == d) {
            v = task == Task::kNeedle ? Fixed(c.Score(), 2) : Pct(CellValue(task, c));
          }
        }
        md += " " + v + " |";
      }
      md += "\n";
    }
    if (IsRulerTask(task)) {
      // The first output of the first cell, to show what the model answers.
      for (const CellResult& c : r->cells) {
        if (c.n > 0) {
          md += "\nFirst output (" + std::to_string(c.cell.length) + " tokens, depth " + DepthLabel(c.cell.depth) +
                "): " + Code(c.example) + "\n";
          break;
        }
      }
    }
    md += "\n";
  }
  return md;
}

}  // namespace

std::string ReportToMarkdown(const EvalReport& report, bool with_images) {
  const EvalOptions& o = report.settings;
  const ModelInfo& m = report.model;
  auto has = [&](Task t) { return HasTask(o, t); };
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
  if (std::any_of(o.tasks.begin(), o.tasks.end(), IsRulerTask)) {
    md += "niah_*, vt (RULER): share of the asked values among the answer's first candidates (exact match). ";
  }
  if (std::any_of(o.tasks.begin(), o.tasks.end(), [](Task t) {
        return std::find(std::begin(kRetrievalTasks), std::end(kRetrievalTasks), t) != std::end(kRetrievalTasks);
      })) {
    md += "Retrieval cells: score [95% interval: Wilson for rates, bootstrap of the mean for needle's ROUGE] n = "
          "prompts; ▼ / ▲: worse / better than the baseline on the same prompts (exact McNemar, alpha 0.05, no "
          "correction for multiple comparisons). ";
  }
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
  md += SolvedTable(report);
  for (Task t : kRetrievalTasks) {
    if (has(t)) md += RetrievalSection(report, t, with_images);
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
  for (Task t : kRetrievalTasks) {
    const std::string title = t == Task::kNeedle  ? "needle ROUGE-1 F1"
                              : IsRulerTask(t)     ? std::string(TaskName(t)) + " values found"
                                                   : std::string(TaskName(t)) + " accuracy";
    add_panel(title, true, t != Task::kNeedle, [t](const SpecResult& s, double* b, double* v) {
      const std::optional<RetrievalResult>& r = *s.Retrieval(t);
      if (!r || !r->ok) return false;
      *b = static_cast<double>(r->kv.peak_bytes);
      *v = HeadlineValue(t, *r);
      return true;
    });
  }
  if (chart.panels.empty()) return "";
  return RenderParetoSvg(chart);
}

std::string HeatMapSvg(const EvalReport& report, size_t index, Task task) {
  if (index >= report.specs.size() || !IsGridTask(task)) return "";
  const SpecResult& s = report.specs[index];
  const std::optional<RetrievalResult>& r = *s.Retrieval(task);
  if (!r || !r->ok) return "";
  const EvalOptions& o = report.settings;
  HeatMapData h;
  const ModelInfo& m = report.model;
  const bool needle = task == Task::kNeedle;
  h.title = (needle                  ? std::string("Needle in a haystack, ROUGE-1 F1: ")
             : task == Task::kPasskey ? std::string("Passkey retrieval accuracy: ")
                                      : std::string(TaskName(task)) + " (RULER), share of values found: ") +
            ModelLabel(m);
  h.subtitle = "--kv " + s.canonical + (s.is_baseline ? " (baseline)" : "") + "; KV peak " +
               FormatBytes(static_cast<double>(r->kv.peak_bytes)) + "; overall " +
               (needle ? FormatNumber(r->Score(), 3) : FormatNumber(HeadlineValue(task, *r) * 100, 1) + "%");
  h.x_label = "sequence length (tokens, prompt + answer)";
  h.y_label = "depth";
  h.percent = !needle;
  for (int l : o.lengths) h.x_labels.push_back(std::to_string(l));
  for (double d : o.depths) {
    h.y_labels.push_back(DepthLabel(d));
    std::vector<double> row;
    for (int l : o.lengths) {
      double v = NAN;
      for (const CellResult& c : r->cells) {
        if (c.cell.length == l && c.cell.depth == d && c.n > 0) v = CellValue(task, c);
      }
      row.push_back(v);
    }
    h.values.push_back(row);
  }
  return RenderHeatMapSvg(h);
}

Status WriteReportDir(const EvalReport& report, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return IoError("cannot create the report directory " + dir + ": " + ec.message());
  KVX_RETURN_IF_ERROR(WriteFileAtomically(dir + "/report.json", ReportToJsonText(report)));
  KVX_RETURN_IF_ERROR(WriteFileAtomically(dir + "/report.md", ReportToMarkdown(report, /*with_images=*/true)));
  const std::string pareto = ParetoSvg(report);
  if (!pareto.empty()) KVX_RETURN_IF_ERROR(WriteFileAtomically(dir + "/pareto.svg", pareto));
  for (size_t i = 0; i < report.specs.size(); ++i) {
    for (Task task : kRetrievalTasks) {
      const std::string svg = HeatMapSvg(report, i, task);
      if (!svg.empty()) {
        KVX_RETURN_IF_ERROR(
            WriteFileAtomically(dir + "/" + std::string(TaskName(task)) + "-" + std::to_string(i) + ".svg", svg));
      }
    }
  }
  return Status::Ok();
}

}  // namespace kvx::eval
