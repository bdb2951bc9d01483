// Model: a loaded llama-family model (config, tokenizer, weight views into the
// memory-mapped GGUF, or into repacked copies where that makes decode faster:
// ops/weight_pack.h) and its forward pass.
//
// One Model serves many sessions: it is immutable after Load, and Forward
// takes everything per-sequence (the KV cache, scratch buffers) as arguments.
// The forward pass reads and writes the KV cache only through kv/.
//
// Thread-safety: const methods are safe from many threads, provided each
// caller passes its own SequenceKV and ForwardScratch.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gguf/gguf_file.h"
#include "kv/attention.h"
#include "kv/layout.h"
#include "kv/sequence_kv.h"
#include "model/config.h"
#include "model/tokenizer.h"
#include "ops/matmul.h"
#include "ops/weight_pack.h"
#include "util/status.h"
#include "util/thread_pool.h"

namespace kvx::model {

struct LayerWeights {
  std::vector<float> attn_norm, ffn_norm;
  std::vector<float> bq, bk, bv;  // qwen2 only
  ops::WeightView wq, wk, wv, wo;
  ops::WeightView w_gate, w_up, w_down;
};

// Selective recomputation (chunk reuse, engine/chunk_assembly.h): a forward
// pass over one sequence in which a row's K/V at a layer either comes from
// the model (the row is "recomputed" there) or from elsewhere (a chunk cache).
// A row's hidden state exists only while it is recomputed, so each layer's
// rows are a subset of the previous layer's; every row's K/V is stored at
// every layer.
class RowRecompute {
 public:
  virtual ~RowRecompute() = default;
  // Batch indices (increasing) whose K/V layer `layer` computes; for
  // layer > 0 a subset of the rows of layer - 1 (else the pass fails with
  // InvalidArgument). Called once per layer, in order.
  virtual std::span<const int32_t> Rows(int layer) = 0;
  // Called once per layer after the K/V of `rows` = Rows(layer) are
  // computed (k, v [rows.size()][kv_dim]; keys roped unless the cache keeps
  // them pre-RoPE), before anything is stored: writes the K/V of every row
  // of the batch ([n][kv_dim]) to k_all, v_all, the recomputed rows' from
  // k, v and the others' from wherever they come from.
  virtual void Merge(int layer, std::span<const int32_t> rows, const float* k, const float* v, float* k_all,
                     float* v_all) = 0;
};

// A batch of tokens to run through the model: the tokens of one or more
// sequences, each sequence's rows contiguous. Row i is token tokens[i] at
// positions[i] of the sequence whose range [seq_start[s], seq_start[s + 1])
// holds i. The matmuls run over all rows at once (weights read once per
// step); attention runs per sequence on its own cache.
struct ForwardBatch {
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;    // same length as tokens
  // Row ranges of the sequences, n_seqs + 1 increasing offsets from 0 to
  // tokens.size(); empty = one sequence holding every row.
  std::vector<int32_t> seq_start;
  // Batch indices whose logits are wanted, in the order they are written to
  // the output (e.g. {n-1} for generation, a range for perplexity).
  std::vector<int32_t> logit_rows;
  // Sees the attention probabilities (kv/attention.h; `seq` is the index of
  // the sequence in this batch); nullptr = none, at no cost.
  kv::AttentionObserver* observer = nullptr;
  // nullptr: every row through every layer. Otherwise the batch holds one
  // sequence, and logit_rows must be rows of the last layer.
  RowRecompute* recompute = nullptr;
};

// Per-sequence working memory, reused across calls to avoid allocations.
struct ForwardScratch {
  std::vector<float> x, h, q, k, v, attn, o, gate, up, logits_in;
  std::vector<float> k_all, v_all;  // RowRecompute: every row's K/V of a layer
};

class Model {
 public:
  // Opens and validates a GGUF model: architecture, every hyperparameter,
  // every tensor's presence, shape and type. Errors say what is wrong.
  static Result<std::unique_ptr<Model>> Load(const std::string& path);

  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const gguf::GgufFile& file() const { return *file_; }

  // RoPE as this model applies it (chunk reuse re-rotates cached keys with it).
  ops::RopeParams rope_params() const;

  // The KV layout of this model with `page_tokens` entries per page.
  kv::KVLayout KVLayoutFor(int page_tokens) const;

  // Runs `batch` through the model, appending each sequence's K/V to its
  // cache kvs[s] (one per sequence of the batch) and writing logits for
  // batch.logit_rows to `logits` ([n_rows][n_vocab]). InvalidArgument for
  // bad token ids or a malformed batch (checked before anything runs).
  // ResourceExhausted when a cache without a reservation (kv_manager.h)
  // runs out of budget; with every cache reserved for the step (the
  // engine's path) the pass cannot run out half-way.
  Status Forward(const ForwardBatch& batch, std::span<kv::SequenceKV* const> kvs, ForwardScratch* scratch,
                 ThreadPool* pool, float* logits) const;
  // The batch of one sequence.
  Status Forward(const ForwardBatch& batch, kv::SequenceKV* kv, ForwardScratch* scratch, ThreadPool* pool,
                 float* logits) const {
    kv::SequenceKV* const one[] = {kv};
    return Forward(batch, one, scratch, pool, logits);
  }

  // How many weight matrices were repacked at load (ops/weight_pack.h).
  int RepackedMatrices() const { return packed_.count(); }

  // Bytes of weights (as stored).
  uint64_t WeightBytes() const { return weight_bytes_; }
  // Weight bytes one decoded token must read: every matrix, the output head,
  // and one embedding row (the whole embedding table only when it is tied
  // to the output head).
  uint64_t DecodeWeightBytesPerToken() const;
  // Multiply-add FLOPs (x2) of the weight matrices for one token, excluding
  // the output head and attention.
  double MatmulFlopsPerToken() const;

 private:
  Model() = default;
  Status LoadWeights();
  void RepackWeights();

  std::unique_ptr<gguf::GgufFile> file_;
  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ops::WeightView token_embd_;
  ops::WeightView output_;  // == token_embd_ when embeddings are tied
  std::vector<float> output_norm_;
  std::vector<float> rope_freq_factors_;  // empty unless llama3-style scaling
  std::vector<LayerWeights> layers_;
  ops::PackedWeights packed_;  // repacked matrices the views above point into
  uint64_t weight_bytes_ = 0;
};

}  // namespace kvx::model
