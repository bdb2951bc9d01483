// Paged attention over a SequenceKV: softmax(q K^T * scale) V for one layer,
// computed directly on the pages in their codec's encoding (no dense copy:
// quantized pages are dequantized in registers inside the q.K and p.V loops).
//
// Masking is causal by ORIGINAL position: query i attends to every cache entry
// whose stored position <= q_pos[i]. This stays correct after entries are
// evicted, reordered or reused at other positions.
//
// Work decomposition (results never depend on the thread count):
//   * rows: the query heads of one GQA group share their kv head, so they are
//     processed together — up to kMaxQueryRows (query, head) rows per visit of
//     a page, which is therefore read and dequantized once per group rather
//     than once per query head. In prefill the rows of a block are consecutive
//     queries' group heads; pages entirely after every row's position are
//     skipped.
//   * context chunks: each (layer, kv-head) chain is cut into chunks of
//     kAttentionChunkTokens entries (whole pages; longer beyond
//     kAttentionMaxChunks chunks). Each (kv head, row block, chunk) is an
//     independent work item producing a partial softmax (reference max m,
//     sum l, unnormalised output o); partials are merged in
//     chunk order with the log-sum-exp rule
//        M = max_c m_c,  L = sum_c l_c e^(m_c - M),  out = sum_c o_c e^(m_c - M) / L.
//     So a single decode query over a long context keeps every thread busy
//     even when n_kv_heads < threads, and since the chunking depends only on
//     the chain length the result is bit-identical for any thread count.
//     A chain of at most one chunk gives exactly the plain computation: its
//     items write their rows' outputs themselves, with no partials or merge
//     (except for an observer, which the merge feeds).
//     (Results may differ in the last bits with the batch composition: the
//     multi-row kernels accumulate in a row-count-specific order, and a
//     prompt's blocks of several queries take the f16 prompt kernel, which
//     sums in lanes: simd_avx512_prompt.h.)
//
//   * within a work item, one pass page by page (online softmax): a page's
//     scores, then its values, with the reference max, sum and accumulator
//     rescaled when a page raises the max (see Numerics). Reading each page
//     once, keys then values, keeps the memory stream sequential (the
//     table's pages are allocated in runs, see block_pool.h), which the
//     hardware prefetchers follow; a pass over all keys of a chunk then all
//     its values did not.
//
// Numerics: scores, softmax and accumulation are float; the scale multiplies
// the queries (once per work item), so s_j = (scale q) . k_j; the softmax
// subtracts a reference row max m, which follows the running max only when
// that exceeds it by more than kSoftmaxSlack (codec_id.h: rescaling on every
// rise cost ~5% of decode attention); the output is sum_j exp(s_j - m) V_j /
// sum_j exp(s_j - m). A query that sees no entry gets a zero output.
// Codec transforms: with a Hadamard rotation the queries are rotated like the
// keys and the output is rotated back; with pre-RoPE keys each page's keys are
// decoded to a one-page tile, (un-rotated,) roped at their stored positions
// and dotted with the queries.
//
// Thread-safety: reads `kv` from pool threads; nothing may mutate `kv` or its
// pages during the call.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "kv/sequence_kv.h"
#include "util/thread_pool.h"

namespace kvx::kv {

// Entries per context chunk (rounded down to whole pages, at least one page),
// for chains of up to kAttentionMaxChunks such chunks; longer chains are cut
// into kAttentionMaxChunks longer chunks (of whole pages), since each chunk
// costs a partial to merge and a break in the thread's stream of pages
// (smollm2-135m's 8k cache, 1024-token chunks against 512: kv_bench
// AllLayers f16 2 threads faster in 9 of 11 pairs, median -4%). The chunking
// depends only on the chain lengths, never on the thread count.
inline constexpr int kAttentionChunkTokens = 512;
inline constexpr int kAttentionMaxChunks = 8;

// Optional observer of attention probabilities (for eviction/merging policies
// such as H2O, SnapKV, TOVA). Off by default; when off, it costs nothing.
// The forward pass takes one (model::ForwardBatch::observer), so policies
// above kv/ reach it without touching the model.
class AttentionObserver {
 public:
  virtual ~AttentionObserver() = default;
  // Observe only the last `QueryWindow()` queries of each sequence in a call
  // (0 = all). SnapKV needs the last 32-64 queries of a prefill, not all n^2
  // probabilities: the unobserved rows keep the fast kernels and the
  // observer's score buffers hold only the window.
  virtual int QueryWindow() const { return 0; }
  // Whether this call's `n_q` queries of batch sequence `seq` are observed
  // at all. An unobserved sequence keeps the fast kernels: a policy that
  // compresses only once, after a prompt, has no use for decode queries,
  // and observing them made decode slower than with the whole cache.
  virtual bool Observes(int seq, int n_q) const {
    (void)seq;
    (void)n_q;
    return true;
  }
  // Whether OnProbabilities is wanted at all. An observer that needs only
  // the queries (ThinK's channel scores) answers false, and its sequences
  // keep the fast kernels.
  virtual bool WantsProbabilities() const { return true; }
  // Called once per (observed sequence, layer) of a call, on the calling
  // thread before the attention runs: the sequence's queries as given (q
  // [n_q][n_heads][head_dim], roped, unscaled, in the model's basis).
  virtual void OnQueries(int seq, int layer, const float* q, int n_q, int n_heads, int head_dim) {
    (void)seq;
    (void)layer;
    (void)q;
    (void)n_q;
    (void)n_heads;
    (void)head_dim;
  }
  // Called once per observed (query, query head) with the normalised
  // probabilities over the slots of (layer, kv_head) in chain order:
  // probs[j] belongs to slot j (its position is positions[j]); masked and
  // dead slots have probability 0. `seq` is the sequence's index in the
  // AttentionBatch call (0 for Attention), query_index the query's index
  // among that sequence's queries of the call, `n` the chain's slot count.
  // Called concurrently from pool threads for different (seq, query_index,
  // head): implementations must be thread-safe (e.g. write per-(query, head)
  // slots). The pointers are valid only during the call.
  virtual void OnProbabilities(int seq, int layer, int query_index, int head, int kv_head, const float* probs,
                               const int32_t* positions, int n) = 0;
  // Whether column sums (OnColumnSums) serve this observer instead of
  // OnProbabilities for calls of several queries of a sequence (a prompt, a
  // prefill chunk): what H2O's sums and a SnapKV/TOVA window need. Their
  // rows then keep the fused kernels, which leave the weights they compute
  // in a tile, summed per thread and merged once per layer (no per-row
  // callback, no second exp pass); decode queries still go through
  // OnProbabilities.
  virtual bool WantsColumnSums() const { return false; }
  // Called once per (observed sequence, layer, query head) of such a call,
  // on the calling thread after the attention: sums[j] = the sum over the
  // call's `queries` observed queries (the window) of the probability slot j
  // of (layer, kv head) received (positions[j] its position; 0 for masked
  // and dead slots), in chain order, n slots. Pointers valid only during
  // the call.
  virtual void OnColumnSums(int seq, int layer, int head, const float* sums, const int32_t* positions, int n,
                            int queries) {
    (void)seq;
    (void)layer;
    (void)head;
    (void)sums;
    (void)positions;
    (void)n;
    (void)queries;
  }
};

// Whether column sums may serve observers that want them (default true);
// false sends every observed row through OnProbabilities, the reference
// path tests compare the column sums with.
std::atomic<bool>& ColumnSumsAllowed();

// How an observer takes part in a call of n_q queries of batch sequence
// `seq`, as AttentionBatch decides it. The observer changes the arithmetic,
// not only what is reported: a column-sum call runs each kv head's chain as
// one chunk (its taps need the rows' final maxima), and a probability call
// sends its observed rows (the last QueryWindow() queries) through the
// general path instead of the fused kernels. Two calls on the same cache
// with equal Participation give bit-identical outputs; eval's prefill cache
// shares a prefill only between specs whose prompt calls agree here.
struct ObserverParticipation {
  bool observed = false;       // OnQueries is called
  bool probabilities = false;  // OnProbabilities or OnColumnSums is called
  bool column_sums = false;    // ... as column sums
  int window = 0;              // the observed queries (0 = all) when probabilities
  // "none", "column-sums" or "probabilities,window=W": what the arithmetic depends on.
  std::string ArithmeticKey() const;
};
ObserverParticipation Participation(const AttentionObserver* observer, int seq, int n_q);

// Paged attention for one layer.
//   q     [n_q][n_heads][head_dim], roped; query head h uses kv head h / (n_heads / n_kv_heads)
//   q_pos [n_q] positions of the queries
//   out   [n_q][n_heads][head_dim]
//   scale typically 1/sqrt(head_dim)
//   pool  may be nullptr (runs on the calling thread)
//   observer may be nullptr (see AttentionObserver)
// REQUIRES: 0 <= layer < n_layers; n_heads a positive multiple of n_kv_heads;
// out does not alias q; with pre-RoPE keys, kv.set_rope() was called.
void Attention(const SequenceKV& kv, int layer, const float* q, const int32_t* q_pos, int n_q, int n_heads,
               float scale, float* out, ThreadPool* pool, AttentionObserver* observer = nullptr);

// One sequence's part of a batched attention call: its cache and its queries.
struct AttentionSeq {
  const SequenceKV* kv;
  const float* q;        // [n_q][n_heads][head_dim]
  const int32_t* q_pos;  // [n_q]
  int n_q;
  float* out;            // [n_q][n_heads][head_dim]
};

// Attention for several sequences of one layer at once (a batched forward
// step): each sequence attends to its own cache only; the work items of all
// of them share one parallel loop. Each sequence's outputs are bit-identical
// to an Attention call on it alone (items never mix sequences). Sequences
// may use different codecs and layouts (same n_heads).
void AttentionBatch(const AttentionSeq* seqs, int n_seqs, int layer, int n_heads, float scale, ThreadPool* pool,
                    AttentionObserver* observer = nullptr);

}  // namespace kvx::kv
