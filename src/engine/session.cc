#include "engine/session.h"

#include <algorithm>

namespace kvx::engine {

Result<std::unique_ptr<kv::BlockPool>> MakeBlockPool(const model::Model& model, const kv::KVSpec& spec, int n_ctx,
                                                     int n_seqs) {
  const kv::KVLayout layout = model.KVLayoutFor(spec.page_tokens);
  const size_t page_bytes = kv::PageBytes(layout, spec.codec);
  uint64_t budget = spec.budget_bytes;
  if (budget == 0) budget = kv::BudgetForContext(layout, spec.codec, n_ctx) * static_cast<uint64_t>(n_seqs);
  kv::BlockPoolOptions o;
  o.budget_bytes = budget;
  o.page_bytes = page_bytes;
  o.extent_bytes = kv::ExtentBytesFor(layout, budget, n_seqs);
  return kv::BlockPool::Create(o);
}

Result<std::unique_ptr<Session>> Session::Create(const model::Model* model, kv::BlockPool* pool,
                                                 const kv::KVSpec& spec, const SessionOptions& options,
                                                 ThreadPool* threads) {
  const model::ModelConfig& c = model->config();
  if (options.n_ctx < 0) return InvalidArgument("context length must be positive");
  if (options.n_batch <= 0) return InvalidArgument("batch size must be positive");
  std::unique_ptr<Session> s(new Session());
  s->model_ = model;
  s->threads_ = threads;
  s->n_ctx_ = options.n_ctx == 0 ? c.n_ctx_train : options.n_ctx;
  s->n_batch_ = options.n_batch;
  if (kv::PageBytes(model->KVLayoutFor(spec.page_tokens), spec.codec) > pool->page_bytes()) {
    return InvalidArgument("KV spec '" + spec.ToString() + "' needs larger pages than the pool provides");
  }
  s->kv_ = std::make_unique<kv::SequenceKV>(pool, model->KVLayoutFor(spec.page_tokens), spec.codec);
  s->logits_.resize(c.n_vocab);
  return s;
}

Status Session::CheckFits(size_t n_tokens) const {
  if (n_past_ + n_tokens > static_cast<size_t>(n_ctx_)) {
    return InvalidArgument("context is full: " + std::to_string(n_past_) + " tokens in the context + " +
                           std::to_string(n_tokens) + " new tokens > context length " + std::to_string(n_ctx_) +
                           "; shorten the prompt or raise the context length (-c)");
  }
  return Status::Ok();
}

Result<const float*> Session::Feed(const std::vector<int32_t>& tokens) {
  if (tokens.empty()) return InvalidArgument("nothing to feed: the token list is empty");
  KVX_RETURN_IF_ERROR(CheckFits(tokens.size()));
  for (size_t start = 0; start < tokens.size(); start += n_batch_) {
    const size_t end = std::min(tokens.size(), start + static_cast<size_t>(n_batch_));
    batch_.tokens.assign(tokens.begin() + start, tokens.begin() + end);
    batch_.positions.resize(end - start);
    for (size_t i = 0; i < batch_.positions.size(); ++i) batch_.positions[i] = n_past_ + static_cast<int32_t>(i);
    batch_.logit_rows.clear();
    if (end == tokens.size()) batch_.logit_rows.push_back(static_cast<int32_t>(end - start - 1));
    KVX_RETURN_IF_ERROR(model_->Forward(batch_, kv_.get(), &scratch_, threads_, logits_.data()));
    n_past_ += static_cast<int>(end - start);
  }
  return static_cast<const float*>(logits_.data());
}

Status Session::FeedWithLogits(const std::vector<int32_t>& tokens, int first_logit_row, std::vector<float>* logits) {
  KVX_RETURN_IF_ERROR(CheckFits(tokens.size()));
  const int n = static_cast<int>(tokens.size());
  if (first_logit_row < 0 || first_logit_row > n) return InvalidArgument("first logit row out of range");
  batch_.tokens = tokens;
  batch_.positions.resize(n);
  for (int i = 0; i < n; ++i) batch_.positions[i] = n_past_ + i;
  batch_.logit_rows.clear();
  for (int i = first_logit_row; i < n; ++i) batch_.logit_rows.push_back(i);
  logits->resize(static_cast<size_t>(n - first_logit_row) * model_->config().n_vocab);
  KVX_RETURN_IF_ERROR(model_->Forward(batch_, kv_.get(), &scratch_, threads_, logits->data()));
  n_past_ += n;
  return Status::Ok();
}

Status Session::AppendSyntheticKV(int n_tokens, uint64_t seed) {
  KVX_RETURN_IF_ERROR(CheckFits(static_cast<size_t>(n_tokens)));
  const model::ModelConfig& c = model_->config();
  const int kv_dim = c.n_kv_heads * c.head_dim;
  constexpr int kChunk = 256;
  std::vector<float> k(static_cast<size_t>(kChunk) * kv_dim), v(k.size());
  std::vector<int32_t> pos(kChunk);
  // Roughly N(0, 1) values, cheaply: the sum of four 16-bit uniforms of a
  // xorshift64* draw (Irwin-Hall, rescaled). std::normal_distribution over
  // mt19937 took longer than the decode runs it prepares (90M values at 8k).
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  auto normal = [&state]() {
    state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
    const uint64_t r = state * 0x2545F4914F6CDD1Dull;
    const float sum = static_cast<float>((r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48));
    return (sum * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;  // variance 4/12 -> 1
  };
  for (int start = 0; start < n_tokens; start += kChunk) {
    const int n = std::min(kChunk, n_tokens - start);
    for (int i = 0; i < n; ++i) pos[i] = n_past_ + start + i;
    for (int l = 0; l < c.n_layers; ++l) {
      for (size_t i = 0; i < static_cast<size_t>(n) * kv_dim; ++i) {
        k[i] = normal();
        v[i] = normal();
      }
      KVX_RETURN_IF_ERROR(kv_->Append(l, n, pos.data(), k.data(), v.data()));
    }
  }
  n_past_ += n_tokens;
  return Status::Ok();
}

void Session::Reset() {
  kv_->Clear();
  n_past_ = 0;
}

}  // namespace kvx::engine
