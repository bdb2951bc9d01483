// Golden tests: kvx against llama.cpp's outputs for the real models in
// ../shared (see ../shared/golden/README.md): logits at every position with
// an f32 and an f16 KV cache, and greedy continuations. Perplexity is in
// golden_perplexity_test.cc, the recall model in golden_recall_test.cc.
//
// Tolerances. The golden logits were printed with 6 significant digits (so
// they carry up to 5e-6 * |x| of rounding) by a build whose matmuls
// accumulate in another order than ours. For each (model, KV cache) the
// bound on |kvx - llama.cpp| is the worst difference measured over the 8
// prompts (every logit of the last position, the top-5 logits of every
// position) plus a margin, written beside it in kLogitTolerance. The f16
// caches differ more than f32: llama.cpp rounds the query to f16 before q·k
// and the softmax weights to f16 before p·v, kvx keeps both in f32. The
// top-5 ids must be identical at every position, except for a swap of two
// logits closer than the tolerance. Greedy continuations must match token for
// token (the f32 goldens; llama.cpp's greedy runs used an f32 cache).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "engine/generate.h"
#include "engine/session.h"
#include "support/models.h"
#include "support/test_data.h"

namespace kvx {
namespace {

using testing::RealModel;
using testing::RealModels;
using testing::ReadJsonLines;
using testing::SharedPath;

struct LogitTolerance {
  const char* model;
  const char* kv;
  double abs;  // |kvx - llama.cpp| for any compared logit
};

// Measured worst difference (last-position logits and every position's top 5,
// 8 prompts) -> the bound, about 1.5x the worst. f32: the golden's 6
// significant digits alone round logits of magnitude 10-100 by up to 5e-5, so
// the f32 bounds are that rounding plus ~5e-5 (they were 1e-3 + 1e-4|x|,
// 20x looser). f16: the query and softmax rounding llama.cpp does and kvx
// does not moves logits of the head_dim-8 model by as much as switching the
// cache between f16 and f32 does (up to 0.028, ../shared/golden/README.md);
// wider heads average it out.
const LogitTolerance kLogitTolerance[] = {
    {"stories260K", "codec=f32", 1e-4},      // 5.7e-5
    {"stories260K", "codec=f16", 0.045},     // 0.031
    {"tinystories656K", "codec=f32", 1e-4},  // 5.4e-5
    {"tinystories656K", "codec=f16", 0.012},  // 0.0081
    {"probe", "codec=f32", 1e-4},            // 5.3e-5
    {"probe", "codec=f16", 0.0035},          // 0.0023
};

double ToleranceFor(const std::string& model, const std::string& kv) {
  for (const LogitTolerance& t : kLogitTolerance) {
    if (model == t.model && kv == t.kv) return t.abs;
  }
  ADD_FAILURE() << "no logit tolerance for " << model << " " << kv;
  return 0;
}

std::unique_ptr<engine::Engine> LoadRuntime(const RealModel& m, const std::string& kv) {
  engine::EngineOptions o;
  o.model_path = SharedPath(m.model_path);
  o.kv_spec = kv::ParseKVSpec(kv).value();
  o.n_threads = 2;
  auto rt = engine::Engine::Load(o);
  EXPECT_TRUE(rt.ok()) << rt.status().ToString();
  return rt.ok() ? std::move(rt).value() : nullptr;
}

struct LogitsCase {
  RealModel model;
  std::string kv;       // kvx --kv spec
  std::string golden;   // file in golden/<model>/
};

void PrintTo(const LogitsCase& c, std::ostream* os) { *os << c.model.name << " " << c.kv; }

std::vector<LogitsCase> LogitsCases() {
  std::vector<LogitsCase> out;
  for (const RealModel& m : RealModels()) {
    out.push_back({m, "codec=f32", "logits.jsonl"});
    out.push_back({m, "codec=f16", "logits_kv_f16.jsonl"});
  }
  return out;
}

class GoldenLogitsTest : public ::testing::TestWithParam<LogitsCase> {};

TEST_P(GoldenLogitsTest, LogitsMatchLlamaCpp) {
  KVX_REQUIRE_SHARED();
  const LogitsCase& c = GetParam();
  const double tol = ToleranceFor(c.model.name, c.kv);
  auto rt = LoadRuntime(c.model, c.kv);
  ASSERT_NE(rt, nullptr);
  const int n_vocab = rt->model().config().n_vocab;
  double worst_last = 0, worst_top5 = 0;
  for (const auto& line : ReadJsonLines(SharedPath("golden/" + c.model.name + "/" + c.golden))) {
    const auto ids = line["ids"].get<std::vector<int32_t>>();
    auto tokens = rt->model().tokenizer().Encode(line["prompt"].get<std::string>(), true, false);
    ASSERT_TRUE(tokens.ok());
    EXPECT_EQ(*tokens, ids) << "tokenization differs for prompt " << line["prompt"];
    auto session = rt->NewSession();
    ASSERT_TRUE(session.ok());
    std::vector<float> logits;
    ASSERT_TRUE((*session)->FeedWithLogits(ids, 0, &logits).ok());
    const auto last = line["last_logits"].get<std::vector<double>>();
    ASSERT_EQ(static_cast<int>(last.size()), n_vocab);
    const float* ours_last = &logits[(ids.size() - 1) * n_vocab];
    for (int i = 0; i < n_vocab; ++i) {
      const double err = std::abs(ours_last[i] - last[i]);
      worst_last = std::max(worst_last, err);
      ASSERT_LE(err, tol) << "prompt " << line["prompt"] << " logit " << i;
    }
    const auto& top5 = line["all_positions_top5"];
    for (size_t pos = 0; pos < ids.size(); ++pos) {
      const float* row = &logits[pos * n_vocab];
      for (size_t r = 0; r < top5[pos].size(); ++r) {
        const int golden_id = top5[pos][r][0].get<int>();
        const double golden_logit = top5[pos][r][1].get<double>();
        const double err = std::abs(row[golden_id] - golden_logit);
        worst_top5 = std::max(worst_top5, err);
        EXPECT_LE(err, tol) << "prompt " << line["prompt"] << " position " << pos << " id " << golden_id;
        // Our rank of golden_id: how many logits beat it (ties to the lower id).
        int rank = 0;
        for (int i = 0; i < n_vocab; ++i) {
          if (row[i] > row[golden_id] || (row[i] == row[golden_id] && i < golden_id)) ++rank;
        }
        if (rank != static_cast<int>(r)) {
          // Accept only a near-tie swap: the id we rank r-th is within the
          // tolerance of llama.cpp's r-th logit.
          std::vector<int> order(n_vocab);
          for (int i = 0; i < n_vocab; ++i) order[i] = i;
          std::partial_sort(order.begin(), order.begin() + r + 1, order.end(),
                            [&](int a, int b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
          EXPECT_LE(std::abs(row[order[r]] - golden_logit), 2 * tol)
              << "prompt " << line["prompt"] << " position " << pos << " rank " << r << ": ours id " << order[r]
              << ", llama.cpp id " << golden_id;
        }
      }
    }
  }
  std::printf("[ %s %s ] worst logit difference vs llama.cpp: last position %.3g, top-5 of every position %.3g "
              "(tolerance %.3g)\n", c.model.name.c_str(), c.kv.c_str(), worst_last, worst_top5, tol);
}

INSTANTIATE_TEST_SUITE_P(RealModels, GoldenLogitsTest, ::testing::ValuesIn(LogitsCases()), [](const auto& info) {
  return info.param.model.name + (info.param.kv == "codec=f32" ? "_f32" : "_f16");
});

class GoldenGreedyTest : public ::testing::TestWithParam<RealModel> {};

TEST_P(GoldenGreedyTest, GreedyContinuationsMatchLlamaCpp) {
  KVX_REQUIRE_SHARED();
  const RealModel& m = GetParam();
  auto rt = LoadRuntime(m, "codec=f32");
  ASSERT_NE(rt, nullptr);
  for (const auto& line : ReadJsonLines(SharedPath("golden/" + m.name + "/greedy.jsonl"))) {
    const auto prompt_ids = line["prompt_ids"].get<std::vector<int32_t>>();
    const auto golden = line["ids"].get<std::vector<int32_t>>();
    auto session = rt->NewSession();
    ASSERT_TRUE(session.ok());
    engine::GenerateOptions go;
    go.n_predict = line["n_predict"].get<int>();
    go.sampler.temperature = 0;
    std::vector<int32_t> out;
    engine::GenerateStats stats;
    ASSERT_TRUE(engine::Generate(session->get(), prompt_ids, go, nullptr, &out, &stats).ok());
    EXPECT_EQ(out, golden) << "prompt " << line["prompt"];
    std::string text;
    for (int32_t t : out) text += rt->model().tokenizer().TokenToPiece(t, false);
    EXPECT_EQ(text, line["text"].get<std::string>());
  }
}

INSTANTIATE_TEST_SUITE_P(RealModels, GoldenGreedyTest, ::testing::ValuesIn(RealModels()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace kvx
