#include "engine/engine.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "engine/session.h"
#include "kv/policy/policy.h"
#include "util/finite.h"
#include "util/step_profile.h"

namespace kvx::engine {
namespace {

// Fans the attention probabilities out to every policy that observes, and
// times the callbacks when the step profile is on (util/step_profile.h).
class ObserverFanOut : public kv::AttentionObserver {
 public:
  explicit ObserverFanOut(std::vector<kv::AttentionObserver*> to) : to_(std::move(to)) {}
  int QueryWindow() const override {
    int w = 0;
    for (const auto* o : to_) {
      if (o->QueryWindow() == 0) return 0;  // one wants every query
      w = std::max(w, o->QueryWindow());
    }
    return w;
  }
  bool Observes(int seq, int n_q) const override {
    for (const auto* o : to_) {
      if (o->Observes(seq, n_q)) return true;
    }
    return false;
  }
  bool WantsProbabilities() const override {
    for (const auto* o : to_) {
      if (o->WantsProbabilities()) return true;
    }
    return false;
  }
  void OnQueries(int seq, int layer, const float* q, int n_q, int n_heads, int head_dim) override {
    const int64_t t0 = profiling_ ? util::SteadyNowNs() : 0;
    for (auto* o : to_) {
      if (o->Observes(seq, n_q)) o->OnQueries(seq, layer, q, n_q, n_heads, head_dim);
    }
    if (profiling_) util::AddThreadTime(util::SteadyNowNs() - t0);
  }
  void OnProbabilities(int seq, int layer, int query_index, int head, int kv_head, const float* probs,
                       const int32_t* positions, int n) override {
    // Every observer that wants them sees what any of them asked for (a
    // once-mode one then also records the decode queries a continuous one
    // needs: harmless).
    const int64_t t0 = profiling_ ? util::SteadyNowNs() : 0;
    for (auto* o : to_) {
      if (o->WantsProbabilities()) o->OnProbabilities(seq, layer, query_index, head, kv_head, probs, positions, n);
    }
    if (profiling_) util::AddThreadTime(util::SteadyNowNs() - t0);
  }
  // Column sums when every observer that wants probabilities takes them.
  bool WantsColumnSums() const override {
    for (const auto* o : to_) {
      if (o->WantsProbabilities() && !o->WantsColumnSums()) return false;
    }
    return true;
  }
  void OnColumnSums(int seq, int layer, int head, const float* sums, const int32_t* positions, int n,
                    int queries) override {
    const int64_t t0 = profiling_ ? util::SteadyNowNs() : 0;
    for (auto* o : to_) {
      if (o->WantsProbabilities()) o->OnColumnSums(seq, layer, head, sums, positions, n, queries);
    }
    if (profiling_) util::AddThreadTime(util::SteadyNowNs() - t0);
  }

 private:
  std::vector<kv::AttentionObserver*> to_;
  const bool profiling_ = util::StepProfileEnabled();
};

}  // namespace

Result<std::unique_ptr<Engine>> Engine::Load(const EngineOptions& options) {
  // Check the numbers before the (slow) model load (the spec was parsed by
  // the caller; it is resolved against the model below).
  if (options.n_ctx < 0) return InvalidArgument("context length (-c) must be >= 0 (0 = the model's own)");
  if (options.n_threads < 0) return InvalidArgument("thread count (-t) must be >= 0 (0 = all cores)");
  std::unique_ptr<Engine> e(new Engine());
  KVX_ASSIGN_OR_RETURN(e->own_model_, model::Model::Load(options.model_path));
  e->own_threads_ = std::make_unique<ThreadPool>(options.n_threads);
  e->model_ = e->own_model_.get();
  e->threads_ = e->own_threads_.get();
  KVX_RETURN_IF_ERROR(e->Init(options));
  return e;
}

Result<std::unique_ptr<Engine>> Engine::Create(const model::Model* model, ThreadPool* threads,
                                               const EngineOptions& options) {
  std::unique_ptr<Engine> e(new Engine());
  e->model_ = model;
  e->threads_ = threads;
  KVX_RETURN_IF_ERROR(e->Init(options));
  return e;
}

Status Engine::Init(const EngineOptions& options) {
  if (options.n_ctx < 0) return InvalidArgument("context length must be >= 0 (0 = the model's own)");
  if (options.n_batch <= 0) return InvalidArgument("batch size must be positive");
  if (options.n_seqs <= 0) return InvalidArgument("sequence count must be positive");
  options_ = options;
  const int n_ctx = options.n_ctx == 0 ? model_->config().n_ctx_train : options.n_ctx;
  KVX_ASSIGN_OR_RETURN(kv::ResolvedKVSpec spec,
                       kv::ResolveKVSpec(options.kv_spec, model_->KVLayoutFor(16), n_ctx, options.n_seqs));
  KVX_ASSIGN_OR_RETURN(kv_, kv::KVManager::Create(std::move(spec), options.kv));
  return Status::Ok();
}

Engine::~Engine() = default;

Result<std::unique_ptr<Session>> Engine::NewSession(uint64_t salt) {
  return std::unique_ptr<Session>(new Session(this, kv_->AddSequence(salt)));
}

Result<std::unique_ptr<Session>> Engine::ForkSession(const Session& src, int n_tokens) {
  if (&src.engine() != this) return InvalidArgument("session belongs to another engine");
  KVX_ASSIGN_OR_RETURN(kv::SeqId id, kv_->ForkPrefix(src.id(), n_tokens));
  return std::unique_ptr<Session>(new Session(this, id));
}

std::unique_ptr<Session> Engine::AdoptSequence(kv::SeqId id) {
  KVX_CHECK_MSG(kv_->HasSequence(id), "adopting an unknown sequence");
  return std::unique_ptr<Session>(new Session(this, id));
}

Status Engine::Step(std::span<const StepInput> inputs) {
  if (inputs.empty()) return Status::Ok();
  util::ScopedPhase phase(util::StepPhase::kScheduler);  // what the phases inside do not claim
  const int n_vocab = model_->config().n_vocab;
  // 1. Everything that can be wrong with the input, before anything changes.
  std::vector<kv::StepRequest> requests;
  batch_.tokens.clear();
  batch_.positions.clear();
  batch_.seq_start.assign(1, 0);
  batch_.logit_rows.clear();
  std::vector<kv::SequenceKV*> kvs;
  batch_.recompute = inputs[0].recompute;
  for (const StepInput& in : inputs) {
    if (in.recompute != nullptr && inputs.size() > 1) return InvalidArgument("a selective recomputation is a step of its own");
    if (in.session == nullptr || &in.session->engine() != this) return InvalidArgument("step input without a session of this engine");
    const int n = static_cast<int>(in.tokens.size());
    if (n == 0) return InvalidArgument("nothing to feed: the token list is empty");
    // Callers hand in vocabulary tokens: the tokenizer's, session files'
    // (checked when read), requests' (checked by Scheduler::Submit).
    for (int32_t t : in.tokens) KVX_CHECK_MSG(t >= 0 && t < n_vocab, "a step token outside the vocabulary");
    if (in.first_logit_row < -1 || in.first_logit_row > n) return InvalidArgument("first logit row out of range");
    const int r0 = static_cast<int>(batch_.tokens.size()), past = in.session->n_past();
    batch_.tokens.insert(batch_.tokens.end(), in.tokens.begin(), in.tokens.end());
    for (int i = 0; i < n; ++i) batch_.positions.push_back(past + i);
    batch_.seq_start.push_back(r0 + n);
    if (in.logits != nullptr) {
      for (int i = in.first_logit_row < 0 ? n - 1 : in.first_logit_row; i < n; ++i) batch_.logit_rows.push_back(r0 + i);
    }
    kvs.push_back(&kv_->kv(in.session->id()));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const int r0 = batch_.seq_start[i], r1 = batch_.seq_start[i + 1];
    requests.push_back({inputs[i].session->id(), std::span<const int32_t>(&batch_.tokens[r0], r1 - r0),
                        std::span<const int32_t>(&batch_.positions[r0], r1 - r0)});
  }
  // 2. Reserve every page of the step (all or nothing).
  KVX_RETURN_IF_ERROR(kv_->BeginStep(requests));
  // 3. The batched forward pass, with the policies' observers.
  const std::vector<kv::AttentionObserver*> observers = Observers();
  ObserverFanOut fan_out(observers);
  // One observer is called directly, unless the profile times it.
  const bool direct = observers.size() == 1 && !util::StepProfileEnabled();
  batch_.observer = observers.empty() ? nullptr : direct ? observers[0] : &fan_out;
  logits_.resize(batch_.logit_rows.size() * static_cast<size_t>(n_vocab));
  Status s = model_->Forward(batch_, kvs, &scratch_, threads_, logits_.data());
  batch_.observer = nullptr;
  batch_.recompute = nullptr;
  if (!s.ok()) {
    // Inputs were checked and every page reserved, so this is a bug; the
    // tables may hold part of the step.
    kv_->AbortStep();
    return Internal("forward pass failed after the step was reserved: " + s.message());
  }
  // 4. Commit (then the policies), and hand out the logits. Logits that
  // are not finite would be sampled or scored as garbage (a NaN argmax is
  // token 0, a NaN perplexity prints as a number): the step is an error.
  const Status committed = kv_->CommitStep();
  KVX_RETURN_IF_ERROR(HandOutLogits(inputs));
  return committed;
}

std::vector<kv::AttentionObserver*> Engine::Observers() const {
  std::vector<kv::AttentionObserver*> observers;
  for (const auto& p : kv_->policies()) {
    if (p->observer() != nullptr) observers.push_back(p->observer());
  }
  return observers;
}

std::string Engine::PromptArithmeticKey(int n_q) const {
  const std::vector<kv::AttentionObserver*> observers = Observers();
  const ObserverFanOut fan_out(observers);  // what Step hands the forward pass (or its one observer: the same answers)
  return kv::Participation(observers.empty() ? nullptr : &fan_out, 0, n_q).ArithmeticKey();
}

int64_t CopyRowsCheckingFinite(const float* src, std::span<float* const> dst, size_t n, ThreadPool* pool) {
  std::atomic<int64_t> first_bad{-1};
  auto copy_rows = [&](size_t r0, size_t r1, int) {
    for (size_t r = r0; r < r1; ++r) {
      std::memcpy(dst[r], src + r * n, n * sizeof(float));
      const int64_t at = FirstNonFinite(dst[r], n);
      if (at < 0) continue;
      const int64_t here = static_cast<int64_t>(r * n) + at;
      int64_t seen = first_bad.load(std::memory_order_relaxed);
      while ((seen < 0 || here < seen) && !first_bad.compare_exchange_weak(seen, here)) {
      }
    }
  };
  if (dst.size() > 1 && pool != nullptr && pool->size() > 1) {
    pool->ParallelFor(dst.size(), copy_rows);
  } else {
    copy_rows(0, dst.size(), 0);
  }
  return first_bad.load();
}

// The vectors keep their storage across steps (callers reuse them), so the
// resize below is normally a no-op. On a non-finite logit the vectors hold
// what was copied (the step is an error).
Status Engine::HandOutLogits(std::span<const StepInput> inputs) {
  const size_t n_vocab = static_cast<size_t>(model_->config().n_vocab);
  std::vector<float*>& dst = logit_dst_;  // per logit row
  dst.clear();
  for (const StepInput& in : inputs) {
    if (in.logits == nullptr) continue;
    const size_t rows = in.first_logit_row < 0 ? 1 : in.tokens.size() - static_cast<size_t>(in.first_logit_row);
    if (in.logits->size() != rows * n_vocab) in.logits->resize(rows * n_vocab);
    for (size_t r = 0; r < rows; ++r) dst.push_back(in.logits->data() + r * n_vocab);
  }
  KVX_CHECK(dst.size() * n_vocab == logits_.size());
  if (const int64_t at = CopyRowsCheckingFinite(logits_.data(), dst, n_vocab, threads_); at >= 0) {
    return Internal("the model computed a NaN or infinite logit (token id " +
                    std::to_string(at % static_cast<int64_t>(n_vocab)) +
                    "): its weights or activations overflow, so its output would be garbage");
  }
  return Status::Ok();
}

}  // namespace kvx::engine
