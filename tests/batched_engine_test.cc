// The batched forward pass through the engine: several sessions stepped
// together give the logits each gives alone; a step the pool cannot hold
// changes nothing and a smaller retry runs; the attention observer sees only
// its query window.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cmath>
#include <memory>
#include <vector>

#include "engine/session.h"
#include "kv/policy/policy.h"
#include "model/synthetic_model.h"

namespace kvx {
namespace {

std::string WriteModel(gguf::TensorType type, const std::string& name) {
  model::SyntheticModelOptions o;
  o.shape = "tiny";
  o.type = type;
  o.init_std = 0.1f;  // logits with some spread, so differences show
  const std::string path = ::testing::TempDir() + "/" + name;
  EXPECT_TRUE(model::WriteSyntheticModel(o, path).ok());
  return path;
}

std::unique_ptr<engine::Engine> LoadEngine(const std::string& path, const std::string& kv, int n_seqs = 8,
                                           int n_ctx = 256) {
  engine::EngineOptions eo;
  eo.model_path = path;
  eo.kv_spec = kv::ParseKVSpec(kv).value();
  eo.n_ctx = n_ctx;
  eo.n_seqs = n_seqs;
  eo.n_threads = 2;
  auto e = engine::Engine::Load(eo);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

std::vector<int32_t> Tokens(int n, int salt, int n_vocab) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((i * 37 + salt * 101 + 5) % n_vocab);
  return t;
}

// Largest |a - b| over the largest |a|.
double RelativeDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double spread = 0, worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    spread = std::max(spread, std::fabs(static_cast<double>(a[i])));
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return spread > 0 ? worst / spread : worst;
}

// Prefill of different lengths and decode steps, all sessions in one step,
// against each session run alone through its own steps. Attention is
// bit-identical per sequence (work items never mix sequences); the matmuls
// see a different number of rows, and kernels of different row counts sum in
// different orders (and quantize the activations of each row alike, so Q8_0
// differs only by float accumulation order too): logits agree to float
// rounding. Measured here (AVX-512, 2 threads): bit-identical, 0 for f32 and
// q8_0 (every kernel computes a row the same whatever the row count);
// allowed 2e-5 of the spread for targets whose tiles round differently, far
// below what a wrong sequence or position gives (order 1e-1, next test).
TEST(BatchedEngineTest, BatchedSessionsMatchEachAlone) {
  for (auto type : {gguf::TensorType::kF32, gguf::TensorType::kQ8_0}) {
    for (const std::string kv : {"codec=f16", "codec=kivi4,page=16,residual=16", "codec=int8,prerope=1"}) {
      SCOPED_TRACE(std::string(gguf::TensorTypeName(type)) + " " + kv);
      const std::string path = WriteModel(type, "batched.gguf");
      auto batched = LoadEngine(path, kv);
      auto alone = LoadEngine(path, kv);
      ASSERT_TRUE(batched && alone);
      const int n_vocab = batched->model().config().n_vocab;
      const std::vector<int> prompt_len = {7, 1, 40, 12, 3};
      const int N = static_cast<int>(prompt_len.size());
      std::vector<std::unique_ptr<engine::Session>> b, a;
      std::vector<std::vector<int32_t>> prompts;
      for (int s = 0; s < N; ++s) {
        b.push_back(std::move(batched->NewSession()).value());
        a.push_back(std::move(alone->NewSession()).value());
        prompts.push_back(Tokens(prompt_len[s], s, n_vocab));
      }
      // Step 1: every prompt at once, all logits of each.
      std::vector<std::vector<float>> got(N), want(N);
      std::vector<engine::StepInput> in(N);
      for (int s = 0; s < N; ++s) in[s] = {b[s].get(), prompts[s], 0, &got[s]};
      ASSERT_TRUE(batched->Step(in).ok());
      double worst = 0;
      for (int s = 0; s < N; ++s) {
        ASSERT_TRUE(a[s]->FeedWithLogits(prompts[s], 0, &want[s]).ok());
        worst = std::max(worst, RelativeDiff(got[s], want[s]));
      }
      // Decode steps: one token per session per step.
      for (int step = 0; step < 4; ++step) {
        std::vector<std::vector<int32_t>> next(N);
        for (int s = 0; s < N; ++s) {
          next[s] = {static_cast<int32_t>((step * 13 + s * 7) % n_vocab)};
          in[s] = {b[s].get(), next[s], -1, &got[s]};
        }
        ASSERT_TRUE(batched->Step(in).ok());
        for (int s = 0; s < N; ++s) {
          ASSERT_TRUE(a[s]->FeedWithLogits(next[s], 0, &want[s]).ok());
          worst = std::max(worst, RelativeDiff(got[s], want[s]));
        }
      }
      EXPECT_LE(worst, 2e-5) << "batched and alone logits differ";
      std::printf("batched vs alone: worst relative difference %.3g\n", worst);
      ASSERT_TRUE(batched->kv_manager().CheckInvariants().ok());
    }
  }
}

// A sequence fed the wrong sequence's tokens would differ at order 1: the
// comparison above can fail.
// One cache cannot be two sequences of a batch: the sequences' K/V appends
// run in one parallel loop (SequenceKV::AppendBatch), one per cache.
TEST(BatchedEngineTest, ForwardRefusesTwoSequencesSharingACache) {
  auto e = LoadEngine(WriteModel(gguf::TensorType::kF32, "batched.gguf"), "codec=f16");
  ASSERT_TRUE(e);
  kv::KVManager& kvm = e->kv_manager();
  kv::SequenceKV* shared = &kvm.kv(kvm.AddSequence());
  model::ForwardBatch batch;
  batch.tokens = {1, 2};
  batch.positions = {0, 0};
  batch.seq_start = {0, 1, 2};
  const std::vector<kv::SequenceKV*> kvs = {shared, shared};
  model::ForwardScratch scratch;
  const Status s = e->model().Forward(batch, kvs, &scratch, nullptr, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("share a cache"), std::string::npos) << s.message();
  EXPECT_EQ(shared->Length(0, 0), 0);
}

TEST(BatchedEngineTest, DifferentSequencesDiffer) {
  const std::string path = WriteModel(gguf::TensorType::kF32, "differ.gguf");
  auto e = LoadEngine(path, "codec=f16");
  const int n_vocab = e->model().config().n_vocab;
  auto s0 = std::move(e->NewSession()).value();
  auto s1 = std::move(e->NewSession()).value();
  std::vector<float> l0, l1;
  ASSERT_TRUE(s0->FeedWithLogits(Tokens(9, 0, n_vocab), 8, &l0).ok());
  ASSERT_TRUE(s1->FeedWithLogits(Tokens(9, 1, n_vocab), 8, &l1).ok());
  EXPECT_GT(RelativeDiff(l0, l1), 1e-2);
}

// The pool runs out: the step fails with ResourceExhausted having changed
// nothing, and a smaller batch (the scheduler's retry) runs.
TEST(BatchedEngineTest, ExhaustedStepChangesNothingAndSmallerRetryRuns) {
  const std::string path = WriteModel(gguf::TensorType::kF32, "exhaust.gguf");
  auto e = LoadEngine(path, "codec=f16,page=16;budget=64K", 1, 512);
  const int n_vocab = e->model().config().n_vocab;
  std::vector<std::unique_ptr<engine::Session>> s;
  for (int i = 0; i < 3; ++i) s.push_back(std::move(e->NewSession()).value());
  std::vector<std::vector<int32_t>> prompts = {Tokens(60, 0, n_vocab), Tokens(60, 1, n_vocab), Tokens(60, 2, n_vocab)};
  std::vector<engine::StepInput> in;
  for (int i = 0; i < 3; ++i) in.push_back({s[i].get(), prompts[i], -1, nullptr});
  Status st;
  int steps = 0;
  while ((st = e->Step(in)).ok()) ++steps;
  ASSERT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
  EXPECT_NE(st.message().find("budget"), std::string::npos);
  const uint64_t used = e->kv_manager().BytesInUse();
  const int past = s[0]->n_past();
  EXPECT_EQ(e->Step(in).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(e->kv_manager().BytesInUse(), used);
  EXPECT_EQ(s[0]->n_past(), past);
  ASSERT_TRUE(e->kv_manager().CheckInvariants().ok()) << e->kv_manager().CheckInvariants().ToString();
  // Preempt two sessions: the third continues.
  s[1].reset();
  s[2].reset();
  const std::vector<int32_t> one = {1};
  const engine::StepInput retry[] = {{s[0].get(), one, -1, nullptr}};
  EXPECT_TRUE(e->Step(retry).ok());
  EXPECT_EQ(s[0]->n_past(), past + 1);
  EXPECT_TRUE(e->kv_manager().CheckInvariants().ok());
}

// An observer asking for a window of the last queries sees exactly those,
// for every layer and query head of every sequence in the step.
class WindowObserver : public kv::AttentionObserver {
 public:
  int QueryWindow() const override { return 4; }
  void OnProbabilities(int seq, int, int query_index, int, int, const float* probs, const int32_t* positions,
                       int n) override {
    ++calls;
    if (query_index < min_query[seq]) min_query[seq] = query_index;
    double sum = 0;
    for (int j = 0; j < n; ++j) sum += positions[j] == kv::kDeadPosition ? 0 : probs[j];
    if (std::fabs(sum - 1.0) > 1e-4) ++bad_sums;
  }
  std::atomic<int> calls{0}, bad_sums{0};
  std::atomic<int> min_query[2] = {1 << 30, 1 << 30};
};

class ObservingPolicy : public kv::KVPolicy {
 public:
  std::string_view name() const override { return "observe"; }
  Status OnStepCommitted(kv::KVManager&, kv::SeqId) override { return Status::Ok(); }
  kv::AttentionObserver* observer() override { return &obs; }
  WindowObserver obs;
};

TEST(BatchedEngineTest, ObserverSeesOnlyItsQueryWindow) {
  const std::string path = WriteModel(gguf::TensorType::kF32, "observe.gguf");
  auto e = LoadEngine(path, "codec=f16");
  auto p = std::make_unique<ObservingPolicy>();
  ObservingPolicy* policy = p.get();
  e->kv_manager().AddPolicy(std::move(p));
  const model::ModelConfig& c = e->model().config();
  auto s0 = std::move(e->NewSession()).value();
  auto s1 = std::move(e->NewSession()).value();
  const auto t0 = Tokens(20, 0, c.n_vocab), t1 = Tokens(9, 1, c.n_vocab);
  const engine::StepInput in[] = {{s0.get(), t0, -1, nullptr}, {s1.get(), t1, -1, nullptr}};
  ASSERT_TRUE(e->Step(in).ok());
  EXPECT_EQ(policy->obs.calls.load(), 2 * 4 * c.n_layers * c.n_heads);
  EXPECT_EQ(policy->obs.min_query[0].load(), 16);
  EXPECT_EQ(policy->obs.min_query[1].load(), 5);
  EXPECT_EQ(policy->obs.bad_sums.load(), 0);
}

}  // namespace
}  // namespace kvx
