// SequenceObservations::Fold: the sliding window's two forms, the
// exponential blend and the exact ring (Scissorhands' ring=1).
#include "kv/policy/observations.h"

#include <gtest/gtest.h>

namespace kvx::kv {
namespace {

// One step's statistics of (layer 0, head 0): `queries` queries, each giving
// position 0 a low hit when low0 is set, position 1 never.
SequenceObservations Step(int queries, bool low0) {
  SequenceObservations s;
  s.NoteHead(0);
  HeadStats& h = s.mutable_head(0, 0);
  h.sum = {0.1f * queries, 0.9f * queries};
  h.low = {low0 ? static_cast<float>(queries) : 0.0f, 0.0f};
  h.queries = queries;
  return s;
}

ObservationNeeds Window(int w, bool exact) {
  ObservationNeeds n;
  n.probabilities = true;
  n.fold_window = w;
  n.low_hits = true;
  n.exact_window = exact;
  return n;
}

// A prompt of 8 queries (all low on position 0), then 4 decode steps of
// which only the last is low: a window of 3 queries holds exactly the last
// three steps, one low hit; the blend still remembers the prompt.
TEST(ObservationsTest, TheExactWindowHoldsTheLastQueriesOnly) {
  for (bool exact : {true, false}) {
    SCOPED_TRACE(exact ? "ring" : "blend");
    const ObservationNeeds needs = Window(3, exact);
    SequenceObservations o;
    o.Fold(Step(8, true), needs);
    EXPECT_FLOAT_EQ(o.head(0, 0)->Low(0), 8.0f);  // a step of at least w queries replaces the window
    for (int i = 0; i < 4; ++i) o.Fold(Step(1, i == 3), needs);
    const HeadStats& h = *o.head(0, 0);
    if (exact) {
      EXPECT_FLOAT_EQ(h.Low(0), 1.0f);
      EXPECT_FLOAT_EQ(h.queries, 3.0f);
      EXPECT_NEAR(h.Sum(1), 3 * 0.9f, 1e-5);
    } else {
      EXPECT_NEAR(h.Low(0), 8 * 16 / 81.0 + 1, 1e-5);  // each decode step keeps 1 - 1/3 of the past
      EXPECT_GT(h.queries, 3.5);                          // part of the prompt is still in
    }
  }
}

// Steps longer than one query: the oldest leaves once the others cover the
// window without it.
TEST(ObservationsTest, TheRingDropsAStepOnlyWhenTheOthersCoverTheWindow) {
  const ObservationNeeds needs = Window(4, true);
  SequenceObservations o;
  o.Fold(Step(2, true), needs);
  o.Fold(Step(1, false), needs);
  o.Fold(Step(2, false), needs);  // 5 queries: without the first step's 2, only 3 (< 4)
  EXPECT_FLOAT_EQ(o.head(0, 0)->queries, 5.0f);
  EXPECT_FLOAT_EQ(o.head(0, 0)->Low(0), 2.0f);
  o.Fold(Step(1, false), needs);  // 6: the others hold 4 without the first
  EXPECT_FLOAT_EQ(o.head(0, 0)->queries, 4.0f);
  EXPECT_FLOAT_EQ(o.head(0, 0)->Low(0), 0.0f);
}

// The ring's rows are bytes the method keeps beside the pool (side bytes).
TEST(ObservationsTest, TheRingsRowsAreCounted) {
  SequenceObservations ring, blend;
  for (int i = 0; i < 5; ++i) {
    ring.Fold(Step(1, true), Window(8, true));
    blend.Fold(Step(1, true), Window(8, false));
  }
  // Five steps of 2 positions x (sum, low) floats beside the summed statistics.
  EXPECT_GE(ring.Bytes(), blend.Bytes() + 5 * 4 * sizeof(float));
}

}  // namespace
}  // namespace kvx::kv
