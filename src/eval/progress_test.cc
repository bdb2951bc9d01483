#include "eval/progress.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

namespace kvx::eval {
namespace {

TEST(ProgressTest, FormatDuration) {
  EXPECT_EQ(FormatDuration(0), "0:00");
  EXPECT_EQ(FormatDuration(7.4), "0:07");
  EXPECT_EQ(FormatDuration(754), "12:34");
  EXPECT_EQ(FormatDuration(3723), "1:02:03");
  EXPECT_EQ(FormatDuration(-1), "--:--");
  EXPECT_EQ(FormatDuration(NAN), "--:--");
}

TEST(ProgressTest, FormatProgressShowsCountsPercentAndEta) {
  ProgressState st;
  st.done_items = 37;
  st.total_items = 120;
  st.done_weight = 250;
  st.total_weight = 1000;
  st.elapsed_seconds = 10;
  st.label = "spec 1/2 codec=f16: copy";
  const std::string line = FormatProgress(st, 100);
  EXPECT_EQ(line, "[===>        ]  25%  37/120  spec 1/2 codec=f16: copy  0:10 elapsed, ETA 0:30");
  EXPECT_LE(line.size(), 100u);
}

TEST(ProgressTest, FormatProgressFitsNarrowWidthsAndStartsWithoutEta) {
  ProgressState st;
  st.total_items = 4;
  st.total_weight = 100;
  st.label = std::string(200, 'x');
  const std::string line = FormatProgress(st, 60);
  EXPECT_LE(line.size(), 60u);
  EXPECT_NE(line.find("ETA --:--"), std::string::npos);
  EXPECT_NE(line.find("..."), std::string::npos);
  const std::string narrow = FormatProgress(st, 30);  // no bar below 40 columns
  EXPECT_EQ(narrow.find('['), std::string::npos);
  EXPECT_LE(narrow.size(), 30u);
  st.done_items = 4;
  st.done_weight = 100;
  EXPECT_NE(FormatProgress(st, 100).find("[============] 100%"), std::string::npos);
}

TEST(ProgressTest, DisabledBarPrintsNothingAndEnabledBarRedraws) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  ASSERT_NE(f, nullptr);
  double now = 0;
  {
    ProgressBar::Options o;
    o.enabled = false;
    o.out = f;
    o.clock = [&] { return now; };
    ProgressBar bar(o);
    bar.SetTotal(2, 10);
    bar.Advance(1, 5);
    bar.Message("hello");
    bar.Finish();
  }
  std::fflush(f);
  EXPECT_EQ(len, 0u);
  {
    ProgressBar::Options o;
    o.out = f;
    o.width = 80;
    o.clock = [&] { return now; };
    ProgressBar bar(o);
    bar.SetTotal(2, 10);
    now = 1;
    bar.Advance(1, 5);
    now = 1.01;  // rate-limited: no redraw
    bar.SetLabel("x");
    bar.Message("done: spec");
    now = 2;
    bar.Advance(1, 5);
    bar.Finish();
  }
  std::fflush(f);
  const std::string out(buf, len);
  EXPECT_NE(out.find(" 50%  1/2"), std::string::npos) << out;
  EXPECT_NE(out.find("done: spec\n"), std::string::npos);
  EXPECT_NE(out.find("100%  2/2"), std::string::npos);
  EXPECT_EQ(out.substr(out.size() - 4), "\r\033[K");  // the bar is erased at the end
  std::fclose(f);
  free(buf);
}

// Pending work stays in the totals when a later SetTotal counts only its
// own (kvx tune's retrieval: one RunEval per spec, more specs to come).
TEST(ProgressTest, PendingWorkStaysInTheTotals) {
  ProgressBar::Options o;
  o.enabled = false;
  ProgressBar bar(o);
  bar.SetTotal(10, 100);
  bar.SetPending(20, 200);
  EXPECT_EQ(bar.state().total_items, 30);
  EXPECT_DOUBLE_EQ(bar.state().total_weight, 300);
  bar.Advance(10, 100);
  bar.SetTotal(bar.state().done_items + 10, bar.state().done_weight + 100);  // the next run's own work
  EXPECT_EQ(bar.state().total_items, 40);
  bar.SetPending(0, 0);
  EXPECT_EQ(bar.state().total_items, 20);
  EXPECT_DOUBLE_EQ(bar.state().total_weight, 200);
}

}  // namespace
}  // namespace kvx::eval
