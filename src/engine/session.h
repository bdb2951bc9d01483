// Session: a handle onto one sequence of an Engine's KV manager, with the
// single-sequence conveniences the tools use (feed a prompt in n_batch
// chunks, feed and keep every logit, reset). Each call is one or more
// Engine::Step calls: the batch of one, not a second code path. Destroying
// the session releases its sequence (its pages return to the pool).
//
// Thread-safety: as Engine (one thread drives an engine and its sessions).
// REQUIRES: the engine outlives its sessions.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/engine.h"
#include "kv/kv_manager.h"
#include "kv/sequence_kv.h"
#include "util/status.h"

namespace kvx::engine {

class Session {
 public:
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Runs `tokens` at the next positions (in n_batch-sized steps) and
  // returns the logits after the last one (n_vocab floats, valid until the
  // next call). InvalidArgument if they would overflow the context,
  // ResourceExhausted if the KV budget runs out (the failing step changed
  // nothing; earlier chunks stay).
  Result<const float*> Feed(std::span<const int32_t> tokens);
  Result<const float*> Feed(const std::vector<int32_t>& tokens) { return Feed(std::span<const int32_t>(tokens)); }

  // Runs one step over `tokens` at the next positions and writes the logits
  // of every token from `first_logit_row` on to `logits`
  // ([n - first_logit_row][n_vocab]). Used by perplexity.
  Status FeedWithLogits(const std::vector<int32_t>& tokens, int first_logit_row, std::vector<float>* logits);

  // Forgets every token and returns its KV pages to the pool.
  void Reset();

  // The explicit compression moment: every KV policy compresses this
  // session's cache now (KVManager::Compress), e.g. after a context's
  // prefill, before its question. Policies that act only continuously
  // ignore it; without policies it does nothing.
  Status Compress();

  // Benchmarks only: appends `n_tokens` entries of seeded random K/V at the
  // next positions of every layer (token id 0), as if a prompt had been run,
  // through the same step protocol but without the forward pass. Decode
  // cost depends on the cached bytes, not on their values, so `kvx bench`
  // uses this to reach deep contexts quickly.
  Status AppendSyntheticKV(int n_tokens, uint64_t seed);

  // Gives up ownership of the sequence (it stays in the manager; the caller
  // now releases it) and returns its id. The session must not be used after.
  kv::SeqId Detach() {
    owned_ = false;
    return id_;
  }

  kv::SeqId id() const { return id_; }
  int n_past() const { return engine_->kv_manager().length(id_); }
  int n_ctx() const { return engine_->n_ctx(); }
  const kv::SequenceKV& kv() const { return engine_->kv_manager().kv(id_); }
  const model::Model& model() const { return engine_->model(); }
  Engine& engine() const { return *engine_; }

 private:
  friend class Engine;
  Session(Engine* engine, kv::SeqId id) : engine_(engine), id_(id) {}

  Engine* engine_;
  kv::SeqId id_;
  bool owned_ = true;
  std::vector<float> logits_;
};

}  // namespace kvx::engine
