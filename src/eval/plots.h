// The plots of a kvx eval report, written as SVG (eval/svg.h):
//
//  * a Pareto chart: one panel per quality metric, each spec a point at
//    (KV bytes held by the pool, quality), the non-dominated points joined by
//    a dashed line (the frontier: no other spec is both smaller and better);
//  * a heat map: a depth x length grid of scores in [0, 1] (needle, passkey),
//    red (0) -> yellow (0.5) -> green (1), each cell labelled with its value.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvx::eval {

struct ParetoPoint {
  int series = 0;    // index into ParetoChart::legend (colour and number)
  double bytes = 0;  // x: KV bytes
  double value = 0;  // y: the metric
};

struct ParetoPanel {
  std::string title;  // e.g. "PPL"
  bool higher_is_better = false;
  bool percent = false;  // values are fractions in [0, 1], shown as %
  std::vector<ParetoPoint> points;
};

struct ParetoChart {
  std::string title;
  std::string subtitle;
  std::vector<std::string> legend;  // series labels (spec strings)
  std::vector<ParetoPanel> panels;
  std::string x_label = "KV bytes held by the pool (peak)";
};

// Indices of the non-dominated points, ordered by bytes ascending: a point is
// kept when no point with fewer or equal bytes has a strictly better value
// (ties in bytes: the better value wins; exact duplicates keep the first).
std::vector<size_t> ParetoFrontier(const std::vector<ParetoPoint>& points, bool higher_is_better);

std::string RenderParetoSvg(const ParetoChart& chart);

struct HeatMapData {
  std::string title;
  std::string subtitle;
  std::string x_label;                      // e.g. "context length (tokens)"
  std::string y_label;                      // e.g. "needle depth"
  std::vector<std::string> x_labels;        // columns
  std::vector<std::string> y_labels;        // rows, top to bottom
  std::vector<std::vector<double>> values;  // [row][col] in [0, 1]; NaN = no data
  bool percent = false;                     // label cells as % instead of 0.00
};

std::string RenderHeatMapSvg(const HeatMapData& map);

// "#rrggbb" for a score in [0, 1] (clamped): red -> yellow -> green.
std::string HeatColor(double v);

// Human-readable bytes with binary units: "512 B", "12.5 KiB", "3.25 MiB".
std::string FormatBytes(double bytes);

// About `max_ticks` round tick values (1, 2, 2.5, 5 x 10^k steps) covering
// [lo, hi]. REQUIRES: lo <= hi.
std::vector<double> NiceTicks(double lo, double hi, int max_ticks);

}  // namespace kvx::eval
