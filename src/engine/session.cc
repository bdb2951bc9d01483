#include "engine/session.h"

#include <algorithm>

namespace kvx::engine {

Session::~Session() {
  if (owned_) engine_->kv_manager().ReleaseSequence(id_);
}

Result<const float*> Session::Feed(std::span<const int32_t> tokens) {
  if (tokens.empty()) return InvalidArgument("nothing to feed: the token list is empty");
  if (n_past() + tokens.size() > static_cast<size_t>(n_ctx())) {
    return InvalidArgument("context is full: " + std::to_string(n_past()) + " tokens in the context + " +
                           std::to_string(tokens.size()) + " new tokens > context length " + std::to_string(n_ctx()) +
                           "; shorten the prompt or raise the context length (-c)");
  }
  const size_t n_batch = static_cast<size_t>(engine_->n_batch());
  for (size_t start = 0; start < tokens.size(); start += n_batch) {
    const size_t end = std::min(tokens.size(), start + n_batch);
    StepInput in;
    in.session = this;
    in.tokens = tokens.subspan(start, end - start);
    in.logits = end == tokens.size() ? &logits_ : nullptr;
    const StepInput one[] = {in};
    KVX_RETURN_IF_ERROR(engine_->Step(one));
  }
  return static_cast<const float*>(logits_.data());
}

Status Session::Compress() { return engine_->kv_manager().Compress(id_); }

Status Session::FeedWithLogits(const std::vector<int32_t>& tokens, int first_logit_row, std::vector<float>* logits) {
  const int n = static_cast<int>(tokens.size());
  if (first_logit_row < 0 || first_logit_row > n) return InvalidArgument("first logit row out of range");
  StepInput in;
  in.session = this;
  in.tokens = tokens;
  in.first_logit_row = first_logit_row;
  in.logits = logits;
  if (first_logit_row == n) {  // no logits wanted
    in.logits = nullptr;
    logits->clear();
  }
  const StepInput one[] = {in};
  return engine_->Step(one);
}

Status Session::AppendSyntheticKV(int n_tokens, uint64_t seed) {
  if (n_tokens < 0) return InvalidArgument("synthetic token count must be >= 0");
  kv::KVManager& m = engine_->kv_manager();
  const model::ModelConfig& c = model().config();
  const int kv_dim = c.n_kv_heads * c.head_dim;
  constexpr int kChunk = 256;
  std::vector<float> k(static_cast<size_t>(kChunk) * kv_dim), v(k.size());
  std::vector<int32_t> pos(kChunk), ids(kChunk, 0);
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
    for (int i = 0; i < n; ++i) pos[i] = n_past() + i;
    const kv::StepRequest req{id_, std::span<const int32_t>(ids.data(), n), std::span<const int32_t>(pos.data(), n)};
    KVX_RETURN_IF_ERROR(m.BeginStep(std::span<const kv::StepRequest>(&req, 1)));
    for (int l = 0; l < c.n_layers; ++l) {
      for (size_t i = 0; i < static_cast<size_t>(n) * kv_dim; ++i) {
        k[i] = normal();
        v[i] = normal();
      }
      const Status s = m.kv(id_).Append(l, n, pos.data(), k.data(), v.data());
      KVX_CHECK_MSG(s.ok(), "a reserved append failed");
    }
    KVX_RETURN_IF_ERROR(m.CommitStep());
  }
  return Status::Ok();
}

void Session::Reset() { engine_->kv_manager().ResetSequence(id_); }

}  // namespace kvx::engine
