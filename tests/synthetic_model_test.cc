// kvx gen-model files against llama.cpp: tests/data/synthetic_llamacpp.json
// records llama.cpp's perplexity on random-weight models that gen-model
// rebuilds bit-for-bit from the same seed. kvx must reproduce it: the
// architectures (llama, untied, qwen2 with bias and NeoX RoPE), the synthetic
// BPE tokenizer and every weight type agree with an independent engine.
#include <gtest/gtest.h>

#include <fstream>

#include "engine/runtime.h"
#include "eval/perplexity.h"
#include "model/synthetic_model.h"
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
    engine::RuntimeOptions ro;
    ro.model_path = path;
    ro.kv_spec = "codec=f32";
    ro.n_ctx = run["ctx"].get<int>();
    ro.n_threads = 2;
    auto rt = engine::Runtime::Create(ro);
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

}  // namespace
}  // namespace kvx
