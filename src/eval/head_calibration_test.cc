// Head calibration on the real recall model (../shared/models/recall): duo's
// leak-free copy data and razor's echo/induction each find the model's
// retrieval head, by their own criteria; bad data is an error. One or two
// prompts of 1024 tokens each: a few seconds on 2 threads.
#include "eval/head_calibration.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "model/model.h"
#include "support/test_data.h"
#include "util/mmap_file.h"
#include "util/thread_pool.h"

namespace kvx::eval {
namespace {

class HeadCalibrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (testing::SharedDir().empty()) GTEST_SKIP() << "shared test data not found (set KVX_SHARED or place ../shared)";
    auto m = model::Model::Load(testing::SharedPath("models/recall/recall-llama-8L-d512-f16.gguf"));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    model_ = std::move(*m);
    engine::EngineOptions eo;
    eo.n_ctx = 1024;
    auto e = engine::Engine::Create(model_.get(), &threads_, eo);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(*e);
  }
  static int TopHead(const kv::HeadTable& t) {
    return static_cast<int>(std::max_element(t.scores.begin(), t.scores.end()) - t.scores.begin());
  }
  ThreadPool threads_{2};
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<engine::Engine> engine_;
};

TEST_F(HeadCalibrationTest, CopyDataFindsTheHeadThatReachesPastTheWindow) {
  HeadCalibrationOptions o;
  auto text = ReadFileToString(testing::SharedPath("data/prose/jargon-4.4.7.txt"));
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  o.text = text->substr(0, 200000);  // enough for one 1024-token prompt, quick to tokenize
  o.lengths = {1024};
  o.depths = {0.5};
  auto table = CalibrateHeads(*engine_, o);
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  EXPECT_EQ(table->calib, "copy");
  ASSERT_EQ(table->scores.size(), 16u);
  // Every score is a share of attention mass.
  for (double s : table->scores) EXPECT_TRUE(s >= 0 && s <= 1) << s;
  // The recall model copies through (layer 7, kv head 1): its mass past the
  // window stands far above every other head's (docs/kv-head-typing.md).
  const int top = TopHead(*table);
  EXPECT_EQ(top, 7 * 2 + 1);
  std::vector<double> rest = table->scores;
  rest.erase(rest.begin() + top);
  EXPECT_GT(table->scores[top], 2 * *std::max_element(rest.begin(), rest.end()));
}

TEST_F(HeadCalibrationTest, RazorScoresEchoAndInductionOnRandomTokens) {
  HeadCalibrationOptions o;
  o.method = "razor";
  auto table = CalibrateHeads(*engine_, o);
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  EXPECT_EQ(table->calib, "repeated random tokens");
  EXPECT_EQ(TopHead(*table), 7 * 2 + 1);
}

TEST_F(HeadCalibrationTest, BadDataIsAnErrorNamingTheFix) {
  HeadCalibrationOptions o;
  o.calib = "needles";
  auto r = CalibrateHeads(*engine_, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("use copy or passkey"), std::string::npos);
  o.calib = "copy";
  r = CalibrateHeads(*engine_, o);  // no text
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--text"), std::string::npos);
  o.text = "too short.";
  o.lengths = {1024};
  r = CalibrateHeads(*engine_, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("longer --text"), std::string::npos) << r.status().message();
  o.text = std::string(100000, 'a');
  o.lengths = {256};  // no room for a span a window away from its copy
  r = CalibrateHeads(*engine_, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("raise --lengths"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace kvx::eval
