#include "engine/generate.h"

#include <chrono>
#include <cstdio>

namespace kvx::engine {

namespace {
double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

double GenerateStats::GenerateTokensPerSecond() const {
  // The first generated token is sampled from the prompt pass; the decode
  // steps produce the others.
  const int decode_steps = generated_tokens - 1;
  return generate_seconds > 0 && decode_steps > 0 ? decode_steps / generate_seconds : 0;
}

std::string GenerateStats::ToString() const {
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "prompt: %d tokens, %.1f tok/s | generation: %d tokens, %.1f tok/s | KV in use: %zu bytes (%.2f MiB)",
                prompt_tokens, PromptTokensPerSecond(), generated_tokens, GenerateTokensPerSecond(),
                kv_bytes_in_use, kv_bytes_in_use / (1024.0 * 1024.0));
  return buf;
}

Status Generate(Session* session, const std::vector<int32_t>& prompt, const GenerateOptions& options,
                const TokenCallback& on_token, std::vector<int32_t>* out_tokens, GenerateStats* stats) {
  KVX_RETURN_IF_ERROR(options.sampler.Validate());
  const model::Model& m = session->model();
  const model::Tokenizer& tok = m.tokenizer();
  const int n_vocab = m.config().n_vocab;
  *stats = GenerateStats();
  out_tokens->clear();
  model::Sampler sampler(options.sampler);
  for (int32_t t : session->engine().kv_manager().tokens(session->id())) sampler.Accept(t);
  for (int32_t t : prompt) sampler.Accept(t);

  auto t0 = std::chrono::steady_clock::now();
  const int n_prompt = static_cast<int>(prompt.size());
  if (options.compress_at > n_prompt) return InvalidArgument("compress_at is beyond the prompt");
  const float* logits = options.resume_logits.data();
  if (prompt.empty()) {
    if (options.resume_logits.size() != static_cast<size_t>(n_vocab)) {
      return InvalidArgument("nothing to continue from: give a prompt (the session holds no saved logits)");
    }
  } else if (options.compress_at > 0 && options.compress_at < n_prompt) {
    const std::span<const int32_t> all(prompt);
    KVX_RETURN_IF_ERROR(session->Feed(all.first(options.compress_at)).status());
    KVX_RETURN_IF_ERROR(session->Compress());
    KVX_ASSIGN_OR_RETURN(logits, session->Feed(all.subspan(options.compress_at)));
  } else {
    KVX_ASSIGN_OR_RETURN(logits, session->Feed(prompt));
    if (options.compress_at == n_prompt) KVX_RETURN_IF_ERROR(session->Compress());
  }
  stats->prompt_tokens = static_cast<int>(prompt.size());
  stats->prompt_seconds = SecondsSince(t0);

  const int room = session->n_ctx() - session->n_past();
  const int limit = options.n_predict < 0 ? room + 1 : options.n_predict;
  auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < limit; ++i) {
    const int32_t token = sampler.Sample(logits, n_vocab);
    out_tokens->push_back(token);
    stats->generated_tokens++;
    const bool eog = tok.IsEog(token);
    if (eog && options.stop_at_eog) {
      stats->hit_eog = true;
      break;
    }
    if (on_token && !on_token(token, tok.TokenToPiece(token, /*special=*/false))) break;
    if (i + 1 == limit) break;
    if (session->n_past() >= session->n_ctx()) break;  // context full: stop cleanly
    KVX_ASSIGN_OR_RETURN(logits, session->Feed({token}));
  }
  stats->generate_seconds = SecondsSince(t1);
  // The pages plus every byte kept beside them (bounds, norms, channel maps, the policies' statistics).
  stats->kv_bytes_in_use = session->kv().BytesInUse() + session->engine().kv_manager().SideBytes(session->id());
  return Status::Ok();
}

}  // namespace kvx::engine
