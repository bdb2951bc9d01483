// The outputs of kvx eval: the JSON report (schema "kvx.eval/1", documented
// field by field in docs/eval.md), a Markdown summary, and SVG plots (the
// Pareto chart of quality against KV bytes, depth x length heat maps for
// needle and passkey).
//
// Files are written atomically (a temporary file renamed over the target), so
// a reader never sees half a report, and they are rewritten after every
// finished task: an interrupted run keeps what finished.
//
// Thread-safety: pure functions, except the Write* ones, which write files.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "eval/eval.h"
#include "util/status.h"

namespace kvx::eval {

inline constexpr const char* kReportSchema = "kvx.eval/1";

nlohmann::json ReportToJson(const EvalReport& report);
// ReportToJson as indented text; invalid UTF-8 in model outputs (a byte token
// cut in half) becomes U+FFFD instead of failing.
std::string ReportToJsonText(const EvalReport& report);

// The summary table (one row per spec) followed by per-task detail tables.
// `image_dir_prefix`: when not empty, the Markdown links the SVGs written by
// WriteReportDir (relative to the Markdown file).
std::string ReportToMarkdown(const EvalReport& report, bool with_images);

// The main table only (what `kvx eval` prints on stdout).
std::string SummaryTable(const EvalReport& report);

// The Pareto chart (empty string when no task has a plottable metric).
std::string ParetoSvg(const EvalReport& report);
// Heat map of spec `index` for "needle" or "passkey" ("" when absent).
std::string HeatMapSvg(const EvalReport& report, size_t index, const std::string& task);

// Writes `content` to `path` through a temporary file and a rename.
Status WriteFileAtomic(const std::string& path, const std::string& content);
// report.json, report.md, pareto.svg, needle-<i>.svg, passkey-<i>.svg into
// `dir` (created if needed); i is the spec's index (0 = baseline).
Status WriteReportDir(const EvalReport& report, const std::string& dir);

}  // namespace kvx::eval
