#include "kv/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kv/codec/codecs.h"
#include "util/check.h"

namespace kvx::kv {
namespace {

// Per-thread scratch, reused across the (query, head) pairs of one range.
struct Scratch {
  std::vector<float> scores;      // one per cache entry
  std::vector<int32_t> positions; // only filled when an observer is present
  std::vector<float> acc;         // head_dim
};

// Attention of one query row for one query head against one (layer, kv-head)
// chain, specialised per codec. Two passes over the pages: scores (+ causal
// mask by stored position), then softmax weights times V.
template <PageCodec C>
void AttendOne(const SequenceKV& kv, int layer, int query_index, int head, int kv_head, const float* q,
               int32_t q_pos, float scale, float* out, Scratch* s, AttentionObserver* observer) {
  const KVLayout& L = kv.layout();
  const int T = L.page_tokens, D = L.head_dim;
  const PageTable& t = kv.table(layer, kv_head);
  const int n = t.length();
  const size_t data_offset = PageDataOffset(T);
  const BlockPool& pool = kv.pool();
  const float neg_inf = -std::numeric_limits<float>::infinity();

  if (s->scores.size() < static_cast<size_t>(n)) s->scores.resize(n);
  float* scores = s->scores.data();

  // Pass 1: raw scores, mask, max.
  float max_score = neg_inf;
  for (int p = 0; p < t.num_pages(); ++p) {
    const uint8_t* page = pool.PageData(t.pages()[p]);
    const int m = t.EntriesInPage(p, T);
    float* sp = scores + static_cast<size_t>(p) * T;
    C::Scores(page + data_offset, T, D, m, q, sp);
    const int32_t* pos = PagePositions(page);
    for (int j = 0; j < m; ++j) {
      if (pos[j] > q_pos) {
        sp[j] = neg_inf;
      } else {
        sp[j] *= scale;
        max_score = std::max(max_score, sp[j]);
      }
    }
  }
  float* acc = s->acc.data();
  std::fill(acc, acc + D, 0.0f);
  if (max_score == neg_inf) {  // nothing visible (or empty cache)
    std::fill(out, out + D, 0.0f);
    if (observer != nullptr && n > 0) {
      std::fill(scores, scores + n, 0.0f);
      s->positions.resize(n);
      for (int p = 0; p < t.num_pages(); ++p) {
        const int32_t* pos = PagePositions(pool.PageData(t.pages()[p]));
        std::copy(pos, pos + t.EntriesInPage(p, T), s->positions.data() + static_cast<size_t>(p) * T);
      }
      observer->OnProbabilities(layer, query_index, head, kv_head, scores, s->positions.data(), n);
    }
    return;
  }

  // Pass 2: weights (exp(-inf) = 0 for masked entries), then sum_j w_j V_j.
  float sum = 0.0f;
  for (int p = 0; p < t.num_pages(); ++p) {
    const uint8_t* page = pool.PageData(t.pages()[p]);
    const int m = t.EntriesInPage(p, T);
    float* sp = scores + static_cast<size_t>(p) * T;
    bool any = false;
    for (int j = 0; j < m; ++j) {
      sp[j] = std::exp(sp[j] - max_score);
      sum += sp[j];
      any |= sp[j] != 0.0f;
    }
    if (any) C::AccumulateValues(page + data_offset, T, D, m, sp, acc);
  }
  const float inv = 1.0f / sum;
  for (int c = 0; c < D; ++c) out[c] = acc[c] * inv;

  if (observer != nullptr) {
    s->positions.resize(n);
    for (int p = 0; p < t.num_pages(); ++p) {
      const int32_t* pos = PagePositions(pool.PageData(t.pages()[p]));
      std::copy(pos, pos + t.EntriesInPage(p, T), s->positions.data() + static_cast<size_t>(p) * T);
    }
    for (int j = 0; j < n; ++j) scores[j] *= inv;
    observer->OnProbabilities(layer, query_index, head, kv_head, scores, s->positions.data(), n);
  }
}

}  // namespace

void Attention(const SequenceKV& kv, int layer, const float* q, const int32_t* q_pos, int n_q, int n_heads,
               float scale, float* out, ThreadPool* pool, AttentionObserver* observer) {
  const KVLayout& L = kv.layout();
  KVX_CHECK(layer >= 0 && layer < L.n_layers);
  KVX_CHECK(n_heads > 0 && n_heads % L.n_kv_heads == 0 && n_q >= 0);
  const int group = n_heads / L.n_kv_heads;
  const int D = L.head_dim;
  const size_t n_items = static_cast<size_t>(n_q) * n_heads;

  DispatchCodec(kv.codec(), [&](auto codec) {
    using C = decltype(codec);
    auto run = [&](size_t begin, size_t end, int /*thread*/) {
      Scratch s;
      s.acc.resize(D);
      for (size_t item = begin; item < end; ++item) {
        const int i = static_cast<int>(item / n_heads);
        const int h = static_cast<int>(item % n_heads);
        const size_t off = item * D;
        AttendOne<C>(kv, layer, i, h, h / group, q + off, q_pos[i], scale, out + off, &s, observer);
      }
    };
    if (pool != nullptr) {
      pool->ParallelFor(n_items, run);
    } else {
      run(0, n_items, 0);
    }
  });
}

}  // namespace kvx::kv
