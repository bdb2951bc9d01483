// --kv auto's look-up (eval/tune_cache.h): the cached result of the right
// model and budget is found, another model's is never picked, and nothing
// cached is a clear error naming the kvx tune command to run.
#include "eval/tune_cache.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "gguf/gguf_file.h"
#include "model/fingerprint.h"
#include "model/synthetic_model.h"

namespace kvx::eval {
namespace {

namespace fs = std::filesystem;

class TuneCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir() + "/tune_cache_" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    for (uint64_t seed : {1, 2}) {
      model::SyntheticModelOptions mo;
      mo.seed = seed;  // another model: other weights, another fingerprint
      models_.push_back(testing::TempDir() + "/tune_cache_model" + std::to_string(seed) + ".gguf");
      ASSERT_TRUE(model::WriteSyntheticModel(mo, models_.back()).ok());
    }
  }

  uint64_t Fingerprint(int m) const {
    return model::ModelFingerprint(*gguf::GgufFile::Open(models_[static_cast<size_t>(m)]).value());
  }

  // A cached result of model m for budget mem, choosing `spec`.
  void Cache(int m, uint64_t mem, const std::string& spec, int ctx = 256) {
    ASSERT_TRUE(StoreTuneResult(dir_, TuneCacheName(Fingerprint(m), mem, ctx, 1), "{\"spec\": \"" + spec + "\"}").ok());
  }

  std::string dir_;
  std::vector<std::string> models_;
};

TEST_F(TuneCacheTest, PicksTheRightModelAndBudget) {
  ASSERT_NE(Fingerprint(0), Fingerprint(1));
  Cache(1, 1 << 20, "codec=int2");  // the other model's, same budget
  Cache(0, 1 << 20, "codec=int8");
  Result<TunedSpec> t = FindTunedSpec(dir_, models_[0], "auto");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->spec, "codec=int8");
  EXPECT_EQ(t->mem_bytes, 1u << 20);
  EXPECT_EQ(t->ctx, 256);
  EXPECT_EQ(fs::path(t->path).parent_path(), fs::path(dir_));
  // A second budget: auto alone is ambiguous, auto:SIZE picks.
  Cache(0, 4 << 20, "codec=kivi4");
  Result<TunedSpec> ambiguous = FindTunedSpec(dir_, models_[0], "auto");
  ASSERT_FALSE(ambiguous.ok());
  EXPECT_NE(ambiguous.status().message().find("auto:SIZE"), std::string::npos) << ambiguous.status().message();
  EXPECT_EQ(FindTunedSpec(dir_, models_[0], "auto:4M").value().spec, "codec=kivi4");
  EXPECT_EQ(FindTunedSpec(dir_, models_[0], "auto:1048576").value().spec, "codec=int8");
  EXPECT_EQ(FindTunedSpec(dir_, models_[1], "auto").value().spec, "codec=int2");
}

TEST_F(TuneCacheTest, NothingCachedNamesTheTuneCommand) {
  Cache(1, 1 << 20, "codec=int2");  // only the other model's
  for (const char* arg : {"auto", "auto:1M"}) {
    Result<TunedSpec> t = FindTunedSpec(dir_, models_[0], arg);
    ASSERT_FALSE(t.ok()) << arg;
    const std::string m = t.status().message();
    EXPECT_NE(m.find("no tuned spec for this model"), std::string::npos) << m;
    EXPECT_NE(m.find("kvx tune -m " + models_[0]), std::string::npos) << m;
    EXPECT_NE(m.find(dir_), std::string::npos) << m;
  }
  EXPECT_FALSE(FindTunedSpec(dir_ + "/missing", models_[0], "auto").ok());
  EXPECT_FALSE(FindTunedSpec(dir_, models_[0], "auto:lots").ok());
  EXPECT_TRUE(IsAutoKV("auto"));
  EXPECT_TRUE(IsAutoKV("auto:8M"));
  EXPECT_FALSE(IsAutoKV("codec=int8"));
}

}  // namespace
}  // namespace kvx::eval
