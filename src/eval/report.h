// The outputs of kvx eval: the JSON report (schema "kvx.eval/1", documented
// field by field in docs/eval.md), a Markdown summary, and SVG plots (the
// Pareto chart of quality against KV bytes, depth x length heat maps for
// every grid task: passkey, needle, niah*, vt).
//
// The JSON is the record: ReportFromJson reads back everything the Markdown
// and the plots are drawn from, so `kvx eval --render` re-renders a committed
// report from its report.json byte for byte (scripts/eval_report.py --check).
//
// Files are written atomically (a temporary file renamed over the target), so
// a reader never sees half a report, and they are rewritten after every
// finished task: an interrupted run keeps what finished.
//
// Thread-safety: pure functions, except the Write* ones, which write files.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "eval/eval.h"
#include "util/status.h"

namespace kvx::eval {

inline constexpr const char* kReportSchema = "kvx.eval/1";

nlohmann::json ReportToJson(const EvalReport& report);
// ReportToJson as indented text; invalid UTF-8 in model outputs (a byte token
// cut in half) becomes U+FFFD instead of failing.
std::string ReportToJsonText(const EvalReport& report);
// The inverse of ReportToJson: ReportToJson(*ReportFromJson(j)) == j for any
// report it wrote. InvalidArgument for another schema or a missing field.
Result<EvalReport> ReportFromJson(const nlohmann::json& j);
Result<EvalReport> ReportFromJsonText(std::string_view text);

// The summary table (one row per spec) followed by per-task detail tables.
// `image_dir_prefix`: when not empty, the Markdown links the SVGs written by
// WriteReportDir (relative to the Markdown file).
std::string ReportToMarkdown(const EvalReport& report, bool with_images);

// The main table only (what `kvx eval` prints on stdout).
std::string SummaryTable(const EvalReport& report);

// The Pareto chart (empty string when no task has a plottable metric).
std::string ParetoSvg(const EvalReport& report);
// Heat map of spec `index` for a grid task ("" when absent or not a grid task).
std::string HeatMapSvg(const EvalReport& report, size_t index, Task task);

// report.json, report.md, pareto.svg and <task>-<i>.svg heat maps of every
// grid task into `dir` (created if needed); i is the spec's index (0 =
// baseline).
Status WriteReportDir(const EvalReport& report, const std::string& dir);

}  // namespace kvx::eval
