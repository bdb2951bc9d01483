// Golden tests of the recall model (../shared/models/recall, f16 weights) in
// both KV cache types:
//   f32 KV: the trainer's own outputs (../shared/golden/recall/
//     reference_torch.json: PyTorch, these f16 weights, f32 arithmetic) for
//     three prompts of 16, 1235 and 1507 tokens: every logit of the last
//     position, its top-5 ids, and a 24-token greedy continuation;
//   f16 KV: llama.cpp's llama-server (recall/llamacpp.json, f16 cache, the
//     default): the greedy continuation of two prompts and the top-5
//     log-probabilities at each of its 24 steps.
// Perplexity of this model is checked in golden_perplexity_test.cc.
//
// Tolerances: measured worst difference plus a margin, stated beside each.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "engine/session.h"
#include "support/golden.h"
#include "support/test_data.h"

namespace kvx {
namespace {

using testing::ReadJson;
using testing::SharedPath;

constexpr const char* kRecall = "models/recall/recall-llama-8L-d512-f16.gguf";

// |kvx - PyTorch| for any last-position logit, f32 KV cache: measured worst
// 7.4e-5, of which the golden's 6 significant digits (logits of magnitude
// 10-15 keep 4 decimals) account for up to 5e-5. Bound 1.5e-4.
constexpr double kTorchLogitTol = 1.5e-4;
// |kvx - llama.cpp| for the top-5 log-probabilities of each greedy step, f16
// KV cache: measured worst 0.0069 (llama.cpp rounds the query and the
// softmax weights to f16, kvx keeps them in f32). Bound 0.01.
constexpr double kServerLogprobTol = 0.01;

std::unique_ptr<engine::Engine> LoadRecall(const std::string& kv) {
  engine::EngineOptions o;
  o.model_path = SharedPath(kRecall);
  o.kv_spec = kv::ParseKVSpec(kv).value();
  o.n_ctx = 4096;
  o.n_threads = 2;
  auto rt = engine::Engine::Load(o);
  EXPECT_TRUE(rt.ok()) << rt.status().ToString();
  return rt.ok() ? std::move(rt).value() : nullptr;
}

std::vector<double> LogSoftmax(const float* logits, int n) {
  const double mx = *std::max_element(logits, logits + n);
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp(logits[i] - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(n);
  for (int i = 0; i < n; ++i) out[i] = logits[i] - lse;
  return out;
}

int Argmax(const float* logits, int n) { return static_cast<int>(std::max_element(logits, logits + n) - logits); }

TEST(GoldenRecallTest, F32CacheMatchesTheTrainer) {
  KVX_REQUIRE_SHARED();
  auto rt = LoadRecall("codec=f32");
  ASSERT_NE(rt, nullptr);
  const int n_vocab = rt->model().config().n_vocab;
  const auto ref = ReadJson(SharedPath("golden/recall/reference_torch.json"));
  double worst = 0;
  for (const auto& p : ref["prompts"]) {
    const auto ids = p["ids"].get<std::vector<int32_t>>();
    auto tokens = rt->model().tokenizer().Encode(p["prompt"].get<std::string>(), true, false);
    ASSERT_TRUE(tokens.ok());
    EXPECT_EQ(*tokens, ids) << "tokenization differs";
    auto session = rt->NewSession();
    ASSERT_TRUE(session.ok());
    auto logits = (*session)->Feed(ids);
    ASSERT_TRUE(logits.ok()) << logits.status().ToString();
    const auto golden = p["logits"].get<std::vector<double>>();
    ASSERT_EQ(static_cast<int>(golden.size()), n_vocab);
    double prompt_worst = 0;
    for (int i = 0; i < n_vocab; ++i) prompt_worst = std::max(prompt_worst, std::abs((*logits)[i] - golden[i]));
    worst = std::max(worst, prompt_worst);
    EXPECT_LE(prompt_worst, kTorchLogitTol) << ids.size() << "-token prompt";
    std::vector<int> order(n_vocab);
    for (int i = 0; i < n_vocab; ++i) order[i] = i;
    const float* l = *logits;
    std::partial_sort(order.begin(), order.begin() + 5, order.end(), [&](int a, int b) { return l[a] > l[b]; });
    EXPECT_EQ(std::vector<int>(order.begin(), order.begin() + 5), p["top5"].get<std::vector<int>>());
    // Greedy continuation (from a fresh session, as the trainer generated it).
    auto gen_session = rt->NewSession();
    ASSERT_TRUE(gen_session.ok());
    engine::GenerateOptions go;
    const auto greedy = p["greedy_ids"].get<std::vector<int32_t>>();
    go.n_predict = static_cast<int>(greedy.size());
    go.sampler.temperature = 0;
    std::vector<int32_t> out;
    engine::GenerateStats stats;
    ASSERT_TRUE(engine::Generate(gen_session->get(), ids, go, nullptr, &out, &stats).ok());
    EXPECT_EQ(out, greedy) << ids.size() << "-token prompt";
  }
  std::printf("[ recall f32 ] worst last-position logit difference vs PyTorch: %.3g (tolerance %.3g)\n", worst,
              kTorchLogitTol);
}

TEST(GoldenRecallTest, F16CacheMatchesLlamaServer) {
  KVX_REQUIRE_SHARED();
  auto rt = LoadRecall("codec=f16");
  ASSERT_NE(rt, nullptr);
  const int n_vocab = rt->model().config().n_vocab;
  const auto ref = ReadJson(SharedPath("golden/recall/reference_torch.json"));
  const auto ll = ReadJson(SharedPath("golden/recall/llamacpp.json"))["results"]["greedy_generation"];
  double worst = 0;
  int compared = 0;
  for (const auto& [name, run] : ll.items()) {
    // The server's prompt: the reference prompt with the same token count,
    // checked against the first 40 and last 20 ids llama.cpp recorded.
    const auto first = run["prompt_token_ids_first40"].get<std::vector<int32_t>>();
    const auto last = run["prompt_token_ids_last20"].get<std::vector<int32_t>>();
    std::vector<int32_t> ids;
    for (const auto& p : ref["prompts"]) {
      if (p["ids"].size() == run["prompt_n_tokens_with_bos"].get<size_t>()) ids = p["ids"].get<std::vector<int32_t>>();
    }
    ASSERT_FALSE(ids.empty()) << name << ": no reference prompt of that length";
    ASSERT_TRUE(std::equal(first.begin(), first.end(), ids.begin())) << name;
    ASSERT_TRUE(std::equal(last.rbegin(), last.rend(), ids.rbegin())) << name;
    const auto& server = run["llama_server"];
    const auto golden_ids = server["token_ids"].get<std::vector<int32_t>>();
    auto session = rt->NewSession();
    ASSERT_TRUE(session.ok());
    auto logits = (*session)->Feed(ids);
    ASSERT_TRUE(logits.ok()) << logits.status().ToString();
    for (size_t step = 0; step < golden_ids.size(); ++step) {
      const std::vector<double> lp = LogSoftmax(*logits, n_vocab);
      for (const auto& top : server["per_step_top5"][step]["top"]) {
        const double err = std::abs(lp[top[0].get<int>()] - top[2].get<double>());
        worst = std::max(worst, err);
        EXPECT_LE(err, kServerLogprobTol) << name << " step " << step << " id " << top[0];
        ++compared;
      }
      const int next = Argmax(*logits, n_vocab);
      ASSERT_EQ(next, golden_ids[step]) << name << " step " << step;
      logits = (*session)->Feed({next});
      ASSERT_TRUE(logits.ok()) << logits.status().ToString();
    }
  }
  EXPECT_EQ(compared, 2 * 24 * 5);
  std::printf("[ recall f16 ] worst top-5 log-probability difference vs llama-server: %.3g (tolerance %.3g)\n", worst,
              kServerLogprobTol);
}

}  // namespace
}  // namespace kvx
