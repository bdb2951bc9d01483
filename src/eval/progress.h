// A one-line progress bar for long kvx eval runs, drawn on a terminal:
//
//   [=========>          ]  47%  37/120  codec=f16: needle  0:12 elapsed, ETA 0:14
//
// Progress is counted in items (chunks, prompts, sequences: the "37/120") and
// in weights (tokens processed), which drive the percentage and the ETA, so a
// 2048-token prompt counts for more than a 128-token one. ETA = elapsed x
// (remaining weight / done weight).
//
// A disabled bar prints nothing (kvx eval disables it when stderr is not a
// terminal or with --quiet). Redraws are rate-limited; Message() prints a line
// above the bar. The clock is injectable for tests.
//
// Thread-safety: not thread-safe; one thread drives it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace kvx::eval {

struct ProgressState {
  int64_t done_items = 0;
  int64_t total_items = 0;
  double done_weight = 0;
  double total_weight = 0;
  double elapsed_seconds = 0;
  std::string label;
};

// "0:07", "12:34", "1:02:03"; "--:--" for negative or non-finite input.
std::string FormatDuration(double seconds);

// The bar line for `state`, at most `width` columns (the label is shortened
// with "..." to fit; width < 40 drops the bar itself). Pure.
std::string FormatProgress(const ProgressState& state, int width);

class ProgressBar {
 public:
  struct Options {
    bool enabled = true;
    FILE* out = stderr;
    int width = 0;  // 0: the terminal's width (80 if unknown)
    double min_redraw_seconds = 0.1;
    std::function<double()> clock;  // seconds; default: steady clock
  };

  explicit ProgressBar(Options options);
  ~ProgressBar();

  void SetTotal(int64_t items, double weight);
  // Work expected after what SetTotal counts (a caller that runs several
  // RunEvals, each setting the total to its own work): the totals shown and
  // the ETA include it until it is set again (0 when none).
  void SetPending(int64_t items, double weight);
  void SetLabel(std::string label);
  void Advance(int64_t items, double weight);
  // Prints `line` (plus newline) above the bar.
  void Message(const std::string& line);
  // Erases the bar (the last state stays readable in Message()s).
  void Finish();

  const ProgressState& state() const { return state_; }
  bool enabled() const { return options_.enabled; }

 private:
  void Draw(bool force);
  void Clear();
  double Now() const;

  Options options_;
  ProgressState state_;
  double start_ = 0;
  double last_draw_ = -1e30;
  int64_t pending_items_ = 0;
  double pending_weight_ = 0;
  bool drawn_ = false;
};

}  // namespace kvx::eval
