// SpecRuntime: one KV-cache configuration (a --kv spec with its own BlockPool)
// on top of a Model and ThreadPool that already exist. `kvx eval` compares
// several specs in one process; with SpecRuntime they share the loaded weights
// and threads, and each spec's pool holds only that spec's pages, so the pool's
// bytes in use are exactly what that spec's cache costs.
//
// Runtime (runtime.h) is a loaded Model and ThreadPool plus one SpecRuntime.
//
// Thread-safety: as Runtime: create sessions from one thread; see Session.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "engine/session.h"
#include "kv/block_pool.h"
#include "kv/kv_spec.h"
#include "model/model.h"
#include "util/status.h"
#include "util/thread_pool.h"

namespace kvx::engine {

struct SpecRuntimeOptions {
  int n_ctx = 0;      // 0 = the model's trained context
  int n_batch = 512;  // prompt tokens per forward call
  int n_seqs = 1;     // sequences the pool is sized for (when the spec sets no budget)
};

class SpecRuntime {
 public:
  // Parses `spec` (InvalidArgument with the parser's message) and creates its
  // pool. REQUIRES: model and threads outlive the SpecRuntime and its sessions.
  static Result<std::unique_ptr<SpecRuntime>> Create(const model::Model* model, ThreadPool* threads,
                                                     std::string_view spec, const SpecRuntimeOptions& options);

  Result<std::unique_ptr<Session>> NewSession();

  const kv::KVSpec& spec() const { return spec_; }
  kv::BlockPool& pool() { return *pool_; }
  const kv::BlockPool& pool() const { return *pool_; }
  int n_ctx() const { return n_ctx_; }

 private:
  SpecRuntime() = default;
  const model::Model* model_ = nullptr;
  ThreadPool* threads_ = nullptr;
  SpecRuntimeOptions options_;
  kv::KVSpec spec_;
  int n_ctx_ = 0;
  std::unique_ptr<kv::BlockPool> pool_;
};

}  // namespace kvx::engine
