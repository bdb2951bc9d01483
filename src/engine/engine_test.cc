// The engine resolves its spec once: EngineOptions carries the parsed
// KVSpec, and each of the spec's policies is built once per engine.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <span>
#include <string>

#include "engine/session.h"
#include "kv/policy/counted_policy_test_util.h"
#include "model/synthetic_model.h"

namespace kvx::engine {
namespace {

using kv::testing::CountedPolicy;

TEST(EngineTest, EachPolicyIsBuiltOncePerEngine) {
  CountedPolicy::Register();
  model::SyntheticModelOptions mo;
  mo.shape = "tiny";
  const std::string path = ::testing::TempDir() + "/engine_test_tiny.gguf";
  ASSERT_TRUE(model::WriteSyntheticModel(mo, path).ok());
  auto spec = kv::ParseKVSpec("codec=f16;policy=test_counted");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EngineOptions o;
  o.model_path = path;
  o.n_threads = 1;
  o.n_ctx = 64;
  o.kv_spec = *spec;
  CountedPolicy::built = 0;
  auto first = Engine::Load(o);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(CountedPolicy::built, 1);
  ASSERT_EQ((*first)->kv_manager().policies().size(), 1u);
  EXPECT_EQ((*first)->kv_spec(), *spec);
  // A second engine on the same weights builds its own, once.
  auto second = Engine::Create(&(*first)->model(), &(*first)->threads(), o);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(CountedPolicy::built, 2);
}

// A RowRecompute plan that runs every row through every layer is the plain
// forward pass, bit for bit; a plan is a step of its own, and one that
// brings back a row a layer dropped is refused.
class EveryRow final : public model::RowRecompute {
 public:
  EveryRow(int n, int kv_dim, bool grow) : kv_dim_(kv_dim), grow_(grow) {
    for (int i = 0; i < n; ++i) all_.push_back(i);
    last_ = {n - 1};
  }
  std::span<const int32_t> Rows(int layer) override {
    if (grow_) return layer == 0 ? std::span<const int32_t>(last_) : std::span<const int32_t>(all_);
    return all_;
  }
  void Merge(int, std::span<const int32_t> rows, const float* k, const float* v, float* k_all, float* v_all) override {
    for (size_t i = 0; i < rows.size(); ++i) {
      std::copy(k + i * kv_dim_, k + (i + 1) * kv_dim_, k_all + rows[i] * kv_dim_);
      std::copy(v + i * kv_dim_, v + (i + 1) * kv_dim_, v_all + rows[i] * kv_dim_);
    }
  }

 private:
  int kv_dim_;
  bool grow_;
  std::vector<int32_t> all_, last_;
};

TEST(EngineTest, RecomputingEveryRowIsThePlainForwardPass) {
  model::SyntheticModelOptions mo;
  mo.shape = "tiny";
  const std::string path = ::testing::TempDir() + "/engine_test_tiny_rows.gguf";
  ASSERT_TRUE(model::WriteSyntheticModel(mo, path).ok());
  EngineOptions o;
  o.model_path = path;
  o.n_threads = 1;
  o.n_ctx = 64;
  o.n_seqs = 2;
  auto engine = Engine::Load(o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Engine& e = **engine;
  const model::ModelConfig& c = e.model().config();
  const std::vector<int32_t> tokens = {1, 5, 9, 3, 7, 2, 8};
  auto plain = e.NewSession();
  auto planned = e.NewSession();
  ASSERT_TRUE(plain.ok() && planned.ok());
  std::vector<float> want, got;
  StepInput a{plain->get(), tokens, -1, &want};
  ASSERT_TRUE(e.Step({&a, 1}).ok());
  EveryRow every(static_cast<int>(tokens.size()), c.n_kv_heads * c.head_dim, false);
  StepInput b{planned->get(), tokens, -1, &got, &every};
  ASSERT_TRUE(e.Step({&b, 1}).ok());
  EXPECT_EQ(want, got);

  StepInput both[] = {a, b};
  both[0].session = plain->get();
  EXPECT_EQ(e.Step(both).code(), StatusCode::kInvalidArgument);
  auto fresh = e.NewSession();
  ASSERT_TRUE(fresh.ok());
  EveryRow grows(static_cast<int>(tokens.size()), c.n_kv_heads * c.head_dim, true);
  StepInput g{fresh->get(), tokens, -1, &got, &grows};
  EXPECT_FALSE(e.Step({&g, 1}).ok());
}

// A step's logits are copied to their inputs and checked row by row over the
// pool: a NaN or infinity in any row is found, the first (in row order) is
// reported, and every row is copied whole.
TEST(EngineTest, CopyRowsCheckingFiniteChecksEveryRow) {
  constexpr size_t kRows = 9, kN = 1000;
  std::vector<float> src(kRows * kN);
  for (size_t i = 0; i < src.size(); ++i) src[i] = 0.001f * static_cast<float>(i % 977);
  std::vector<std::vector<float>> out(kRows, std::vector<float>(kN, -1.0f));
  std::vector<float*> dst;
  for (auto& row : out) dst.push_back(row.data());
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    EXPECT_EQ(CopyRowsCheckingFinite(src.data(), dst, kN, &pool), -1);
    for (size_t r = 0; r < kRows; ++r) EXPECT_TRUE(std::equal(out[r].begin(), out[r].end(), src.begin() + r * kN));
    std::vector<float> bad = src;
    bad[7 * kN + 3] = std::numeric_limits<float>::infinity();  // the last rows only: one pool thread's share
    bad[8 * kN + 1] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_EQ(CopyRowsCheckingFinite(bad.data(), dst, kN, &pool), static_cast<int64_t>(7 * kN + 3)) << threads;
    EXPECT_EQ(CopyRowsCheckingFinite(bad.data() + 8 * kN, {&dst[0], 1}, kN, nullptr), 1);
  }
}

}  // namespace
}  // namespace kvx::engine
