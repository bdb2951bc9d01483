#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kv/attention.h"
#include "model/weight_check.h"
#include "ops/dequant.h"
#include "ops/nn.h"
#include "ops/weight_pack.h"
#include "util/finite.h"
#include "util/mmap_file.h"
#include "util/step_profile.h"

namespace kvx::model {

namespace {

std::string DimsToString(const std::vector<uint64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// Finds a tensor and checks its ggml-order dims.
Result<const gguf::TensorInfo*> FindTensor(const gguf::GgufFile& f, const std::string& name,
                                           const std::vector<uint64_t>& dims) {
  const gguf::TensorInfo* t = f.FindTensor(name);
  if (t == nullptr) return NotFound("model is missing tensor '" + name + "'");
  if (t->dims != dims) {
    return InvalidArgument("tensor '" + name + "' has shape " + DimsToString(t->dims) + ", expected " +
                           DimsToString(dims) + " from the model's metadata");
  }
  return t;
}

Result<ops::WeightView> MatrixView(const gguf::GgufFile& f, const std::string& name, int n_in, int n_out) {
  KVX_ASSIGN_OR_RETURN(const gguf::TensorInfo* t,
                       FindTensor(f, name, {static_cast<uint64_t>(n_in), static_cast<uint64_t>(n_out)}));
  if (!gguf::IsSupportedWeightType(t->type)) {
    return Unimplemented("tensor '" + name + "' has type " + gguf::TensorTypeName(t->type) +
                         "; kvx supports " + gguf::SupportedWeightTypesList());
  }
  KVX_RETURN_IF_ERROR(CheckWeightsFinite(*t));
  ops::WeightView w;
  w.type = t->type;
  w.data = t->data;
  w.n_in = n_in;
  w.n_out = n_out;
  w.row_bytes = gguf::RowBytes(t->type, n_in);
  return w;
}

// Vectors (norm weights, biases) are small: dequantize them once.
Result<std::vector<float>> VectorTensor(const gguf::GgufFile& f, const std::string& name, int n) {
  KVX_ASSIGN_OR_RETURN(const gguf::TensorInfo* t, FindTensor(f, name, {static_cast<uint64_t>(n)}));
  if (!gguf::IsSupportedWeightType(t->type)) {
    return Unimplemented("tensor '" + name + "' has unsupported type " + gguf::TensorTypeName(t->type));
  }
  std::vector<float> out(n);
  ops::DequantizeRow(t->type, t->data, out.data(), n);
  if (const int64_t at = FirstNonFinite(out.data(), out.size()); at >= 0) {
    return DataLoss("tensor '" + name + "' holds a NaN or infinite value at element " + std::to_string(at) +
                    ": the model file is corrupt; convert or download it again");
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<Model>> Model::Load(const std::string& path) {
  std::unique_ptr<Model> m(new Model());
  KVX_ASSIGN_OR_RETURN(m->file_, gguf::GgufFile::Open(path));
  auto config = ModelConfig::FromGguf(*m->file_);
  if (!config.ok()) return config.status().WithContext(path);
  m->config_ = *config;
  auto tok = Tokenizer::FromGguf(*m->file_);
  if (!tok.ok()) return tok.status().WithContext(path);
  m->tokenizer_ = std::move(tok).value();
  if (m->tokenizer_->n_vocab() != m->config_.n_vocab) return Internal("tokenizer/config vocab size mismatch");
  Status s = m->LoadWeights();
  if (!s.ok()) return s.WithContext(path);
  return m;
}

Status Model::LoadWeights() {
  const ModelConfig& c = config_;
  const gguf::GgufFile& f = *file_;
  const int q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
  KVX_ASSIGN_OR_RETURN(token_embd_, MatrixView(f, "token_embd.weight", c.n_embd, c.n_vocab));
  if (f.FindTensor("output.weight") != nullptr) {
    KVX_ASSIGN_OR_RETURN(output_, MatrixView(f, "output.weight", c.n_embd, c.n_vocab));
  } else {
    output_ = token_embd_;  // tied embeddings
  }
  KVX_ASSIGN_OR_RETURN(output_norm_, VectorTensor(f, "output_norm.weight", c.n_embd));
  if (f.FindTensor("rope_freqs.weight") != nullptr) {
    KVX_ASSIGN_OR_RETURN(rope_freq_factors_, VectorTensor(f, "rope_freqs.weight", c.rope_dims / 2));
  }
  layers_.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights& w = layers_[l];
    KVX_ASSIGN_OR_RETURN(w.attn_norm, VectorTensor(f, p + "attn_norm.weight", c.n_embd));
    KVX_ASSIGN_OR_RETURN(w.ffn_norm, VectorTensor(f, p + "ffn_norm.weight", c.n_embd));
    KVX_ASSIGN_OR_RETURN(w.wq, MatrixView(f, p + "attn_q.weight", c.n_embd, q_dim));
    KVX_ASSIGN_OR_RETURN(w.wk, MatrixView(f, p + "attn_k.weight", c.n_embd, kv_dim));
    KVX_ASSIGN_OR_RETURN(w.wv, MatrixView(f, p + "attn_v.weight", c.n_embd, kv_dim));
    KVX_ASSIGN_OR_RETURN(w.wo, MatrixView(f, p + "attn_output.weight", q_dim, c.n_embd));
    KVX_ASSIGN_OR_RETURN(w.w_gate, MatrixView(f, p + "ffn_gate.weight", c.n_embd, c.n_ff));
    KVX_ASSIGN_OR_RETURN(w.w_up, MatrixView(f, p + "ffn_up.weight", c.n_embd, c.n_ff));
    KVX_ASSIGN_OR_RETURN(w.w_down, MatrixView(f, p + "ffn_down.weight", c.n_ff, c.n_embd));
    if (c.has_qkv_bias) {
      KVX_ASSIGN_OR_RETURN(w.bq, VectorTensor(f, p + "attn_q.bias", q_dim));
      KVX_ASSIGN_OR_RETURN(w.bk, VectorTensor(f, p + "attn_k.bias", kv_dim));
      KVX_ASSIGN_OR_RETURN(w.bv, VectorTensor(f, p + "attn_v.bias", kv_dim));
    }
  }
  weight_bytes_ = 0;
  for (const auto& t : f.tensors()) weight_bytes_ += t.n_bytes;
  if (ops::RepackingPays()) RepackWeights();
  return Status::Ok();
}

// Replaces the views of repackable matrices by repacked copies (decode reads
// them as one aligned stream, ops/weight_pack.h) and drops the mapped
// originals from memory, so the weights are not resident twice. A tied
// output head shares the embedding table's copy.
void Model::RepackWeights() {
  std::vector<ops::WeightView*> views = {&token_embd_, &output_};
  for (LayerWeights& w : layers_) {
    for (ops::WeightView* m : {&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down}) views.push_back(m);
  }
  packed_ = ops::PackedWeights::PackAll(views, [](const void* data, size_t bytes) { DropMappedPages(data, bytes); });
}

uint64_t Model::DecodeWeightBytesPerToken() const {
  const uint64_t embd_bytes = token_embd_.row_bytes * token_embd_.n_out;
  const bool tied = output_.data == token_embd_.data;
  return weight_bytes_ - (tied ? 0 : embd_bytes) + token_embd_.row_bytes;
}

double Model::MatmulFlopsPerToken() const {
  double macs = 0;
  for (const LayerWeights& w : layers_) {
    for (const ops::WeightView* m : {&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down}) {
      macs += static_cast<double>(m->n_in) * m->n_out;
    }
  }
  return 2 * macs;
}

kv::KVLayout Model::KVLayoutFor(int page_tokens) const {
  kv::KVLayout layout;
  layout.n_layers = config_.n_layers;
  layout.n_kv_heads = config_.n_kv_heads;
  layout.head_dim = config_.head_dim;
  layout.page_tokens = page_tokens;
  return layout;
}

namespace {

void AddBias(float* x, const std::vector<float>& b, int n_rows) {
  if (b.empty()) return;
  const size_t d = b.size();
  for (int r = 0; r < n_rows; ++r) {
    for (size_t i = 0; i < d; ++i) x[r * d + i] += b[i];
  }
}

}  // namespace

ops::RopeParams Model::rope_params() const {
  ops::RopeParams rope;
  rope.n_dims = config_.rope_dims;
  rope.freq_base = config_.rope_freq_base;
  rope.freq_scale = config_.rope_freq_scale;
  rope.freq_factors = rope_freq_factors_.empty() ? nullptr : rope_freq_factors_.data();
  rope.neox = config_.rope_neox;
  return rope;
}

Status Model::Forward(const ForwardBatch& batch, std::span<kv::SequenceKV* const> kvs, ForwardScratch* s,
                      ThreadPool* pool, float* logits) const {
  const ModelConfig& c = config_;
  const int n = static_cast<int>(batch.tokens.size());
  if (n == 0) return Status::Ok();
  if (batch.positions.size() != batch.tokens.size()) return InvalidArgument("batch positions/tokens mismatch");
  // The sequences' row ranges.
  std::vector<int32_t> one_seq;
  const std::vector<int32_t>* starts = &batch.seq_start;
  if (starts->empty()) {
    one_seq = {0, n};
    starts = &one_seq;
  }
  const int n_seqs = static_cast<int>(starts->size()) - 1;
  if (n_seqs < 1 || static_cast<size_t>(n_seqs) != kvs.size() || starts->front() != 0 || starts->back() != n) {
    return InvalidArgument("batch sequence ranges do not cover its " + std::to_string(n) + " rows for " +
                           std::to_string(kvs.size()) + " caches");
  }
  for (int q = 0; q < n_seqs; ++q) {
    if ((*starts)[q + 1] <= (*starts)[q]) return InvalidArgument("batch sequence " + std::to_string(q) + " has no rows");
    if (kvs[q] == nullptr) return InvalidArgument("batch sequence " + std::to_string(q) + " has no cache");
  }
  {  // one cache per sequence (their appends run in one parallel loop)
    std::vector<kv::SequenceKV*> sorted(kvs.begin(), kvs.end());
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      return InvalidArgument("two sequences of one batch share a cache");
    }
  }
  if (batch.recompute != nullptr && n_seqs != 1) return InvalidArgument("a selective recomputation runs one sequence");
  for (int32_t t : batch.tokens) {
    if (t < 0 || t >= c.n_vocab) {
      return InvalidArgument("token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                             std::to_string(c.n_vocab) + ")");
    }
  }
  for (int32_t r : batch.logit_rows) {
    if (r < 0 || r >= n) return InvalidArgument("logit row out of range");
  }
  const int d = c.n_embd, q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
  s->x.resize(static_cast<size_t>(n) * d);
  s->h.resize(static_cast<size_t>(n) * d);
  s->q.resize(static_cast<size_t>(n) * q_dim);
  s->k.resize(static_cast<size_t>(n) * kv_dim);
  s->v.resize(static_cast<size_t>(n) * kv_dim);
  s->attn.resize(static_cast<size_t>(n) * q_dim);
  s->o.resize(static_cast<size_t>(n) * d);
  s->gate.resize(static_cast<size_t>(n) * c.n_ff);
  s->up.resize(static_cast<size_t>(n) * c.n_ff);

  // The rows that run through the current layer (batch indices) and their
  // positions: every row, unless a RowRecompute narrows them. The buffers
  // above hold the active rows compactly, in this order.
  std::vector<int32_t> rows(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) rows[i] = i;
  if (batch.recompute != nullptr) {
    const std::span<const int32_t> first = batch.recompute->Rows(0);
    rows.assign(first.begin(), first.end());
    for (size_t i = 0; i < rows.size(); ++i) {
      if (rows[i] < 0 || rows[i] >= n || (i > 0 && rows[i] <= rows[i - 1])) {
        return InvalidArgument("recomputed rows must be increasing batch rows");
      }
    }
    s->k_all.resize(static_cast<size_t>(n) * kv_dim);
    s->v_all.resize(static_cast<size_t>(n) * kv_dim);
  }
  int m = static_cast<int>(rows.size());
  std::vector<int32_t> row_positions(static_cast<size_t>(m));
  for (int i = 0; i < m; ++i) row_positions[i] = batch.positions[rows[i]];

  using util::ScopedPhase;
  using util::StepPhase;
  // Token embeddings: one dequantized row per token.
  ScopedPhase embed_phase(StepPhase::kElementwise);
  for (int i = 0; i < m; ++i) ops::DequantizeWeightRow(token_embd_, batch.tokens[rows[i]], &s->x[static_cast<size_t>(i) * d]);

  const ops::RopeParams rope = rope_params();
  for (kv::SequenceKV* kv : kvs) kv->set_rope(rope);  // with pre-RoPE keys (--kv prerope=1) kv applies RoPE to K when reading
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  // Keys are roped here unless the caches rope them on read (all alike: one
  // KV spec per engine).
  const bool pre_rope_keys = kvs[0]->keys_pre_rope();
  for (kv::SequenceKV* kv : kvs) {
    if (kv->keys_pre_rope() != pre_rope_keys) return InvalidArgument("batch mixes pre-RoPE and roped caches");
  }
  std::vector<kv::AttentionSeq> attn_seqs(n_seqs);
  std::vector<kv::SequenceKV::AppendRows> append_rows;
  // RoPE cos/sin depend only on the position: computed once per token here
  // (by batch row), shared by every layer (ops::Rope would recompute them
  // per layer).
  std::vector<float> rope_cs(static_cast<size_t>(n) * c.rope_dims);
  for (int i = 0; i < n; ++i) ops::RopeCosSin(batch.positions[i], rope, &rope_cs[static_cast<size_t>(i) * c.rope_dims]);

  // Per-token work between the matrix products (norms, biases, RoPE, the FFN
  // activation, residual adds) runs on the pool for batches: on the caller
  // alone it was ~10% of a 512-token prefill on 2 threads (smollm2-135m
  // q8_0). A decoded token keeps it on the caller, where a parallel loop
  // would cost more than the work.
  constexpr int kParallelTokens = 16;
  auto for_tokens = [&](auto&& fn) {  // fn(i0, i1) over the active rows [i0, i1)
    ScopedPhase phase(StepPhase::kElementwise);
    if (pool != nullptr && pool->size() > 1 && m >= kParallelTokens) {
      pool->ParallelFor(static_cast<size_t>(m), [&](size_t b, size_t e, int) { fn(static_cast<int>(b), static_cast<int>(e)); });
    } else {
      fn(0, m);
    }
  };
  auto norm_rows = [&](const std::vector<float>& weight, int i0, int i1) {
    for (int i = i0; i < i1; ++i) {
      ops::RmsNorm(&s->x[static_cast<size_t>(i) * d], weight.data(), d, c.rms_eps, &s->h[static_cast<size_t>(i) * d]);
    }
  };
  // x += o over rows [i0, i1).
  auto residual_rows = [&](int i0, int i1) {
    ops::Add(&s->x[static_cast<size_t>(i0) * d], &s->o[static_cast<size_t>(i0) * d],
             static_cast<int64_t>(i1 - i0) * d, &s->x[static_cast<size_t>(i0) * d]);
  };

  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = layers_[l];
    // The rows this layer recomputes; fewer than the last layer's: keep
    // their hidden states only (compacted in place, order kept).
    std::span<const int32_t> want(rows);
    if (batch.recompute != nullptr && l > 0) want = batch.recompute->Rows(l);
    if (want.size() == rows.size() && !std::equal(want.begin(), want.end(), rows.begin())) {
      return InvalidArgument("layer " + std::to_string(l) + " recomputes rows the layer before it did not");
    }
    if (want.size() != rows.size()) {
      if (!std::is_sorted(want.begin(), want.end()) ||
          !std::includes(rows.begin(), rows.end(), want.begin(), want.end())) {
        return InvalidArgument("layer " + std::to_string(l) + " recomputes rows the layer before it did not");
      }
      for_tokens(residual_rows);  // the previous layer's, over the old rows
      size_t j = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        while (rows[j] != want[i]) ++j;
        if (j != i) std::memcpy(&s->x[i * d], &s->x[j * d], sizeof(float) * d);
      }
      rows.assign(want.begin(), want.end());
      m = static_cast<int>(rows.size());
      row_positions.resize(static_cast<size_t>(m));
      for (int i = 0; i < m; ++i) row_positions[i] = batch.positions[rows[i]];
      for_tokens([&](int i0, int i1) { norm_rows(w.attn_norm, i0, i1); });
    } else {
      // Attention block (the previous layer's residual add first).
      for_tokens([&](int i0, int i1) {
        if (l > 0) residual_rows(i0, i1);
        norm_rows(w.attn_norm, i0, i1);
      });
    }
    if (m > 0) {
      // One parallel loop (and one activation quantization) for Q, K and V.
      const ops::MatMulOutput qkv[] = {{w.wq, s->q.data()}, {w.wk, s->k.data()}, {w.wv, s->v.data()}};
      ScopedPhase phase(StepPhase::kMatmul);
      ops::MatMulMulti(qkv, s->h.data(), m, pool);
    }
    for_tokens([&](int i0, int i1) {
      AddBias(&s->q[static_cast<size_t>(i0) * q_dim], w.bq, i1 - i0);
      AddBias(&s->k[static_cast<size_t>(i0) * kv_dim], w.bk, i1 - i0);
      AddBias(&s->v[static_cast<size_t>(i0) * kv_dim], w.bv, i1 - i0);
      for (int i = i0; i < i1; ++i) {
        const float* cs = &rope_cs[static_cast<size_t>(rows[i]) * c.rope_dims];
        for (int h = 0; h < c.n_heads; ++h) {
          ops::RopeApply(&s->q[static_cast<size_t>(i) * q_dim + static_cast<size_t>(h) * c.head_dim], cs, rope);
        }
        if (!pre_rope_keys) {
          for (int h = 0; h < c.n_kv_heads; ++h) {
            ops::RopeApply(&s->k[static_cast<size_t>(i) * kv_dim + static_cast<size_t>(h) * c.head_dim], cs, rope);
          }
        }
      }
    });
    ScopedPhase append_phase(StepPhase::kKvWrite);
    if (batch.recompute != nullptr) {
      // Every row's K/V is stored; the attention below runs for the
      // recomputed rows only.
      batch.recompute->Merge(l, rows, s->k.data(), s->v.data(), s->k_all.data(), s->v_all.data());
      KVX_RETURN_IF_ERROR(kvs[0]->Append(l, n, batch.positions.data(), s->k_all.data(), s->v_all.data(),
                                         n >= kParallelTokens ? pool : nullptr));
      attn_seqs[0] = {kvs[0], s->q.data(), row_positions.data(), m, s->attn.data()};
    } else {
      // Every sequence's rows in one batched append (one parallel loop over
      // the (sequence, kv head) writes).
      append_rows.resize(static_cast<size_t>(n_seqs));
      for (int q = 0; q < n_seqs; ++q) {
        const int r0 = (*starts)[q], nq = (*starts)[q + 1] - r0;
        append_rows[q] = {kvs[q], nq, &batch.positions[r0], &s->k[static_cast<size_t>(r0) * kv_dim],
                          &s->v[static_cast<size_t>(r0) * kv_dim]};
        attn_seqs[q] = {kvs[q], &s->q[static_cast<size_t>(r0) * q_dim], &batch.positions[r0], nq,
                        &s->attn[static_cast<size_t>(r0) * q_dim]};
      }
      KVX_RETURN_IF_ERROR(kv::SequenceKV::AppendBatch(l, append_rows, n >= kParallelTokens ? pool : nullptr));
    }
    if (m == 0) continue;  // nothing recomputed from here on
    {
      ScopedPhase phase(StepPhase::kAttention);
      kv::AttentionBatch(attn_seqs.data(), n_seqs, l, c.n_heads, scale, pool, batch.observer);
    }
    {
      ScopedPhase phase(StepPhase::kMatmul);
      ops::MatMul(w.wo, s->attn.data(), m, s->o.data(), pool);
    }

    // Feed-forward block (SwiGLU).
    for_tokens([&](int i0, int i1) {
      residual_rows(i0, i1);
      norm_rows(w.ffn_norm, i0, i1);
    });
    const ops::MatMulOutput gate_up[] = {{w.w_gate, s->gate.data()}, {w.w_up, s->up.data()}};
    {
      ScopedPhase phase(StepPhase::kMatmul);
      ops::MatMulMulti(gate_up, s->h.data(), m, pool);
    }
    for_tokens([&](int i0, int i1) {
      const size_t off = static_cast<size_t>(i0) * c.n_ff;
      ops::SwiGLU(&s->gate[off], &s->up[off], static_cast<int64_t>(i1 - i0) * c.n_ff, &s->gate[off]);
    });
    ScopedPhase phase(StepPhase::kMatmul);
    ops::MatMul(w.w_down, s->gate.data(), m, s->o.data(), pool);
  }
  if (c.n_layers > 0) for_tokens(residual_rows);  // the last layer's

  // Output head, only for the rows whose logits are wanted.
  const int n_out = static_cast<int>(batch.logit_rows.size());
  if (n_out == 0) return Status::Ok();
  s->logits_in.resize(static_cast<size_t>(n_out) * d);
  for (int r = 0; r < n_out; ++r) {
    const auto at = std::lower_bound(rows.begin(), rows.end(), batch.logit_rows[r]);
    if (at == rows.end() || *at != batch.logit_rows[r]) {
      return InvalidArgument("logit row " + std::to_string(batch.logit_rows[r]) + " was not recomputed through the last layer");
    }
    ops::RmsNorm(&s->x[static_cast<size_t>(at - rows.begin()) * d], output_norm_.data(), d, c.rms_eps,
                 &s->logits_in[static_cast<size_t>(r) * d]);
  }
  ScopedPhase phase(StepPhase::kMatmul);
  ops::MatMul(output_, s->logits_in.data(), n_out, logits, pool);
  return Status::Ok();
}

}  // namespace kvx::model
