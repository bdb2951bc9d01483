// Eviction on the real recall model (../shared/models/recall): a compressed
// cache still retrieves where the full one does, and the pool really holds
// about half the bytes. Kept small (one length, two depths, one prompt
// each: ~20 s on 2 threads); the full sweep is scripts/eviction_report.py.
#include <gtest/gtest.h>

#include "eval/eval.h"
#include "model/model.h"
#include "support/test_data.h"

namespace kvx {
namespace {

TEST(EvictionRecallTest, SnapKVAtHalfTheCacheKeepsThePasskeyAndHalvesThePool) {
  KVX_REQUIRE_SHARED();
  auto model = model::Model::Load(testing::SharedPath("models/recall/recall-llama-8L-d512-f16.gguf"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  ThreadPool threads(2);
  eval::EvalOptions o;
  o.tasks = {eval::Task::kPasskey};
  o.baseline = "codec=f16";
  // ratio 0 must change nothing; ratio 0.5 with SnapKV (max-pooled votes,
  // question included: the observation window is the question).
  o.specs = {"codec=f16,policy=snapkv,ratio=0", "codec=f16,policy=snapkv,ratio=0.5,kernel=15,pool=max"};
  o.n_ctx = 2048;
  o.lengths = {2048};
  o.depths = {0.25, 0.75};
  o.passkey_trials = 1;
  o.compress = "included";
  auto report = eval::RunEval(**model, &threads, o, {});
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->specs.size(), 3u);
  const eval::RetrievalResult& base = *report->specs[0].passkey;
  const eval::RetrievalResult& same = *report->specs[1].passkey;
  const eval::RetrievalResult& half = *report->specs[2].passkey;
  ASSERT_TRUE(half.ok) << half.error;
  EXPECT_EQ(base.hits, 2) << "the full cache solves both cells (the model's README)";
  EXPECT_EQ(same.hits, base.hits);
  // Every byte counts: beside its pages, SnapKV keeps the attention its
  // window gave each position, an f32 per position, query head and layer
  // (8 x 8 here: 256 bytes per token, 1/16 of the f16 cache), which the
  // kept bytes include (KVManager::SideBytes). Ratio 0 changes nothing else.
  const auto& full = report->specs[0].kv;
  const uint64_t stats_bytes = 256 * static_cast<uint64_t>(full.peak_tokens);
  EXPECT_EQ(report->specs[1].kv.peak_tokens, full.peak_tokens);
  // (plus each head's bookkeeping and the positions the prompt's last tokens reach)
  EXPECT_GE(report->specs[1].kv.peak_bytes, full.peak_bytes + stats_bytes);
  EXPECT_LE(report->specs[1].kv.peak_bytes, full.peak_bytes + stats_bytes + 8192);
  const eval::SolvedCells solved = eval::BaselineSolved(base, half);
  EXPECT_EQ(solved.hits, solved.n) << "SnapKV at ratio 0.5 lost a passkey the full cache found";
  // Bytes the pool holds at the end of a sequence (answer tokens included).
  const double frac = static_cast<double>(report->specs[2].kv.peak_bytes - stats_bytes) / full.peak_bytes;
  EXPECT_GT(frac, 0.45);
  EXPECT_LT(frac, 0.58);
}

}  // namespace
}  // namespace kvx
