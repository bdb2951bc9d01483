// Paged attention over a SequenceKV: softmax(q K^T * scale) V for one layer,
// computed directly on the pages in their codec's encoding (no dense copy).
//
// Masking is causal by ORIGINAL position: query i attends to every cache entry
// whose stored position <= q_pos[i]. This stays correct after entries are
// evicted, reordered or reused at other positions.
//
// Numerics: scores and the softmax are float; softmax subtracts the row max;
// the output is sum_j exp(s_j - max) V_j / sum_j exp(s_j - max). A query that
// sees no entry gets a zero output. Work is split over (query, head) pairs and
// each pair is computed by one thread in a fixed order, so results do not
// depend on the thread count.
//
// Thread-safety: reads `kv` from pool threads; nothing may mutate `kv` or its
// pages during the call.
#pragma once

#include <cstdint>

#include "kv/sequence_kv.h"
#include "util/thread_pool.h"

namespace kvx::kv {

// Optional observer of attention probabilities (for eviction/merging policies
// such as H2O, SnapKV, TOVA). Off by default; when off, the cost is one pointer
// test per (query, head).
class AttentionObserver {
 public:
  virtual ~AttentionObserver() = default;
  // Called once per (query, query head) with the normalised probabilities over
  // the entries of (layer, kv_head) in chain order: probs[j] belongs to entry j
  // (its position is positions[j]); masked entries have probability 0. `n` is
  // the chain length. Called concurrently from pool threads for different
  // (query_index, head) pairs: implementations must be thread-safe (e.g. write
  // per-(query, head) slots). The pointers are valid only during the call.
  virtual void OnProbabilities(int layer, int query_index, int head, int kv_head, const float* probs,
                               const int32_t* positions, int n) = 0;
};

// Paged attention for one layer.
//   q     [n_q][n_heads][head_dim]; query head h uses kv head h / (n_heads / n_kv_heads)
//   q_pos [n_q] positions of the queries
//   out   [n_q][n_heads][head_dim]
//   scale typically 1/sqrt(head_dim)
//   pool  may be nullptr (runs on the calling thread)
//   observer may be nullptr (see AttentionObserver)
// REQUIRES: 0 <= layer < n_layers; n_heads a positive multiple of n_kv_heads;
// out does not alias q.
void Attention(const SequenceKV& kv, int layer, const float* q, const int32_t* q_pos, int n_q, int n_heads,
               float scale, float* out, ThreadPool* pool, AttentionObserver* observer = nullptr);

}  // namespace kvx::kv
