#include "engine/runtime.h"

namespace kvx::engine {

Result<std::unique_ptr<Runtime>> Runtime::Create(const RuntimeOptions& options) {
  std::unique_ptr<Runtime> rt(new Runtime());
  // Check the spec and the numbers before the (slow) model load.
  KVX_RETURN_IF_ERROR(kv::ParseKVSpec(options.kv_spec).status());
  if (options.n_ctx < 0) return InvalidArgument("context length (-c) must be >= 0 (0 = the model's own)");
  if (options.n_threads < 0) return InvalidArgument("thread count (-t) must be >= 0 (0 = all cores)");
  if (options.n_seqs <= 0) return InvalidArgument("sequence count must be positive");
  KVX_ASSIGN_OR_RETURN(rt->model_, model::Model::Load(options.model_path));
  rt->threads_ = std::make_unique<ThreadPool>(options.n_threads);
  SpecRuntimeOptions so;
  so.n_ctx = options.n_ctx;
  so.n_batch = options.n_batch;
  so.n_seqs = options.n_seqs;
  KVX_ASSIGN_OR_RETURN(rt->spec_rt_, SpecRuntime::Create(rt->model_.get(), rt->threads_.get(), options.kv_spec, so));
  return rt;
}

}  // namespace kvx::engine
