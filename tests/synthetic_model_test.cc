// kvx gen-model files against llama.cpp: tests/data/synthetic_llamacpp.json
// records llama.cpp's perplexity on random-weight models that gen-model
// rebuilds bit-for-bit from the same seed. kvx must reproduce it: the
// architectures (llama, untied, qwen2 with bias and NeoX RoPE), the synthetic
// BPE tokenizer and every weight type agree with an independent engine.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "engine/session.h"
#include "eval/perplexity.h"
#include "model/synthetic_model.h"
#include "ops/ops_test_util.h"
#include "ops/simd_target.h"
#include "ops/weight_pack.h"
#include "support/test_data.h"
#include "util/mmap_file.h"

namespace kvx {
namespace {

TEST(SyntheticModelTest, PerplexityMatchesLlamaCpp) {
  KVX_REQUIRE_SHARED();
  std::ifstream in(std::string(KVX_SOURCE_DIR) + "/tests/data/synthetic_llamacpp.json");
  ASSERT_TRUE(in.good());
  const auto doc = nlohmann::json::parse(in);
  auto text = ReadFileToString(testing::SharedPath("golden/wiki_head.txt"));
  ASSERT_TRUE(text.ok());
  text->resize(20000);
  if (text->back() == '\n') text->pop_back();
  for (const auto& run : doc["runs"]) {
    model::SyntheticModelOptions o;
    o.shape = run["shape"].get<std::string>();
    ASSERT_TRUE(gguf::ParseTensorType(run["type"].get<std::string>(), &o.type));
    o.init_std = run["init_std"].get<float>();
    o.seed = run["seed"].get<uint64_t>();
    const std::string path = testing::TempDir() + "/synthetic.gguf";
    ASSERT_TRUE(model::WriteSyntheticModel(o, path).ok());
    engine::EngineOptions ro;
    ro.model_path = path;
    ro.kv_spec = kv::ParseKVSpec("codec=f32").value();
    ro.n_ctx = run["ctx"].get<int>();
    ro.n_threads = 2;
    auto rt = engine::Engine::Load(ro);
    ASSERT_TRUE(rt.ok()) << rt.status().ToString();
    auto tokens = (*rt)->model().tokenizer().Encode(*text, true, false);
    ASSERT_TRUE(tokens.ok());
    auto session = (*rt)->NewSession();
    ASSERT_TRUE(session.ok());
    eval::PerplexityOptions po;
    po.n_ctx = ro.n_ctx;
    auto r = eval::Perplexity(session->get(), *tokens, po);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const double expected = run["llamacpp_ppl"].get<double>();
    // f32 weights: both engines compute in f32, so only summation order differs.
    const double tol = o.type == gguf::TensorType::kF32 ? 1e-5 : 2e-3;
    EXPECT_NEAR(r->ppl, expected, tol * expected) << o.shape << " " << run["type"];
  }
}

// On AVX3_DL and AVX2 machines the loader repacks Q8_0 matrices
// (ops/weight_pack.h), whose kernels sum each 32-block in int32
// (ops/matmul_internal.h): the logits must match a model loaded without
// repacking (loaded while dispatch is restricted to the scalar baseline) to
// float rounding, both computed on the same target, for each such target.
// (Bit-identity of the repacked kernels across targets, threads and batch
// sizes is ops/weight_pack_test.cc's.)
TEST(SyntheticModelTest, RepackedWeightsGiveTheSameLogitsToRounding) {
  const std::vector<std::string> targets = ops::testing::TestableTargets();  // best first, the baseline last
  model::SyntheticModelOptions o;
  o.shape = "tiny";
  o.type = gguf::TensorType::kQ8_0;
  const std::string path = testing::TempDir() + "/repack.gguf";
  ASSERT_TRUE(model::WriteSyntheticModel(o, path).ok());
  auto load = [&] {
    engine::EngineOptions ro;
    ro.model_path = path;
    ro.n_ctx = 64;
    ro.n_threads = 2;
    auto rt = engine::Engine::Load(ro);
    EXPECT_TRUE(rt.ok()) << rt.status().ToString();
    return std::move(rt).value();
  };
  ASSERT_TRUE(ops::ForceSimdTarget(targets.back()));
  ASSERT_FALSE(ops::RepackingPays());  // the scalar baseline keeps GGUF rows
  auto rows = load();
  ops::ForceSimdTarget("");
  if (!ops::RepackingPays()) GTEST_SKIP() << "needs a CPU with AVX2 or AVX-512 VNNI (repacking is only done there)";
  auto repacked = load();
  EXPECT_EQ(rows->model().RepackedMatrices(), 0);
  EXPECT_GT(repacked->model().RepackedMatrices(), 0);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 20; ++i) prompt.push_back((i * 37 + 5) % rows->model().config().n_vocab);
  // Float rounding through every layer: a small fraction of the logits' spread.
  auto expect_close = [](const std::vector<float>& x, const std::vector<float>& y, const std::string& what) {
    ASSERT_EQ(x.size(), y.size()) << what;
    float spread = 0, worst = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      spread = std::max(spread, std::fabs(x[i]));
      worst = std::max(worst, std::fabs(x[i] - y[i]));
    }
    EXPECT_GT(spread, 0.0f) << what;
    EXPECT_LE(worst, 1e-3f * spread) << what;
    EXPECT_NE(x, y) << what << ": identical, so the repacked kernels did not run";
  };
  // Both models computed on each SIMD target that has kernels for the packed layout.
  for (const std::string& target : targets) {
    if (target != "AVX3_DL" && target != "AVX2") continue;
    SCOPED_TRACE("target " + target);
    ASSERT_TRUE(ops::ForceSimdTarget(target));
    std::vector<float> want, got;
    auto a = rows->NewSession();
    auto b = repacked->NewSession();
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_TRUE((*a)->FeedWithLogits(prompt, 0, &want).ok());  // prefill path (a batch)
    ASSERT_TRUE((*b)->FeedWithLogits(prompt, 0, &got).ok());
    expect_close(want, got, "prefill");
    for (int step = 0; step < 3; ++step) {  // decode path (one token)
      ASSERT_TRUE((*a)->FeedWithLogits({prompt[step]}, 0, &want).ok());
      ASSERT_TRUE((*b)->FeedWithLogits({prompt[step]}, 0, &got).ok());
      expect_close(want, got, "decode step " + std::to_string(step));
    }
  }
  ops::ForceSimdTarget("");
}

}  // namespace
}  // namespace kvx
