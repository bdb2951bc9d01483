#include "eval/perplexity.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace kvx::eval {

double NextTokenNll(const float* row, int n_vocab, int32_t next) {
  float max_logit = row[0];
  for (int i = 1; i < n_vocab; ++i) max_logit = std::max(max_logit, row[i]);
  double sum = 0;
  for (int i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(row[i] - max_logit));
  return std::log(sum) - static_cast<double>(row[next] - max_logit);
}

Result<PerplexityResult> Perplexity(engine::Session* session, const std::vector<int32_t>& tokens,
                                    const PerplexityOptions& options, const ChunkCallback& on_chunk) {
  const int n_ctx = options.n_ctx;
  if (n_ctx < 4) return InvalidArgument("perplexity context must be at least 4 tokens");
  if (n_ctx > session->n_ctx()) {
    return InvalidArgument("perplexity context " + std::to_string(n_ctx) + " exceeds the session context " +
                           std::to_string(session->n_ctx()));
  }
  const int n_tokens = static_cast<int>(tokens.size());
  if (n_tokens < 2 * int64_t{n_ctx}) {  // 64 bits: a session's context may be up to 2^30
    return InvalidArgument("the text has " + std::to_string(n_tokens) + " tokens; perplexity with -c " +
                           std::to_string(n_ctx) + " needs at least " + std::to_string(2 * int64_t{n_ctx}) +
                           " (use a longer text or a smaller -c)");
  }
  const model::Model& m = session->model();
  const int n_vocab = m.config().n_vocab;
  const int32_t bos = m.tokenizer().bos();
  int n_chunks = n_tokens / n_ctx;
  if (options.max_chunks >= 0) n_chunks = std::min(n_chunks, options.max_chunks);
  // Zero chunks would divide 0 by 0 scored tokens and report PPL = -nan.
  if (n_chunks < 1) return InvalidArgument("no chunk to score: the chunk limit (--chunks) must be -1 (all) or >= 1");
  const int first = n_ctx / 2;

  PerplexityResult r;
  r.n_tokens = n_tokens;
  double nll_sum = 0, nll2_sum = 0;
  std::vector<int32_t> chunk(n_ctx);
  std::vector<float> logits;
  for (int c = 0; c < n_chunks; ++c) {
    std::copy(tokens.begin() + static_cast<size_t>(c) * n_ctx, tokens.begin() + static_cast<size_t>(c + 1) * n_ctx,
              chunk.begin());
    if (m.tokenizer().add_bos() && bos >= 0) chunk[0] = bos;
    session->Reset();
    KVX_RETURN_IF_ERROR(session->FeedWithLogits(chunk, first, &logits));
    for (int j = first; j < n_ctx - 1; ++j) {
      const double nll = NextTokenNll(&logits[static_cast<size_t>(j - first) * n_vocab], n_vocab, chunk[j + 1]);
      nll_sum += nll;
      nll2_sum += nll * nll;
      r.n_scored++;
    }
    r.running_ppl.push_back(std::exp(nll_sum / r.n_scored));
    if (on_chunk) on_chunk(c, n_chunks, r.running_ppl.back());
  }
  session->Reset();
  r.n_chunks = n_chunks;
  const double mean = nll_sum / r.n_scored;
  r.ppl = std::exp(mean);
  const double var = nll2_sum / r.n_scored - mean * mean;
  r.ppl_stderr = r.n_scored > 1 ? r.ppl * std::sqrt(std::max(0.0, var) / (r.n_scored - 1)) : 0;
  return r;
}

}  // namespace kvx::eval
