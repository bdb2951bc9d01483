// The engine resolves its spec once: EngineOptions carries the parsed
// KVSpec, and each of the spec's policies is built once per engine.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

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

}  // namespace
}  // namespace kvx::engine
