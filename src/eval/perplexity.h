// Perplexity with llama.cpp's protocol (llama-perplexity, default mode):
// the text is tokenized once (BOS first), cut into floor(n_tokens / n_ctx)
// chunks of n_ctx tokens; each chunk starts from an empty cache with its first
// token replaced by BOS, and only its second half is scored: the logits at
// positions n_ctx/2 .. n_ctx-2 predict the tokens after them. NLL sums are in
// double; PPL = exp(mean NLL), and the +/- value is the standard error of the
// mean carried to PPL, as llama.cpp prints it.
// Thread-safety: as Session.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/session.h"

namespace kvx::eval {

struct PerplexityOptions {
  int n_ctx = 512;
  int max_chunks = -1;  // -1: all chunks
};

struct PerplexityResult {
  double ppl = 0;
  double ppl_stderr = 0;
  int n_chunks = 0;
  int n_scored = 0;
  int n_tokens = 0;  // tokens in the text (BOS included)
  std::vector<double> running_ppl;  // after each chunk
};

// The negative log-likelihood of token `next` under one row of logits
// (softmax in double after subtracting the row's max): llama.cpp's
// arithmetic, shared by `kvx perplexity` and `kvx eval`'s ppl so the two agree.
double NextTokenNll(const float* row, int n_vocab, int32_t next);

// Called after each chunk with (chunk index, running PPL).
using ChunkCallback = std::function<void(int chunk, int n_chunks, double running_ppl)>;

// REQUIRES: session->n_ctx() >= options.n_ctx.
// InvalidArgument when the text has fewer than 2 * n_ctx tokens.
Result<PerplexityResult> Perplexity(engine::Session* session, const std::vector<int32_t>& tokens,
                                    const PerplexityOptions& options, const ChunkCallback& on_chunk = nullptr);

}  // namespace kvx::eval
