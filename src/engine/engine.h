// Engine: the one owner of what serving a model takes: the shared weights
// (model::Model), the threads, and the KV manager (kv/kv_manager.h: the pool,
// the spec resolved and validated once, every sequence). Sessions are handles
// onto the manager's sequences; every path (kvx run, perplexity, eval, bench,
// plan, later the server) feeds tokens through Engine::Step, one batched
// forward pass over the tokens of one or more sessions:
//
//   Step(inputs)  -> token ids checked -> KVManager::BeginStep (reserve every
//                    page, or ResourceExhausted with nothing changed)
//                 -> Model::Forward over all inputs' tokens (matmuls batched,
//                    attention per sequence) -> KVManager::CommitStep
//                    (bookkeeping, then the policies) -> logits per input.
//
// Load() owns a model and threads it loads; Create() shares ones that exist
// (kvx eval compares several KV specs on one set of weights, each spec with
// its own engine and pool, so each pool's bytes are exactly that spec's).
//
// Thread-safety: one thread drives an engine (its sessions and steps); the
// forward pass uses the thread pool internally.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kv/kv_manager.h"
#include "model/model.h"
#include "util/status.h"
#include "util/thread_pool.h"

namespace kvx::engine {

class Session;

struct EngineOptions {
  std::string model_path;  // Load() only
  int n_threads = 0;       // Load() only; 0 = all cores
  kv::KVSpec kv_spec;      // the --kv spec, parsed once by the caller (kv::ParseKVSpec); {} = defaults
  int n_ctx = 0;           // tokens per sequence; 0 = the model's trained context
  int n_batch = 512;       // prompt tokens per forward pass of one session
  int n_seqs = 1;          // sequences the KV budget is sized for (when the spec sets no budget)
  kv::KVManagerOptions kv;
};

// One session's part of a step.
struct StepInput {
  Session* session = nullptr;
  std::span<const int32_t> tokens;  // at the session's next positions
  // Logits of rows [first_logit_row, n) of this input are written to
  // *logits ([n - first_logit_row][n_vocab]); -1 = the last row only;
  // logits == nullptr: none.
  int first_logit_row = -1;
  std::vector<float>* logits = nullptr;
  // Selective recomputation of this input's rows (model/model.h; chunk
  // reuse, engine/chunk_assembly.h): only in a step of one input, and its
  // logit rows must run through the last layer.
  model::RowRecompute* recompute = nullptr;
};

// Copies row r of `src` (rows of n floats) to dst[r] for every r, over
// `pool` (may be null), checking each row for NaN and infinity while it is
// in cache; returns the index into src of the first such value, or -1. One
// pass over a step's logits: a separate check of the whole buffer and then a
// copy on the caller alone took 1.0 ms of an 11 ms 32-sequence step
// (smollm2's 49152-entry rows, 6.3 MB), the check reading at 8 GB/s.
int64_t CopyRowsCheckingFinite(const float* src, std::span<float* const> dst, size_t n, ThreadPool* pool);

class Engine {
 public:
  // Checks the options, loads the model, makes the threads, resolves the
  // spec against the model (every check and each policy built, once:
  // kv/resolved_spec.h).
  static Result<std::unique_ptr<Engine>> Load(const EngineOptions& options);
  // Shares `model` and `threads` (REQUIRES: they outlive the engine).
  static Result<std::unique_ptr<Engine>> Create(const model::Model* model, ThreadPool* threads,
                                                const EngineOptions& options);
  ~Engine();

  // A new empty session (a sequence of the manager); `salt` seeds its block
  // hashes (tenants with different salts never share prefixes).
  Result<std::unique_ptr<Session>> NewSession(uint64_t salt = 0);
  // A new session holding the first n_tokens tokens of `src` (pages shared).
  Result<std::unique_ptr<Session>> ForkSession(const Session& src, int n_tokens);

  // A session handle owning manager sequence `id` (one made by the KV
  // manager directly: a prefix-cache fork, a restored file). REQUIRES: the
  // sequence exists and no other session owns it.
  std::unique_ptr<Session> AdoptSequence(kv::SeqId id);

  // One batched forward step over `inputs` (distinct sessions of this
  // engine; REQUIRES: tokens in [0, n_vocab), see Scheduler::Submit for
  // the requests' gate). InvalidArgument for a full context,
  // ResourceExhausted when the pool cannot hold the step: in both cases
  // nothing changed, so a caller can shrink the batch and retry.
  Status Step(std::span<const StepInput> inputs);

  const model::Model& model() const { return *model_; }
  ThreadPool& threads() { return *threads_; }
  kv::KVManager& kv_manager() { return *kv_; }
  const kv::KVManager& kv_manager() const { return *kv_; }
  const kv::KVSpec& kv_spec() const { return kv_->spec().spec; }
  kv::BlockPool& pool() { return kv_->pool(); }
  int n_ctx() const { return kv_->spec().n_ctx; }
  int n_batch() const { return options_.n_batch; }
  // How this engine's policies take part in the attention of a prompt call
  // of n_q queries (kv::ObserverParticipation::ArithmeticKey): engines with
  // the same KV pages and equal keys compute such a call bit for bit alike,
  // which eval's prefill cache relies on (eval/prefill_cache.h).
  std::string PromptArithmeticKey(int n_q) const;

 private:
  Engine() = default;
  Status Init(const EngineOptions& options);
  // Step's last part: each input's logits from logits_, checked finite.
  Status HandOutLogits(std::span<const StepInput> inputs);
  // The policies' attention observers (those that have one).
  std::vector<kv::AttentionObserver*> Observers() const;

  std::unique_ptr<model::Model> own_model_;
  std::unique_ptr<ThreadPool> own_threads_;
  const model::Model* model_ = nullptr;
  ThreadPool* threads_ = nullptr;
  EngineOptions options_;
  std::unique_ptr<kv::KVManager> kv_;
  // Step scratch, reused.
  model::ForwardScratch scratch_;
  model::ForwardBatch batch_;
  std::vector<float> logits_;
  std::vector<float*> logit_dst_;  // HandOutLogits' destination of each row
};

}  // namespace kvx::engine
