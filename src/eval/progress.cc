#include "eval/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include "util/clock.h"

namespace kvx::eval {

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  }
  return buf;
}

std::string FormatProgress(const ProgressState& st, int width) {
  const double frac =
      st.total_weight > 0 ? std::clamp(st.done_weight / st.total_weight, 0.0, 1.0) : (st.total_items > 0 ? 0.0 : 1.0);
  const double eta =
      st.done_weight > 0 ? st.elapsed_seconds * (st.total_weight - st.done_weight) / st.done_weight : -1.0;
  char pct[16];
  std::snprintf(pct, sizeof(pct), "%3d%%", static_cast<int>(std::floor(frac * 100.0 + 1e-9)));
  const std::string counts = std::to_string(st.done_items) + "/" + std::to_string(st.total_items);
  const std::string times = FormatDuration(st.elapsed_seconds) + " elapsed, ETA " + FormatDuration(eta);
  std::string bar;
  if (width >= 40) {
    const int bar_w = std::clamp(width / 8, 10, 30);
    const int fill = static_cast<int>(std::floor(frac * bar_w));
    bar = "[";
    for (int i = 0; i < bar_w; ++i) bar += i < fill ? '=' : (i == fill ? '>' : ' ');
    if (fill >= bar_w) bar.back() = '=';
    bar += "] ";
  }
  const std::string head = bar + pct + "  " + counts + "  ";
  const std::string tail = "  " + times;
  std::string label = st.label;
  const int room = width - static_cast<int>(head.size() + tail.size());
  if (room <= 3) {
    label.clear();
  } else if (static_cast<int>(label.size()) > room) {
    label = label.substr(0, static_cast<size_t>(room - 3)) + "...";
  }
  std::string line = head + label + tail;
  if (width > 0 && static_cast<int>(line.size()) > width) line.resize(static_cast<size_t>(width));
  return line;
}

ProgressBar::ProgressBar(Options options) : options_(std::move(options)) {
  if (options_.width <= 0) {
    options_.width = 80;
    if (options_.enabled && options_.out) {
      struct winsize ws {};
      if (ioctl(fileno(options_.out), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) options_.width = ws.ws_col - 1;
    }
  }
  start_ = Now();
}

ProgressBar::~ProgressBar() { Finish(); }

double ProgressBar::Now() const {
  if (options_.clock) return options_.clock();
  return util::MonotonicSeconds();
}

void ProgressBar::SetTotal(int64_t items, double weight) {
  state_.total_items = items + pending_items_;
  state_.total_weight = weight + pending_weight_;
  Draw(false);
}

void ProgressBar::SetPending(int64_t items, double weight) {
  state_.total_items += items - pending_items_;
  state_.total_weight += weight - pending_weight_;
  pending_items_ = items;
  pending_weight_ = weight;
  Draw(false);
}

void ProgressBar::SetLabel(std::string label) {
  state_.label = std::move(label);
  Draw(false);
}

void ProgressBar::Advance(int64_t items, double weight) {
  state_.done_items += items;
  state_.done_weight += weight;
  Draw(state_.done_items >= state_.total_items);
}

void ProgressBar::Message(const std::string& line) {
  if (!options_.enabled) return;
  Clear();
  std::fprintf(options_.out, "%s\n", line.c_str());
  Draw(true);
}

void ProgressBar::Finish() {
  if (!options_.enabled) return;
  Clear();
  std::fflush(options_.out);
}

void ProgressBar::Clear() {
  if (drawn_) {
    std::fputs("\r\033[K", options_.out);
    drawn_ = false;
  }
}

void ProgressBar::Draw(bool force) {
  if (!options_.enabled) return;
  const double now = Now();
  if (!force && now - last_draw_ < options_.min_redraw_seconds) return;
  last_draw_ = now;
  state_.elapsed_seconds = now - start_;
  std::fprintf(options_.out, "\r\033[K%s", FormatProgress(state_, options_.width).c_str());
  std::fflush(options_.out);
  drawn_ = true;
}

}  // namespace kvx::eval
