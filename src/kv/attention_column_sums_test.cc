// Column sums (AttentionObserver::WantsColumnSums): an observer that takes
// them gets, per (layer, query head), the sum over the call's observed
// queries of the probabilities each slot received, from the weights the
// kernels tap (the AVX-512 prompt kernel, the general path on AVX2 and
// scalar), and the same sums as the per-row path (OnProbabilities) within
// float rounding; the outputs do not change.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kv/attention.h"
#include "kv/kv_test_util.h"

namespace kvx::kv {
namespace {

// Sums per (layer, head), by slot, from either path.
class SumObserver : public AttentionObserver {
 public:
  SumObserver(bool columns, int window) : columns_(columns), window_(window) {}
  int QueryWindow() const override { return window_; }
  bool WantsColumnSums() const override { return columns_; }
  void OnProbabilities(int, int layer, int, int head, int, const float* probs, const int32_t*, int n) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<double>& s = sums[{layer, head}];
    s.resize(n, 0.0);
    for (int j = 0; j < n; ++j) s[j] += probs[j];
    queries[{layer, head}] += 1;
    ++row_calls;
  }
  void OnColumnSums(int, int layer, int head, const float* col, const int32_t*, int n, int q) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<double>& s = sums[{layer, head}];
    s.resize(n, 0.0);
    for (int j = 0; j < n; ++j) s[j] += col[j];
    queries[{layer, head}] += q;
    ++column_calls;
  }
  std::map<std::pair<int, int>, std::vector<double>> sums;
  std::map<std::pair<int, int>, int> queries;
  int row_calls = 0, column_calls = 0;

 private:
  bool columns_;
  int window_;
  std::mutex mu_;
};

struct Shape {
  CodecId codec;
  int T, group, dim, n, n_q, window;
};

// A prompt-like call: n entries at positions 0..n-1 (one evicted-looking
// gap), n_q queries at the last positions (the first sees part of a page,
// the earlier rows skip the later pages).
void CompareColumnSums(const Shape& c, int threads) {
  const int kv_heads = 2, n_heads = kv_heads * c.group;
  const KVLayout layout{1, kv_heads, c.dim, c.T};
  auto bp = std::move(BlockPool::Create({.budget_bytes = BudgetForContext(layout, c.codec, c.n + 64),
                                         .page_bytes = PageBytes(layout, c.codec)}))
                .value();
  SequenceKV kv(bp.get(), layout, c.codec);
  std::mt19937 rng(c.T * 7919 + c.group * 131 + c.n + c.n_q + c.dim);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<int32_t> pos(c.n);
  std::iota(pos.begin(), pos.end(), 0);
  for (int j = c.n / 2; j < c.n; ++j) pos[j] += 3;  // a gap in the positions
  std::vector<float> k(static_cast<size_t>(c.n) * kv_heads * c.dim), v(k.size());
  std::vector<float> q(static_cast<size_t>(c.n_q) * n_heads * c.dim);
  for (auto* vec : {&k, &v, &q}) for (auto& x : *vec) x = nd(rng);
  // Keys drift towards the queries: later entries score higher, so the
  // running max rises along the chain (rescaled weights).
  for (int j = 0; j < c.n; ++j) {
    for (int ch = 0; ch < kv_heads * c.dim; ++ch) k[static_cast<size_t>(j) * kv_heads * c.dim + ch] += 0.01f * j * q[ch % c.dim];
  }
  ASSERT_TRUE(kv.Append(0, c.n, pos.data(), k.data(), v.data()).ok());
  std::vector<int32_t> q_pos(c.n_q);
  for (int i = 0; i < c.n_q; ++i) q_pos[i] = pos[c.n - c.n_q + i];
  std::unique_ptr<ThreadPool> tp = threads > 1 ? std::make_unique<ThreadPool>(threads) : nullptr;
  std::vector<float> out_rows(q.size()), out_cols(q.size()), out_plain(q.size());
  SumObserver rows(false, c.window), cols(true, c.window);
  Attention(kv, 0, q.data(), q_pos.data(), c.n_q, n_heads, 0.125f, out_rows.data(), tp.get(), &rows);
  Attention(kv, 0, q.data(), q_pos.data(), c.n_q, n_heads, 0.125f, out_cols.data(), tp.get(), &cols);
  Attention(kv, 0, q.data(), q_pos.data(), c.n_q, n_heads, 0.125f, out_plain.data(), tp.get());
  const int observed = c.window > 0 ? std::min(c.window, c.n_q) : c.n_q;
  EXPECT_EQ(rows.row_calls, observed * n_heads);
  EXPECT_EQ(rows.column_calls, 0);
  EXPECT_EQ(cols.row_calls, 0);
  EXPECT_EQ(cols.column_calls, n_heads);  // one per query head
  ASSERT_EQ(cols.sums.size(), rows.sums.size());
  for (const auto& [key, ref] : rows.sums) {
    EXPECT_EQ(cols.queries[key], observed);
    const std::vector<double>& got = cols.sums[key];
    ASSERT_EQ(got.size(), ref.size());
    double total = 0;
    for (size_t j = 0; j < ref.size(); ++j) {
      ASSERT_NEAR(got[j], ref[j], 2e-6 * observed + 1e-5 * ref[j]) << "head " << key.second << " slot " << j;
      total += got[j];
    }
    EXPECT_NEAR(total, observed, 1e-4 * observed);  // every observed query sees something
  }
  // The outputs: the plain call's, up to the kernels' rounding (the
  // per-row path takes the general kernels).
  for (size_t i = 0; i < out_cols.size(); ++i) {
    ASSERT_NEAR(out_cols[i], out_plain[i], 1e-5 * (1 + std::fabs(out_plain[i]))) << i;
    ASSERT_NEAR(out_rows[i], out_plain[i], 1e-5 * (1 + std::fabs(out_plain[i]))) << i;
  }
}

TEST(AttentionColumnSumsTest, MatchPerRowProbabilitiesOnEveryPath) {
  const std::vector<Shape> shapes = {
      // f16 pages of whole 16-blocks: the AVX-512 prompt kernel taps them.
      {CodecId::kF16, 16, 3, 64, 203, 37, 0},
      {CodecId::kF16, 64, 1, 32, 150, 9, 0},
      {CodecId::kF16, 16, 4, 64, 77, 13, 5},  // a window starting inside a row block
      {CodecId::kF16, 16, 3, 64, 700, 6, 0},  // longer than a context chunk: one chunk per head
      // Pages the fused kernels do not take: the general path taps them.
      {CodecId::kF16, 8, 3, 64, 91, 11, 0},
      {CodecId::kF32, 16, 3, 32, 120, 17, 1},  // TOVA's window: the last query
      {CodecId::kInt8, 32, 2, 64, 99, 21, 0},
  };
  for (testing::KernelPath path : testing::kAllKernelPaths) {
    testing::ScopedKernelPath force(path);
    for (const Shape& c : shapes) {
      for (int threads : {1, 2}) {
        SCOPED_TRACE(std::string(testing::Name(path)) + " codec " + std::to_string(static_cast<int>(c.codec)) +
                     " T " + std::to_string(c.T) + " group " + std::to_string(c.group) + " n " + std::to_string(c.n) +
                     " n_q " + std::to_string(c.n_q) + " window " + std::to_string(c.window) + " threads " +
                     std::to_string(threads));
        CompareColumnSums(c, threads);
      }
    }
  }
}

// ColumnSumsAllowed(false) sends an observer that wants column sums down
// the per-row path (the reference the real-model test compares with).
TEST(AttentionColumnSumsTest, SwitchSendsRowsThroughOnProbabilities) {
  const KVLayout layout{1, 1, 32, 16};
  auto bp = std::move(BlockPool::Create({.budget_bytes = 1 << 20, .page_bytes = PageBytes(layout, CodecId::kF16)})).value();
  SequenceKV kv(bp.get(), layout, CodecId::kF16);
  std::vector<int32_t> pos(20);
  std::iota(pos.begin(), pos.end(), 0);
  std::vector<float> k(20 * 32, 0.1f), v(k.size(), 1.0f), q(2 * 32, 0.2f), out(q.size());
  ASSERT_TRUE(kv.Append(0, 20, pos.data(), k.data(), v.data()).ok());
  const int32_t q_pos[2] = {10, 19};
  ColumnSumsAllowed().store(false);
  SumObserver obs(true, 0);
  Attention(kv, 0, q.data(), q_pos, 2, 1, 0.125f, out.data(), nullptr, &obs);
  ColumnSumsAllowed().store(true);
  EXPECT_EQ(obs.row_calls, 2);
  EXPECT_EQ(obs.column_calls, 0);
}

// What an observer changes in a call's arithmetic, as AttentionBatch
// decides it (eval's prefill cache keys on it).
TEST(AttentionColumnSumsTest, ParticipationSaysHowACallIsComputed) {
  EXPECT_EQ(Participation(nullptr, 0, 256).ArithmeticKey(), "none");
  SumObserver columns(true, 1), rows(false, 32);
  EXPECT_EQ(Participation(&columns, 0, 256).ArithmeticKey(), "column-sums");
  EXPECT_EQ(Participation(&columns, 0, 1).ArithmeticKey(), "probabilities,window=1");  // decode: no column sums
  EXPECT_EQ(Participation(&rows, 0, 256).ArithmeticKey(), "probabilities,window=32");
  ColumnSumsAllowed() = false;
  EXPECT_EQ(Participation(&columns, 0, 256).ArithmeticKey(), "probabilities,window=1");
  ColumnSumsAllowed() = true;
  struct QueriesOnly : AttentionObserver {
    bool WantsProbabilities() const override { return false; }
    void OnProbabilities(int, int, int, int, int, const float*, const int32_t*, int) override {}
  } queries;
  const ObserverParticipation q = Participation(&queries, 0, 256);
  EXPECT_TRUE(q.observed);
  EXPECT_EQ(q.ArithmeticKey(), "none");
}

}  // namespace
}  // namespace kvx::kv
