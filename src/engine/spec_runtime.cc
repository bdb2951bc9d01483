#include "engine/spec_runtime.h"

namespace kvx::engine {

Result<std::unique_ptr<SpecRuntime>> SpecRuntime::Create(const model::Model* model, ThreadPool* threads,
                                                         std::string_view spec, const SpecRuntimeOptions& options) {
  if (options.n_ctx < 0) return InvalidArgument("context length must be >= 0 (0 = the model's own)");
  if (options.n_seqs <= 0) return InvalidArgument("sequence count must be positive");
  std::unique_ptr<SpecRuntime> rt(new SpecRuntime());
  rt->model_ = model;
  rt->threads_ = threads;
  rt->options_ = options;
  KVX_ASSIGN_OR_RETURN(rt->spec_, kv::ParseKVSpec(spec));
  rt->n_ctx_ = options.n_ctx == 0 ? model->config().n_ctx_train : options.n_ctx;
  KVX_ASSIGN_OR_RETURN(rt->pool_, MakeBlockPool(*model, rt->spec_, rt->n_ctx_, options.n_seqs));
  return rt;
}

Result<std::unique_ptr<Session>> SpecRuntime::NewSession() {
  SessionOptions so;
  so.n_ctx = n_ctx_;
  so.n_batch = options_.n_batch;
  return Session::Create(model_, pool_.get(), spec_, so, threads_);
}

}  // namespace kvx::engine
