#include "eval/plots.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <utility>

#include "eval/svg.h"

namespace kvx::eval {

namespace {

// Colour-blind-safe palette (Okabe-Ito, then Tableau).
constexpr const char* kPalette[] = {"#000000", "#e69f00", "#56b4e9", "#009e73", "#d55e00",
                                    "#0072b2", "#cc79a7", "#f0e442", "#8c564b", "#7f7f7f"};
std::string SeriesColor(int i) { return kPalette[static_cast<size_t>(i) % (sizeof(kPalette) / sizeof(*kPalette))]; }

std::string FormatValue(double v, bool percent) {
  if (percent) return FormatNumber(v * 100.0, 1) + "%";
  const double a = std::fabs(v);
  if (a != 0 && (a < 0.01 || a >= 1e5)) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.2g", v);
    return buf;
  }
  return FormatNumber(v, a < 1 ? 4 : (a < 100 ? 3 : 1));
}

std::string FormatFixed2(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", v);
  return buf;
}

// A tick label with just enough decimals to tell ticks `step` apart.
std::string FormatTick(double v, double step, bool percent) {
  if (percent) {
    v *= 100.0;
    step *= 100.0;
  }
  int decimals = 0;
  if (step > 0) decimals = std::clamp(static_cast<int>(std::ceil(-std::log10(step) - 1e-9)), 0, 8);
  if (step > 0 && std::fabs(step * std::pow(10.0, decimals) - std::round(step * std::pow(10.0, decimals))) > 1e-6) {
    decimals++;  // 2.5 x 10^k steps need one more
  }
  const double a = std::fabs(v);
  std::string out;
  if (!percent && a != 0 && (a < 1e-3 || a >= 1e6)) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.3g", v);
    out = buf;
  } else {
    char buf[48];
    std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
    out = buf;
  }
  return percent ? out + "%" : out;
}

// Byte ticks at round numbers of one binary unit (B, KiB, MiB, GiB).
std::vector<std::pair<double, std::string>> ByteTicks(double max_bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  double scale = 1;
  while (u < 3 && max_bytes / scale >= 1024.0 * 2) {
    scale *= 1024.0;
    ++u;
  }
  std::vector<std::pair<double, std::string>> ticks;
  const std::vector<double> t = NiceTicks(0, max_bytes / scale, 5);
  const double step = t.size() > 1 ? t[1] - t[0] : 1;
  for (double v : t) ticks.emplace_back(v * scale, FormatTick(v, step, false) + " " + units[u]);
  return ticks;
}

}  // namespace

std::string FormatBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  if (u == 0) return FormatNumber(bytes, 0) + " B";
  return FormatNumber(bytes, std::fabs(bytes) < 10 ? 2 : (std::fabs(bytes) < 100 ? 1 : 0)) + " " + units[u];
}

std::vector<double> NiceTicks(double lo, double hi, int max_ticks) {
  std::vector<double> ticks;
  if (!(hi > lo) || max_ticks < 2) {
    ticks.push_back(lo);
    return ticks;
  }
  const double raw = (hi - lo) / (max_ticks - 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  const double first = std::ceil(lo / step - 1e-9) * step;
  for (double t = first; t <= hi + step * 1e-9; t += step) ticks.push_back(std::fabs(t) < step * 1e-9 ? 0.0 : t);
  return ticks;
}

std::vector<size_t> ParetoFrontier(const std::vector<ParetoPoint>& points, bool higher_is_better) {
  std::vector<size_t> order(points.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto better = [&](double a, double b) { return higher_is_better ? a > b : a < b; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (points[a].bytes != points[b].bytes) return points[a].bytes < points[b].bytes;
    return better(points[a].value, points[b].value);
  });
  std::vector<size_t> frontier;
  for (size_t idx : order) {
    if (!std::isfinite(points[idx].value)) continue;
    if (frontier.empty() || better(points[idx].value, points[frontier.back()].value)) frontier.push_back(idx);
  }
  return frontier;
}

std::string RenderParetoSvg(const ParetoChart& chart) {
  const int n_panels = static_cast<int>(chart.panels.size());
  const int cols = std::max(1, std::min(3, n_panels));
  const int rows = std::max(1, (n_panels + cols - 1) / cols);
  const double pw = 330, ph = 250;  // panel size
  const double margin = 20, header = 56;
  const double legend_row = 18;
  const double legend_h = 16 + legend_row * static_cast<double>(chart.legend.size());
  const double width = margin * 2 + pw * cols;
  const double height = header + ph * rows + legend_h + margin;
  Svg svg(width, height);
  svg.Text(margin, 24, chart.title, 16, "start", "#111", 0, true);
  svg.Text(margin, 44, chart.subtitle, 11, "start", "#555");

  for (int p = 0; p < n_panels; ++p) {
    const ParetoPanel& panel = chart.panels[static_cast<size_t>(p)];
    const double ox = margin + pw * (p % cols), oy = header + ph * (p / cols);
    const double left = ox + 62, right = ox + pw - 14, top = oy + 28, bottom = oy + ph - 44;
    svg.Text(ox + pw / 2, oy + 16,
             panel.title + (panel.higher_is_better ? "  (higher is better)" : "  (lower is better)"), 12, "middle",
             "#111", 0, true);
    // Ranges.
    double xmax = 0;
    double ymin = INFINITY, ymax = -INFINITY;
    for (const ParetoPoint& pt : panel.points) {
      xmax = std::max(xmax, pt.bytes);
      if (std::isfinite(pt.value)) {
        ymin = std::min(ymin, pt.value);
        ymax = std::max(ymax, pt.value);
      }
    }
    if (xmax <= 0) xmax = 1;
    xmax *= 1.12;
    if (panel.percent) {
      ymin = 0;
      ymax = 1;
    } else if (!std::isfinite(ymin)) {
      ymin = 0;
      ymax = 1;
    } else {
      double span = ymax - ymin;
      if (span <= 0) span = std::max(std::fabs(ymax) * 0.1, 1e-3);
      ymin -= span * 0.15;
      ymax += span * 0.15;
      if (ymin < 0 &&
          std::all_of(panel.points.begin(), panel.points.end(), [](const ParetoPoint& q) { return !(q.value < 0); })) {
        ymin = 0;
      }
    }
    auto X = [&](double b) { return left + (right - left) * b / xmax; };
    auto Y = [&](double v) { return bottom - (bottom - top) * (v - ymin) / (ymax - ymin); };
    // Axes and grid.
    svg.Rect(left, top, right - left, bottom - top, "#fafafa", "#999", 1);
    for (const auto& [t, label] : ByteTicks(xmax)) {
      const double x = X(t);
      if (x > right + 0.5) continue;
      svg.Line(x, top, x, bottom, "#e4e4e4", 1);
      svg.Text(x, bottom + 14, label, 9, "middle", "#444");
    }
    const std::vector<double> yticks = NiceTicks(ymin, ymax, 5);
    const double ystep = yticks.size() > 1 ? yticks[1] - yticks[0] : 1;
    for (double t : yticks) {
      const double y = Y(t);
      if (y < top - 0.5 || y > bottom + 0.5) continue;
      svg.Line(left, y, right, y, "#e4e4e4", 1);
      svg.Text(left - 5, y + 3, FormatTick(t, ystep, panel.percent), 9, "end", "#444");
    }
    svg.Text((left + right) / 2, bottom + 32, chart.x_label, 10, "middle", "#333");
    // Frontier.
    const std::vector<size_t> front = ParetoFrontier(panel.points, panel.higher_is_better);
    if (front.size() >= 2) {
      std::vector<std::pair<double, double>> pts;
      for (size_t i : front) pts.emplace_back(X(panel.points[i].bytes), Y(panel.points[i].value));
      svg.Polyline(pts, "#888", 1.5, "5,4");
    }
    // Points; points at the same spot share one label ("1,3").
    std::map<std::pair<long, long>, std::string> labels;
    for (const ParetoPoint& pt : panel.points) {
      if (!std::isfinite(pt.value)) continue;
      const double x = X(pt.bytes), y = Y(pt.value);
      const std::string name =
          pt.series < static_cast<int>(chart.legend.size()) ? chart.legend[static_cast<size_t>(pt.series)] : "";
      svg.Circle(x, y, 5, SeriesColor(pt.series), "#fff",
                 name + ": " + FormatValue(pt.value, panel.percent) + " at " + FormatBytes(pt.bytes));
      if (pt.series == 0) svg.Circle(x, y, 8, "none", SeriesColor(0));  // the baseline: a ring stays visible
      std::string& l = labels[{std::lround(x), std::lround(y)}];
      l += (l.empty() ? "" : ",") + std::to_string(pt.series + 1);
    }
    for (const auto& [xy, text] : labels) {
      const double lx = std::min(static_cast<double>(xy.first) + 8, right - 6.0 * text.size());
      const double ly = std::max(static_cast<double>(xy.second) - 7, top + 10);
      svg.Text(lx, ly, text, 10, "start", "#111");
    }
  }
  // Legend.
  double ly = header + ph * rows + 12;
  for (size_t i = 0; i < chart.legend.size(); ++i) {
    svg.Circle(margin + 8, ly - 4, 5, SeriesColor(static_cast<int>(i)), "#fff");
    svg.Text(margin + 20, ly, std::to_string(i + 1) + "  " + chart.legend[i], 11, "start", "#111");
    ly += legend_row;
  }
  return svg.Finish();
}

std::string HeatColor(double v) {
  if (!std::isfinite(v)) return "#d9d9d9";
  v = std::clamp(v, 0.0, 1.0);
  // Three stops: red (215,48,39), yellow (254,224,139), green (26,152,80).
  const double stops[3][3] = {{215, 48, 39}, {254, 224, 139}, {26, 152, 80}};
  const int seg = v < 0.5 ? 0 : 1;
  const double t = v < 0.5 ? v / 0.5 : (v - 0.5) / 0.5;
  char buf[8];
  int rgb[3];
  for (int c = 0; c < 3; ++c) {
    rgb[c] = static_cast<int>(std::lround(stops[seg][c] + (stops[seg + 1][c] - stops[seg][c]) * t));
  }
  std::snprintf(buf, sizeof(buf), "#%02x%02x%02x", rgb[0], rgb[1], rgb[2]);
  return buf;
}

std::string RenderHeatMapSvg(const HeatMapData& map) {
  const size_t n_cols = map.x_labels.size(), n_rows = map.y_labels.size();
  const double cw = std::max(52.0, 520.0 / std::max<size_t>(1, n_cols)), ch = 30;
  const double left = 86, top = 62, bar_w = 16;
  const double grid_w = cw * n_cols, grid_h = ch * n_rows;
  const double width = left + grid_w + 90, height = top + grid_h + 56;
  Svg svg(std::max(width, 420.0), height);
  svg.Text(14, 22, map.title, 15, "start", "#111", 0, true);
  svg.Text(14, 40, map.subtitle, 11, "start", "#555");
  for (size_t r = 0; r < n_rows; ++r) {
    for (size_t c = 0; c < n_cols; ++c) {
      const double v = r < map.values.size() && c < map.values[r].size() ? map.values[r][c] : NAN;
      const double x = left + cw * c, y = top + ch * r;
      const std::string label =
          !std::isfinite(v) ? "n/a" : (map.percent ? FormatNumber(v * 100.0, 0) + "%" : FormatFixed2(v));
      svg.Rect(x, y, cw, ch, HeatColor(v), "#ffffff", 1,
               map.y_label + " " + map.y_labels[r] + ", " + map.x_label + " " + map.x_labels[c] + ": " + label);
      const bool dark = std::isfinite(v) && (v < 0.2 || v > 0.85);
      svg.Text(x + cw / 2, y + ch / 2 + 4, label, 10, "middle", dark ? "#ffffff" : "#111111");
    }
  }
  for (size_t r = 0; r < n_rows; ++r) svg.Text(left - 6, top + ch * r + ch / 2 + 4, map.y_labels[r], 10, "end", "#333");
  for (size_t c = 0; c < n_cols; ++c) {
    svg.Text(left + cw * c + cw / 2, top + grid_h + 15, map.x_labels[c], 10, "middle", "#333");
  }
  svg.Text(left + grid_w / 2, top + grid_h + 36, map.x_label, 11, "middle", "#111");
  svg.Text(22, top + grid_h / 2, map.y_label, 11, "middle", "#111", -90);
  // Colour bar.
  const double bx = left + grid_w + 24;
  const int steps = 20;
  for (int i = 0; i < steps; ++i) {
    const double v = 1.0 - (i + 0.5) / steps;
    svg.Rect(bx, top + grid_h * i / steps, bar_w, grid_h / steps + 0.5, HeatColor(v));
  }
  svg.Rect(bx, top, bar_w, grid_h, "none", "#999", 1);
  svg.Text(bx + bar_w + 4, top + 9, map.percent ? "100%" : "1", 9, "start", "#333");
  svg.Text(bx + bar_w + 4, top + grid_h, map.percent ? "0%" : "0", 9, "start", "#333");
  return svg.Finish();
}

}  // namespace kvx::eval
