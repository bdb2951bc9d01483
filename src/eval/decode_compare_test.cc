// kvx bench with several --kv (eval/decode_compare.h): every spec is decoded
// in interleaved rounds in one run, the first spec's ratio is 1, and a
// spec's decode runs over what its policy kept.
#include "eval/decode_compare.h"

#include <gtest/gtest.h>

#include "model/synthetic_model.h"

namespace kvx::eval {
namespace {

// The tiny generated model, written once.
std::unique_ptr<model::Model> TinyModel() {
  const std::string path = testing::TempDir() + "/decode_compare_tiny.gguf";
  model::SyntheticModelOptions mo;
  mo.shape = "tiny";
  EXPECT_TRUE(model::WriteSyntheticModel(mo, path).ok());
  return model::Model::Load(path).value();
}

TEST(DecodeCompareTest, RoundsInterleaveTheSpecsInOneRun) {
  auto model = TinyModel();
  ThreadPool threads(2);
  const std::vector<kv::KVSpec> specs = {kv::ParseKVSpec("codec=f16").value(),
                                         kv::ParseKVSpec("codec=int8").value(),
                                         kv::ParseKVSpec("codec=f16;policy=snapkv,ratio=0.25").value()};
  DecodeCompareOptions o;
  o.depths = {128, 256};
  o.gen_tokens = 4;
  o.rounds = 3;
  Result<DecodeCompareResult> r = RunDecodeCompare(*model, &threads, specs, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->order, (std::vector<int>{0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2}))
      << "A, B, C, A, B, C ... at each depth";
  ASSERT_EQ(r->rows.size(), 6u);
  for (size_t k = 0; k < r->rows.size(); ++k) {
    const DecodeCompareRow& row = r->rows[k];
    EXPECT_EQ(row.spec, specs[k % 3].ToString());
    EXPECT_EQ(row.depth, o.depths[k / 3]);
    ASSERT_EQ(row.round_tok_s.size(), 3u);
    for (double v : row.round_tok_s) EXPECT_GT(v, 0);
    if (k % 3 == 0) {
      EXPECT_DOUBLE_EQ(row.vs_first, 1.0) << "the first spec is the reference";
    }
  }
  // SnapKV at ratio 0.25 compressed at the depth (partly live pages stay).
  EXPECT_LT(r->rows[5].kv_bytes, r->rows[3].kv_bytes) << "the decode ran over what the policy kept";
  EXPECT_EQ(r->ToJson()["decode"].size(), 6u);
}

TEST(DecodeCompareTest, ASpecThatDoesNotResolveIsAnError) {
  auto model = TinyModel();
  ThreadPool threads(1);
  // A head table that does not exist: the spec parses but does not resolve.
  const std::vector<kv::KVSpec> specs = {
      kv::ParseKVSpec("codec=f16").value(),
      kv::ParseKVSpec("codec=f16;policy=duo,heads=" + testing::TempDir() + "/no_such_table.json").value()};
  DecodeCompareOptions o;
  o.depths = {64};
  const Result<DecodeCompareResult> r = RunDecodeCompare(*model, &threads, specs, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no_such_table"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace kvx::eval
