// kvx eval --protocol on the recall model, small: the questions of a
// context go against one compressed cache (the scheduler's counts), and
// every question index is scored. Runs the scheduler's thread, but is not
// labelled `threads`: real-model forward passes under ThreadSanitizer take
// many minutes, and the scheduler's threading is the engine tests' (TSan).
#include "eval/scbench.h"

#include <gtest/gtest.h>

#include "support/test_data.h"

namespace kvx::eval {
namespace {

SharedContextOptions Small(const std::string& protocol) {
  SharedContextOptions o;
  o.protocol = protocol;
  o.specs = {"codec=f16", "codec=f16;policy=snapkv,ratio=0.5,pool=max"};
  o.lengths = {384};
  o.contexts = 2;
  o.questions = 4;
  o.n_gen = 4;
  o.data_dir = testing::SharedPath("data");
  return o;
}

TEST(SharedContextTest, QuestionsShareOneCompressedCache) {
  KVX_REQUIRE_SHARED();
  const std::string path = testing::SharedPath("models/recall/recall-llama-8L-d512-f16.gguf");
  auto model = model::Model::Load(path);
  ASSERT_TRUE(model.ok()) << path << ": " << model.status().ToString();
  ThreadPool threads(2);
  for (const std::string protocol : {"multi-query", "multi-turn"}) {
    SCOPED_TRACE(protocol);
    auto r = RunSharedContextEval(**model, &threads, Small(protocol));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->rows.size(), 2u * 4u);  // spec x question index
    for (const SharedContextRow& row : r->rows) {
      EXPECT_EQ(row.n, 2) << row.spec << " question " << row.question;
      EXPECT_LE(row.lo, static_cast<double>(row.hits) / row.n);
      EXPECT_GE(row.hi, static_cast<double>(row.hits) / row.n);
    }
    ASSERT_EQ(r->work.size(), 2u);
    const auto& full = r->work[0];
    const auto& snap = r->work[1];
    EXPECT_EQ(full.compressions, 0u);
    EXPECT_GT(full.prefix_hit_tokens, 0u);  // the full cache shares the context through the radix cache
    // One compression per context; every question (multi-query) or the
    // first turn (multi-turn: the later ones continue the conversation)
    // forks the compressed context.
    EXPECT_EQ(snap.compressions, 2u);
    EXPECT_EQ(snap.compressed_hits, protocol == "multi-query" ? 8u : 2u);
    EXPECT_NE(SharedContextTable(*r).find(protocol == "multi-query" ? "question 4" : "turn 4"), std::string::npos);
  }
  // More conversations than the pool holds sequences: each context's
  // session is dropped when its turns are done.
  SharedContextOptions many = Small("multi-turn");
  many.specs = {"codec=f16"};
  many.questions = 2;
  many.contexts = 5;
  ProgressBar::Options quiet;
  quiet.enabled = false;
  ProgressBar progress(quiet);  // counts without drawing
  many.progress = &progress;
  auto r = RunSharedContextEval(**model, &threads, many);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->rows[0].n, 5);
  EXPECT_EQ(progress.state().total_items, 5);  // every context of every spec, each advanced once
  EXPECT_EQ(progress.state().done_items, 5);
  EXPECT_DOUBLE_EQ(progress.state().done_weight, progress.state().total_weight);
  SharedContextOptions bad = Small("multi-round");
  EXPECT_FALSE(RunSharedContextEval(**model, &threads, bad).ok());
}

}  // namespace
}  // namespace kvx::eval
