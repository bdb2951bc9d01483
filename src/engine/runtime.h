// Runtime: everything one process needs to serve a model: the Model (shared
// weights), a ThreadPool, and one KV configuration (a SpecRuntime: the --kv
// spec and its BlockPool with a byte budget). Sessions are created from it and
// share all three.
// Thread-safety: create sessions from one thread; see Session.
#pragma once

#include <memory>
#include <string>

#include "engine/session.h"
#include "engine/spec_runtime.h"
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

  Result<std::unique_ptr<Session>> NewSession() { return spec_rt_->NewSession(); }

  const model::Model& model() const { return *model_; }
  kv::BlockPool& pool() { return spec_rt_->pool(); }
  ThreadPool& threads() { return *threads_; }
  const kv::KVSpec& kv_spec() const { return spec_rt_->spec(); }
  int n_ctx() const { return spec_rt_->n_ctx(); }

 private:
  Runtime() = default;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<ThreadPool> threads_;
  std::unique_ptr<SpecRuntime> spec_rt_;  // declared last: destroyed first (it points at both above)
};

}  // namespace kvx::engine
