// kvx eval --tasks rag on the recall model, small: the rows it reports mean
// what they say (full is its own reference, none recomputes nothing, epic
// its k tokens per document).
#include "eval/rag.h"

#include <gtest/gtest.h>

#include "support/test_data.h"

namespace kvx::eval {
namespace {

TEST(RagEvalTest, RowsMeanWhatTheySay) {
  KVX_REQUIRE_SHARED();
  auto model = model::Model::Load(testing::SharedPath("models/recall/recall-llama-8L-d512-f16.gguf"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  ThreadPool threads(2);
  RagOptions o;
  o.sizes = {256};
  o.chunk_tokens = 128;
  o.questions = 2;
  o.n_gen = 4;
  o.repairs = {"none", "epic,k=2", "full"};
  o.data_dir = testing::SharedPath("data");
  auto rows = RunRagEval(**model, &threads, o);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_EQ(rows->size(), 3u);
  const RagRow& none = (*rows)[0];
  const RagRow& epic = (*rows)[1];
  const RagRow& full = (*rows)[2];
  EXPECT_EQ(none.repair, "none");
  EXPECT_EQ(none.n, 2);
  EXPECT_EQ(none.recomputed_fraction, 0.0);
  // Two documents, k = 2: four tokens of each question's (at most `size`) chunk tokens.
  EXPECT_GE(epic.recomputed_fraction, 4.0 / none.size - 1e-12);
  EXPECT_LT(epic.recomputed_fraction, 4.0 / (0.7 * none.size));
  EXPECT_EQ(full.recomputed_fraction, 1.0);
  EXPECT_EQ(full.kld_mean, 0.0);
  EXPECT_GT(none.kld_mean, 0.0);
  EXPECT_GE(none.size, 256);
  EXPECT_LE(full.acc_lo, static_cast<double>(full.hits) / full.n);
  EXPECT_NE(RagTable(*rows).find("| none |"), std::string::npos);
  // Paired with full on the same questions: full against itself has no
  // discordant question; every row's answers are per question.
  EXPECT_EQ(full.verdict, "indistinguishable");
  EXPECT_EQ(full.only_full + full.only_this, 0);
  for (const RagRow& r : *rows) {
    ASSERT_EQ(r.answered.size(), 2u);
    int hits = 0, only_full = 0;
    for (size_t q = 0; q < 2; ++q) {
      hits += r.answered[q];
      only_full += full.answered[q] && !r.answered[q];
    }
    EXPECT_EQ(hits, r.hits);
    EXPECT_EQ(only_full, r.only_full);
  }
  EXPECT_NE(RagJson(*rows).find("\"verdict_vs_full\""), std::string::npos);
  o.repairs = {"blend,r=2"};
  EXPECT_FALSE(RunRagEval(**model, &threads, o).ok());
}

}  // namespace
}  // namespace kvx::eval
