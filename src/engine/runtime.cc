#include "engine/runtime.h"

namespace kvx::engine {

Result<std::unique_ptr<Runtime>> Runtime::Create(const RuntimeOptions& options) {
  std::unique_ptr<Runtime> rt(new Runtime());
  rt->options_ = options;
  KVX_ASSIGN_OR_RETURN(rt->spec_, kv::ParseKVSpec(options.kv_spec));
  if (options.n_ctx < 0) return InvalidArgument("context length (-c) must be >= 0 (0 = the model's own)");
  if (options.n_threads < 0) return InvalidArgument("thread count (-t) must be >= 0 (0 = all cores)");
  if (options.n_seqs <= 0) return InvalidArgument("sequence count must be positive");
  KVX_ASSIGN_OR_RETURN(rt->model_, model::Model::Load(options.model_path));
  rt->n_ctx_ = options.n_ctx == 0 ? rt->model_->config().n_ctx_train : options.n_ctx;
  KVX_ASSIGN_OR_RETURN(rt->pool_, MakeBlockPool(*rt->model_, rt->spec_, rt->n_ctx_, options.n_seqs));
  rt->threads_ = std::make_unique<ThreadPool>(options.n_threads);
  return rt;
}

Result<std::unique_ptr<Session>> Runtime::NewSession() {
  SessionOptions so;
  so.n_ctx = n_ctx_;
  so.n_batch = options_.n_batch;
  return Session::Create(model_.get(), pool_.get(), spec_, so, threads_.get());
}

}  // namespace kvx::engine
