// Sampler: picks the next token from logits.
//
// Chain (llama.cpp's common order): repetition penalty -> top-k -> top-p ->
// min-p -> temperature -> random draw. temperature <= 0 means greedy (argmax,
// lowest id on ties), which ignores every other setting but the penalty.
// Same seed, same logits -> same tokens.
//
// Thread-safety: not thread-safe (owns an RNG); one per sequence.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "util/status.h"

namespace kvx::model {

struct SamplerOptions {
  float temperature = 0.8f;    // <= 0: greedy
  int top_k = 40;              // 0: off; >= 0
  float top_p = 0.95f;         // in (0, 1]; 1: off
  float min_p = 0.05f;         // in [0, 1]; 0: off
  float repeat_penalty = 1.0f; // 1: off. > 1 penalises tokens seen in the last repeat_last_n
  int repeat_last_n = 64;
  uint64_t seed = 0;

  // InvalidArgument naming the bad option and its range: temperature not
  // finite, top_k < 0, top_p outside (0, 1], min_p outside [0, 1],
  // repeat_penalty not finite and > 0, repeat_last_n < 0.
  Status Validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& options);

  // Samples a token from `logits` (n_vocab values; modified by the penalty
  // only in a private copy). Records the token for the repetition penalty.
  int32_t Sample(const float* logits, int n_vocab);

  // Tokens seen so far (prompt tokens count for the penalty too).
  void Accept(int32_t token);

 private:
  struct Candidate {
    int32_t id;
    float logit;
  };
  // The non-greedy part of the chain over logits `l` whose maximum is
  // `max_logit`: top-k, top-p, min-p, temperature, draw.
  int32_t Draw(const float* l, int n_vocab, float max_logit);
  SamplerOptions options_;
  std::mt19937_64 rng_;
  std::vector<int32_t> history_;
  // Scratch, reused across tokens.
  std::vector<Candidate> candidates_;
  std::vector<float> penalized_;
  std::vector<float> weights_;
};

// Index of the largest value, lowest index on ties.
int32_t ArgMax(const float* logits, int n);

}  // namespace kvx::model
