// Runtime: everything one process needs to serve a model: the Model (shared
// weights), one KV BlockPool with a byte budget, and a ThreadPool. Sessions
// are created from it and share all three.
// Thread-safety: create sessions from one thread; see Session.
#pragma once

#include <memory>
#include <string>

#include "engine/session.h"
#include "kv/kv_spec.h"

namespace kvx::engine {

struct RuntimeOptions {
  std::string model_path;
  std::string kv_spec;  // the --kv spec string; "" = defaults
  int n_ctx = 0;        // 0 = the model's trained context
  int n_threads = 0;    // 0 = all cores
  int n_batch = 512;
  int n_seqs = 1;       // sequences the KV budget is sized for (when the spec sets no budget)
};

class Runtime {
 public:
  static Result<std::unique_ptr<Runtime>> Create(const RuntimeOptions& options);

  Result<std::unique_ptr<Session>> NewSession();

  const model::Model& model() const { return *model_; }
  kv::BlockPool& pool() { return *pool_; }
  ThreadPool& threads() { return *threads_; }
  const kv::KVSpec& kv_spec() const { return spec_; }
  int n_ctx() const { return n_ctx_; }

 private:
  Runtime() = default;
  RuntimeOptions options_;
  kv::KVSpec spec_;
  int n_ctx_ = 0;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<kv::BlockPool> pool_;
  std::unique_ptr<ThreadPool> threads_;
};

}  // namespace kvx::engine
